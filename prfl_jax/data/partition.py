"""Federated partitions of a labelled data set: clusters, clients, train/test.

`federate` turns one `ArrayDataset` into the stacked `FederatedData` the
algorithms train on, as in the paper's real-data experiments (Werner et al.,
2023, §5.2, Table 1): K clusters that differ by a transform of the data
(rotation by k * 90 degrees, private label permutation y -> (y + k) mod C, or
disjoint label blocks), each of n clients with its own train and test examples
from the same client distribution, and a Byzantine mask.

The partitioners of the clients inside a cluster are in `partitioners`.
Everything here runs once on the host, outside jit, with a seeded
`np.random.default_rng(seed)`: the same seed gives the same federation.
"""

import numbers
from typing import NamedTuple, Optional, Sequence

import numpy as np

from prfl_jax import validation
from prfl_jax.data.datasets import ArrayDataset
from prfl_jax.data.federated import FederatedData
from prfl_jax.data.partitioners import dirichlet_partition
from prfl_jax.data.partitioners import iid_partition
from prfl_jax.data.partitioners import MIN_CLIENT_EXAMPLES
from prfl_jax.data.partitioners import shard_partition

TASKS = ("rotation", "private_label", "label_blocks", "none")
PARTITIONS = ("iid", "dirichlet", "shards")
# The default train/test split of a client's examples when no sizes are given.
DEFAULT_TEST_FRACTION = 0.2


class Federation(NamedTuple):
  """A federated image classification problem built by `federate`."""
  data: FederatedData  # train (x [N, M, H, W, C], y [N, M]), test likewise.
  byzantine: np.ndarray  # bool [N]: clients marked Byzantine.
  num_classes: int
  description: str  # source, task, partition and sizes, for logs.


def rotate(images: np.ndarray, k: int) -> np.ndarray:
  """Rotates images by k * 90 degrees counter-clockwise (`np.rot90` on H, W).

  Args:
    images: `[..., H, W, C]`.
    k: number of quarter turns.

  Returns:
    `[..., W, H, C]` (the same shape for square images).
  """
  return np.ascontiguousarray(np.rot90(images, k, axes=(-3, -2)))


def private_label(labels: np.ndarray, k: int, num_classes: int) -> np.ndarray:
  """Cluster k's label permutation `y -> (y + k) mod C`; padding (< 0) kept."""
  labels = np.asarray(labels)
  return np.where(labels >= 0, (labels + k) % num_classes, labels).astype(
      labels.dtype)


def label_block(labels: np.ndarray, num_clusters: int,
                num_classes: int) -> np.ndarray:
  """The cluster that owns each label: cluster k owns `[k C/K, (k+1) C/K)`."""
  if num_classes % num_clusters:
    raise ValueError(
        f"task 'label_blocks' needs the number of classes ({num_classes}) "
        f"divisible by `num_clusters` ({num_clusters}).")
  return np.asarray(labels) // (num_classes // num_clusters)


def _check_optional_int(value, name):
  if value is not None:
    validation.check_positive_int(value, name)


def _check_federate(ds, task, num_clusters, clients_per_cluster,
                    train_per_client, test_per_client, partition, alpha,
                    shards_per_client, byzantine_fraction, seed):
  if not isinstance(ds, ArrayDataset):
    raise TypeError(f"`ds` must be a prfl_jax.data.ArrayDataset (from "
                    f"load_dataset), got {type(ds)}.")
  images, labels = np.asarray(ds.images), np.asarray(ds.labels)
  if images.ndim != 4 or labels.shape != images.shape[:1]:
    raise ValueError(f"`ds` must hold images [M, H, W, C] and labels [M], got "
                     f"{images.shape} and {labels.shape}.")
  if labels.size and (labels.min() < 0 or labels.max() >= ds.num_classes):
    raise ValueError(f"`ds.labels` must lie in [0, {ds.num_classes}), got "
                     f"[{labels.min()}, {labels.max()}].")
  if task not in TASKS:
    raise ValueError(f"unknown `task` {task!r}; valid: {', '.join(TASKS)}.")
  if partition not in PARTITIONS:
    raise ValueError(f"unknown `partition` {partition!r}; valid: "
                     f"{', '.join(PARTITIONS)}.")
  validation.check_positive_int(num_clusters, "num_clusters")
  validation.check_positive_int(clients_per_cluster, "clients_per_cluster")
  _check_optional_int(train_per_client, "train_per_client")
  _check_optional_int(test_per_client, "test_per_client")
  validation.check_positive_int(seed, "seed", minimum=0)
  if partition == "dirichlet":
    if alpha is None:
      raise ValueError("partition='dirichlet' needs `alpha` > 0 (e.g. 0.5).")
  elif alpha is not None:
    raise ValueError(f"`alpha` is only used by partition='dirichlet' (got "
                     f"partition={partition!r}, alpha={alpha!r}).")
  if partition == "dirichlet" and (
      not isinstance(alpha, numbers.Real) or isinstance(alpha, bool) or
      not np.isfinite(alpha) or alpha <= 0):
    raise ValueError(f"`alpha` must be a finite number > 0, got {alpha!r}.")
  if partition == "shards":
    if shards_per_client is None:
      raise ValueError("partition='shards' needs `shards_per_client` (e.g. 2).")
    validation.check_positive_int(shards_per_client, "shards_per_client")
  elif shards_per_client is not None:
    raise ValueError(f"`shards_per_client` is only used by partition='shards' "
                     f"(got partition={partition!r}).")
  if (not isinstance(byzantine_fraction, numbers.Real) or
      isinstance(byzantine_fraction, bool) or
      not 0 <= byzantine_fraction < 1):
    raise ValueError(f"`byzantine_fraction` must be a number in [0, 1), got "
                     f"{byzantine_fraction!r}.")
  c = ds.num_classes
  if task == "rotation":
    if num_clusters > 4:
      raise ValueError(f"task 'rotation' gives at most 4 distinct clusters "
                       f"(0, 90, 180, 270 degrees), got `num_clusters` "
                       f"{num_clusters}.")
    if images.shape[1] != images.shape[2]:
      raise ValueError(f"task 'rotation' needs square images, got "
                       f"{images.shape[1]}x{images.shape[2]}.")
  if task == "private_label" and num_clusters > c:
    raise ValueError(f"task 'private_label' gives at most {c} distinct "
                     f"clusters (num_classes), got `num_clusters` "
                     f"{num_clusters}.")
  if task == "label_blocks" and c % num_clusters:
    raise ValueError(f"task 'label_blocks' needs the number of classes ({c}) "
                     f"divisible by `num_clusters` ({num_clusters}).")
  n = num_clusters * clients_per_cluster
  need = n * MIN_CLIENT_EXAMPLES
  if need > len(labels):
    raise ValueError(
        f"{num_clusters} clusters x {clients_per_cluster} clients = {n} "
        f"clients need >= {need} examples (1 train + 1 test each) but `ds` has "
        f"{len(labels)}: use fewer clients or a bigger split.")


