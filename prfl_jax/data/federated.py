"""A federated dataset as stacked arrays, and batch sampling inside jit."""

import numbers
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax.data import padded

PyTree = Any


class FederatedData(NamedTuple):
  """N clients' data, every leaf with a leading client axis.

  Padding is explicit: when clients own different numbers of examples,
  `num_examples[i]` says that rows `[0, num_examples[i])` of client i's
  training leaves are real and the rest padding, and batches drawn from it
  are `prfl.data.Padded` (see `sample_batch`). None: every row is real.
  """
  train: PyTree  # leaves [N, M, ...]: M training rows per client.
  test: PyTree  # leaves [N, ...]: whatever the evaluation function reads.
  clusters: jax.Array  # [N] int32: true cluster of each client (evaluation).
  num_examples: Optional[jax.Array] = None  # [N] int: real rows of train.


def check_data(data: FederatedData) -> int:
  """Validates `data` and returns N.

  Raises:
    TypeError: if `data` is not a FederatedData.
    ValueError: if the leading axes of train, test and clusters differ, a
      training leaf has no example axis, or `num_examples` is not `[N]`
      counts in `[1, M]`.
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
  if data.num_examples is not None:
    padded.check_num_examples(data.num_examples, n, m.pop())
  return n


def num_rows(train: PyTree) -> int:
  """M, the number of training rows per client."""
  return np.shape(jax.tree.leaves(train)[0])[1]


def check_batch_size(batch_size: Optional[int], train: PyTree):
  if batch_size is None:
    return
  m = num_rows(train)
  if (not isinstance(batch_size, numbers.Integral) or
      isinstance(batch_size, bool) or not 1 <= batch_size <= m):
    raise ValueError(
        f"`batch_size` must be None (full batch) or an integer in [1, {m}] "
        f"(examples per client), got {batch_size!r}.")


def batch_rows(keys: jax.Array, width: int, batch_size: int,
               counts: Optional[jax.Array]) -> jax.Array:
  """Which rows each client draws: `[C, batch_size]` int32.

  Client c takes the first `batch_size` entries of
  `jax.random.permutation(keys[c], width)`, stably reordered so that its
  real rows (`< counts[c]`) come first: it draws only real examples unless
  it has fewer than `batch_size`, and then the rest of its batch is padding.
  Without `counts` (or when every client is full) the draws are the plain
  permutation's.

  Args:
    keys: `[C]` PRNG keys, one per client.
    width: M, rows per client.
    batch_size: B <= M.
    counts: `[C]` real rows per client, or None (all real).
  """
  def draw(k, n):
    perm = jax.random.permutation(k, width)
    if n is None:
      return perm[:batch_size]
    return perm[jnp.argsort(perm >= n, stable=True)][:batch_size]
  if counts is None:
    return jax.vmap(lambda k: draw(k, None))(keys)
  return jax.vmap(draw)(keys, counts)


def sample_batch(key: jax.Array, train: PyTree,
                 batch_size: Optional[int],
                 num_examples: Optional[jax.Array] = None) -> PyTree:
  """Every client draws `batch_size` of its examples without replacement.

  Client i draws `batch_rows(split(key, N)[i], ...)`: real examples only,
  unless it has fewer than `batch_size` (then the rest of its batch is
  padding, marked by the mask). Padding is what `num_examples` says, never
  read off the values of `train`.

  Args:
    key: PRNG key; client i uses `split(key, N)[i]`.
    train: leaves `[N, M, ...]`.
    batch_size: B <= M, or None for the full local dataset.
    num_examples: `[N]` real rows per client (`FederatedData.num_examples`),
      or None when every row is real.

  Returns:
    leaves `[N, B, ...]` (`train` itself when `batch_size` is None), as a
    `Padded(examples, mask [N, B])` when `num_examples` is given.
  """
  m = num_rows(train)
  if batch_size is None:
    if num_examples is None:
      return train
    return padded.Padded(train, padded.example_mask(num_examples, m))
  n = tree_lib.num_leading(train, "train")
  idx = batch_rows(tree_lib.client_keys(key, n), m, batch_size, num_examples)
  batch = jax.tree.map(
      lambda x: jnp.take_along_axis(
          x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1), train)
  if num_examples is None:
    return batch
  return padded.Padded(
      batch, idx < jnp.asarray(num_examples)[:, None])
