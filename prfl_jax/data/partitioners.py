"""How examples are split among clients: IID, Dirichlet, shards.

The partitioners follow flwr-datasets' `IidPartitioner` /
`DirichletPartitioner` and FedLab's pathological shards. Like those
libraries, they run once on the host, outside jit, with a seeded
`np.random.default_rng(seed)` (the JAX `key` convention is for traced code; a
host-side partition of an index array needs none): the same seed gives the
same partition. Natural partitions (one client per writer) are in `natural`.
"""

import numbers
from typing import List

import numpy as np

from prfl_jax import validation

# Every client needs at least one training and one test example.
MIN_CLIENT_EXAMPLES = 2


def _rng(seed):
  if isinstance(seed, np.random.Generator):
    return seed
  validation.check_positive_int(seed, "seed", minimum=0)
  return np.random.default_rng(seed)


def _check_labels(labels, num_clients):
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"`labels` must be 1-D [M], got shape {labels.shape}.")
  validation.check_positive_int(num_clients, "num_clients")
  if num_clients > len(labels):
    raise ValueError(f"`num_clients` ({num_clients}) is more than the "
                     f"{len(labels)} examples to partition.")
  return labels


def iid_partition(labels, num_clients: int, seed=0) -> List[np.ndarray]:
  """Splits examples uniformly at random into `num_clients` near-equal parts.

  Args:
    labels: `[M]` (only its length is used).
    num_clients: number of parts.
    seed: int seed or `np.random.Generator`.

  Returns:
    a list of `num_clients` sorted int64 index arrays, disjoint, covering
    `range(M)`, of sizes `M // num_clients` or one more.
  """
  labels = _check_labels(labels, num_clients)
  perm = _rng(seed).permutation(len(labels))
  return [np.sort(p) for p in np.array_split(perm, num_clients)]


def dirichlet_partition(labels, num_clients: int, alpha: float, seed=0, *,
                        min_partition_size: int = MIN_CLIENT_EXAMPLES,
                        max_tries: int = 100) -> List[np.ndarray]:
  """Label-skewed split: each class is divided by proportions ~ Dir(alpha).

  As flwr-datasets' `DirichletPartitioner` (Hsu et al., 2019): for each class,
  draw `p ~ Dirichlet(alpha * 1_num_clients)` and give client i the fraction
  `p_i` of that class's (shuffled) examples; redraw everything until every
  client has at least `min_partition_size` examples. Small alpha means
  clients see few classes; large alpha approaches an IID split.

  Args:
    labels: `[M]` integer labels.
    num_clients: number of parts.
    alpha: concentration > 0.
    seed: int seed or `np.random.Generator`.
    min_partition_size: the least number of examples per client.
    max_tries: redraws before giving up.

  Returns:
    a list of `num_clients` sorted index arrays, disjoint, covering `range(M)`.

  Raises:
    ValueError: on alpha <= 0, or when no draw in `max_tries` gives every
      client `min_partition_size` examples.
  """
  labels = _check_labels(labels, num_clients)
  if (not isinstance(alpha, numbers.Real) or isinstance(alpha, bool) or
      not np.isfinite(alpha) or alpha <= 0):
    raise ValueError(f"`alpha` must be a finite number > 0, got {alpha!r}.")
  validation.check_positive_int(min_partition_size, "min_partition_size", 0)
  validation.check_positive_int(max_tries, "max_tries")
  if num_clients * min_partition_size > len(labels):
    raise ValueError(
        f"{num_clients} clients x `min_partition_size` {min_partition_size} "
        f"is more than the {len(labels)} examples.")
  rng = _rng(seed)
  by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
  for _ in range(max_tries):
    parts = [[] for _ in range(num_clients)]
    for members in by_class:
      members = rng.permutation(members)
      p = rng.dirichlet(np.full(num_clients, float(alpha)))
      if not np.all(np.isfinite(p)):  # Underflow at tiny alpha: one winner.
        p = np.eye(num_clients)[rng.integers(num_clients)]
      cuts = np.round(np.cumsum(p)[:-1] * len(members)).astype(int)
      for i, chunk in enumerate(np.split(members, cuts)):
        parts[i].append(chunk)
    parts = [np.sort(np.concatenate(p)) for p in parts]
    if min(len(p) for p in parts) >= min_partition_size:
      return parts
  raise ValueError(
      f"no Dirichlet(alpha={alpha}) draw in {max_tries} tries gave each of "
      f"the {num_clients} clients >= {min_partition_size} examples: increase "
      "`alpha`, use fewer clients or lower `min_partition_size`.")


def shard_partition(labels, num_clients: int, shards_per_client: int,
                    seed=0) -> List[np.ndarray]:
  """Pathological non-IID split (McMahan et al., 2017; FedLab's "shards").

  Sorts the examples by label (ties in random order), cuts them into
  `num_clients * shards_per_client` contiguous near-equal shards and gives
  every client `shards_per_client` shards at random, so a client sees about
  `shards_per_client` classes.

  Args:
    labels: `[M]` integer labels.
    num_clients: number of parts.
    shards_per_client: shards per client.
    seed: int seed or `np.random.Generator`.

  Returns:
    a list of `num_clients` sorted index arrays, disjoint, covering `range(M)`.

  Raises:
    ValueError: when there are more shards than examples.
  """
  labels = _check_labels(labels, num_clients)
  validation.check_positive_int(shards_per_client, "shards_per_client")
  num_shards = num_clients * shards_per_client
  if num_shards > len(labels):
    raise ValueError(
        f"{num_clients} clients x `shards_per_client` {shards_per_client} = "
        f"{num_shards} shards is more than the {len(labels)} examples.")
  rng = _rng(seed)
  perm = rng.permutation(len(labels))
  order = perm[np.argsort(labels[perm], kind="stable")]
  shards = np.array_split(order, num_shards)
  owner = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
  return [np.sort(np.concatenate([shards[s] for s in row])) for row in owner]