def _requested(train_per_client, test_per_client):
  """The requested (train, test) per client, completing an 80/20 ratio."""
  if train_per_client is None and test_per_client is None:
    return None
  train = train_per_client or 4 * test_per_client
  test = test_per_client or max(1, int(round(train_per_client / 4)))
  return train, test


def _split_sizes(size: int, requested):
  """(train, test) counts for a client with `size` >= 2 examples."""
  if requested is None:
    test = int(round(DEFAULT_TEST_FRACTION * size))
  else:
    train, test = requested
    if size >= train + test:
      return train, test
    test = int(round(size * test / (train + test)))
  test = min(max(test, 1), size - 1)
  return size - test, test


def _stack(images, labels, parts: Sequence[np.ndarray], width: int):
  """Stacks the clients' index lists, padding to `width` (label -1)."""
  x = np.zeros((len(parts), width) + images.shape[1:], np.float32)
  y = np.full((len(parts), width), -1, np.int32)
  for i, p in enumerate(parts):
    x[i, :len(p)] = images[p]
    y[i, :len(p)] = labels[p]
  return x, y


def federate(ds: ArrayDataset, *, task: str, num_clusters: int,
             clients_per_cluster: int, train_per_client: Optional[int] = None,
             test_per_client: Optional[int] = None, partition: str = "iid",
             alpha: Optional[float] = None,
             shards_per_client: Optional[int] = None,
             byzantine_fraction: float = 0.0, seed: int = 0) -> Federation:
  """Builds a clustered federation from one labelled data set.

  1. Cluster pools: task "label_blocks" gives cluster k the examples with
     labels in `[k C/K, (k+1) C/K)`; the other tasks split the shuffled
     examples into K near-equal disjoint pools.
  2. Clients: each pool is split among its `clients_per_cluster` clients by
     `partition` ("iid", "dirichlet" with `alpha`, "shards" with
     `shards_per_client`), on the original labels.
  3. Train/test: each client's examples are shuffled and split, so both come
     from that client's distribution: `train_per_client` / `test_per_client`
     examples when given (with one of them given, the other follows the 80/20
     ratio; a client with fewer examples than their sum is split in that
     ratio; with partition "iid" every client must have enough), else 80/20
     of what the client has (at least 1 test and 1 train example).
  4. Cluster transform: "rotation" rotates cluster k's images by k * 90
     degrees, "private_label" maps y -> (y + k) mod C, "label_blocks" and
     "none" change nothing.
  5. Padding: clients with fewer examples are padded to the largest with zero
     images and label -1. The training padding is explicit:
     `data.num_examples` holds every client's count (None when all clients
     are equal), so batches are `prfl.data.Padded` and `sample_batch` draws
     real examples first. Test padding keeps label -1, which
     `prfl.models.classifier_eval` does not score.
  6. Byzantine: the last `floor(byzantine_fraction * clients_per_cluster)`
     clients of every cluster are marked.

  Clients are ordered cluster by cluster: client i is in cluster
  `i // clients_per_cluster`.

  Args:
    ds: the data set (`load_dataset`).
    task: "rotation" | "private_label" | "label_blocks" | "none".
    num_clusters: K.
    clients_per_cluster: n, clients in each cluster (N = K n).
    train_per_client: training examples per client, or None.
    test_per_client: test examples per client, or None.
    partition: "iid" | "dirichlet" | "shards" (inside each cluster).
    alpha: Dirichlet concentration (partition "dirichlet" only).
    shards_per_client: shards per client (partition "shards" only).
    byzantine_fraction: in [0, 1).
    seed: int >= 0; the same seed gives the same federation.

  Returns:
    `Federation(data, byzantine, num_classes, description)` with
    `data.train = (x float32 [N, M, H, W, C], y int32 [N, M])`,
    `data.test = (x [N, T, H, W, C], y [N, T])`, `data.clusters` int32 `[N]`,
    `data.num_examples` int32 `[N]` (or None when no client is padded) and
    `byzantine` bool `[N]` (NumPy arrays).

  Raises:
    TypeError/ValueError: naming the argument, before any work: unknown task
      or partition, a missing or stray alpha / shards_per_client, alpha <= 0,
      byzantine_fraction outside [0, 1), more clients than examples,
      label_blocks with C not divisible by K, too few examples for the
      requested per-client sizes.
  """
  _check_federate(ds, task, num_clusters, clients_per_cluster,
                  train_per_client, test_per_client, partition, alpha,
                  shards_per_client, byzantine_fraction, seed)
  images, labels = np.asarray(ds.images), np.asarray(ds.labels)
  num_classes, k_num, n = ds.num_classes, num_clusters, clients_per_cluster
  rng = np.random.default_rng(seed)
  requested = _requested(train_per_client, test_per_client)

  if task == "label_blocks":
    owner = label_block(labels, k_num, num_classes)
    pools = [rng.permutation(np.flatnonzero(owner == k)) for k in range(k_num)]
  else:
    pools = np.array_split(rng.permutation(len(labels)), k_num)
  for k, pool in enumerate(pools):
    if len(pool) < n * MIN_CLIENT_EXAMPLES:
      raise ValueError(
          f"cluster {k} has {len(pool)} examples, too few for "
          f"`clients_per_cluster` {n} (>= {MIN_CLIENT_EXAMPLES} each): use "
          "fewer clients or more data.")
    if (partition == "iid" and requested is not None and
        len(pool) // n < sum(requested)):
      raise ValueError(
          f"cluster {k} gives each of its {n} clients {len(pool) // n} "
          f"examples, fewer than `train_per_client` + `test_per_client` = "
          f"{requested[0]} + {requested[1]}: ask for fewer examples or "
          "clients.")

  train_parts, test_parts = [], []
  for k, pool in enumerate(pools):
    pool_labels = labels[pool]
    if partition == "iid":
      parts = iid_partition(pool_labels, n, rng)
    elif partition == "dirichlet":
      parts = dirichlet_partition(pool_labels, n, alpha, rng)
    else:
      parts = shard_partition(pool_labels, n, shards_per_client, rng)
    for part in parts:
      examples = rng.permutation(pool[part])
      n_train, n_test = _split_sizes(len(examples), requested)
      train_parts.append(examples[:n_train])
      test_parts.append(examples[n_train:n_train + n_test])

  train_sizes = np.array([len(p) for p in train_parts])
  test_sizes = np.array([len(p) for p in test_parts])
  x, y = _stack(images, labels, train_parts, int(train_sizes.max()))
  xt, yt = _stack(images, labels, test_parts, int(test_sizes.max()))
  clusters = np.repeat(np.arange(k_num, dtype=np.int32), n)
  for k in range(k_num):
    members = clusters == k
    if task == "rotation":
      x[members], xt[members] = rotate(x[members], k), rotate(xt[members], k)
    elif task == "private_label":
      y[members] = private_label(y[members], k, num_classes)
      yt[members] = private_label(yt[members], k, num_classes)

  num_byz = int(np.floor(byzantine_fraction * n + 1e-9))
  byzantine = np.tile(np.arange(n) >= n - num_byz, k_num)
  used = int(train_sizes.sum() + test_sizes.sum())
  detail = {"dirichlet": f"(alpha={alpha})",
            "shards": f"({shards_per_client} per client)"}.get(partition, "")
  padded = train_sizes.min() < x.shape[1] or test_sizes.min() < xt.shape[1]
  description = (
      f"{ds.source}; task={task}, {k_num} clusters x {n} clients, "
      f"partition={partition}{detail}, train {train_sizes.min()}-"
      f"{train_sizes.max()} / test {test_sizes.min()}-{test_sizes.max()} "
      "examples per client" +
      (f" (padded with label -1 to {x.shape[1]} / {xt.shape[1]})"
       if padded else "") +
      f", {used} of {len(labels)} examples used, {num_byz} Byzantine per "
      f"cluster, seed={seed}")
  counts = (train_sizes.astype(np.int32)
            if train_sizes.min() < x.shape[1] else None)
  data = FederatedData(train=(x, y), test=(xt, yt), clusters=clusters,
                       num_examples=counts)
  return Federation(data=data, byzantine=byzantine, num_classes=num_classes,
                    description=description)
