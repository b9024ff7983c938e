"""A federated dataset as stacked arrays, and batch sampling inside jit."""

import functools
import numbers
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib

PyTree = Any


class FederatedData(NamedTuple):
  """N clients' data, every leaf with a leading client axis."""
  train: PyTree  # leaves [N, M, ...]: M training examples per client.
  test: PyTree  # leaves [N, ...]: whatever the evaluation function reads.
  clusters: jax.Array  # [N] int32: true cluster of each client (evaluation).


def check_data(data: FederatedData) -> int:
  """Validates `data` and returns N.

  Raises:
    TypeError: if `data` is not a FederatedData.
    ValueError: if the leading axes of train, test and clusters differ, or a
      training leaf has no example axis.
  """
  if not isinstance(data, FederatedData):
    raise TypeError(f"`data` must be a prfl_jax.data.FederatedData, got "
                    f"{type(data)}.")
  n = tree_lib.num_leading(data.train, "data.train")
  nt = tree_lib.num_leading(data.test, "data.test")
  clusters = np.shape(data.clusters)
  if nt != n or clusters != (n,):
    raise ValueError(
        f"`data` is inconsistent: train has {n} clients, test {nt}, clusters "
        f"shape {clusters}; all must have the same number of clients.")
  m = {np.shape(x)[1] if np.ndim(x) > 1 else None
       for x in jax.tree.leaves(data.train)}
  if None in m or len(m) != 1:
    raise ValueError(
        "every leaf of `data.train` must be [N, M, ...] with the same number "
        f"of examples M; got example axes {sorted(map(str, m))}.")
  return n


def num_examples(train: PyTree) -> int:
  """M, the number of training examples per client."""
  return np.shape(jax.tree.leaves(train)[0])[1]


def check_batch_size(batch_size: Optional[int], train: PyTree):
  if batch_size is None:
    return
  m = num_examples(train)
  if (not isinstance(batch_size, numbers.Integral) or
      isinstance(batch_size, bool) or not 1 <= batch_size <= m):
    raise ValueError(
        f"`batch_size` must be None (full batch) or an integer in [1, {m}] "
        f"(examples per client), got {batch_size!r}.")


def valid_mask(train: PyTree) -> Optional[jax.Array]:
  """Which examples are real, as marked by padding labels, or None.

  Padded examples (see `prfl_jax.data.federate`) carry label -1. The labels
  are the integer leaves of shape `[N, M]`; an example is valid when all of
  them are >= 0. Data without such leaves (e.g. the synthetic regression, whose
  targets are float) has no notion of padding: None.

  Args:
    train: leaves `[N, M, ...]`.

  Returns:
    bool `[N, M]`, or None.
  """
  masks = [jnp.asarray(x) >= 0 for x in jax.tree.leaves(train)
           if np.ndim(x) == 2 and np.issubdtype(x.dtype, np.integer)]
  if not masks:
    return None
  return functools.reduce(jnp.logical_and, masks)


def sample_batch(key: jax.Array, train: PyTree,
                 batch_size: Optional[int]) -> PyTree:
  """Every client draws `batch_size` of its examples without replacement.

  Client i takes the first `batch_size` entries of
  `jax.random.permutation(split(key, N)[i], M)`. When `train` has integer
  label leaves `[N, M]` (see `valid_mask`), the permutation is first stably
  reordered so that valid examples (labels >= 0) come before padded ones: a
  client draws only valid examples unless it has fewer than `batch_size`, and
  then the rest of its batch is padding (label -1, ignored by the losses).
  On data without padding the reordering is the identity, so the draws equal
  the plain permutation's; data without integer labels takes exactly that
  plain path.

  Args:
    key: PRNG key; client i uses `split(key, N)[i]`.
    train: leaves `[N, M, ...]`.
    batch_size: B <= M, or None for the full local dataset (padding included).

  Returns:
    leaves `[N, B, ...]`.
  """
  if batch_size is None:
    return train
  n = tree_lib.num_leading(train, "train")
  m = num_examples(train)
  keys = tree_lib.client_keys(key, n)
  valid = valid_mask(train)
  if valid is None:
    idx = jax.vmap(lambda k: jax.random.permutation(k, m)[:batch_size])(keys)
  else:
    def draw(k, ok):
      perm = jax.random.permutation(k, m)
      return perm[jnp.argsort(~ok[perm], stable=True)][:batch_size]
    idx = jax.vmap(draw)(keys, valid)
  return jax.tree.map(
      lambda x: jnp.take_along_axis(
          x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1), train)
