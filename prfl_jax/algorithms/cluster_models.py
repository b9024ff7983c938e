"""Helpers shared by the methods that keep K cluster models or cluster ids.

IFCA, HypCluster, Clustered FL and Myopic-Clustering all need, for a stack of
client messages and an `[N]` int array of cluster ids, the per-cluster mean
(`jax.ops.segment_sum`, never a Python loop over clusters), the losses of every
client at every cluster model, and the loss-based assignment.
"""

import numbers
from typing import Any

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib

PyTree = Any


def check_callable(fn, name: str):
  """Raises TypeError unless `fn` is callable."""
  if not callable(fn):
    raise TypeError(f"`{name}` must be callable, got {type(fn)}.")


def check_non_negative(value, name: str):
  """Raises ValueError unless `value` is a finite real number >= 0."""
  if (not isinstance(value, numbers.Real) or isinstance(value, bool) or
      not value >= 0 or value == float("inf")):
    raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")


def segment_mean(values: PyTree, segment_ids: jax.Array, num_segments: int,
                 weights=None):
  """Weighted mean of the rows of `values` within every segment.

  Args:
    values: pytree, every leaf `[N, ...]`.
    segment_ids: `[N]` int ids in `[0, num_segments)`.
    num_segments: number of segments K (static).
    weights: optional `[N]` non-negative weights (default 1).

  Returns:
    `(means, totals)`: means leaves `[K, ...]` (0 for an empty segment) and
    totals `[K]`, the summed weight of each segment.
  """
  n = segment_ids.shape[0]
  if weights is None:
    weights = jnp.ones((n,), jnp.float32)
  totals = jax.ops.segment_sum(weights, segment_ids, num_segments)

  def mean(v):
    shape = (-1,) + (1,) * (v.ndim - 1)
    w = weights.reshape(shape).astype(v.dtype)
    sums = jax.ops.segment_sum(w * v, segment_ids, num_segments)
    t = totals.reshape(shape).astype(v.dtype)
    return sums / jnp.where(t > 0, t, 1.0)

  return jax.tree.map(mean, values), totals


def cluster_losses(loss_fn, models: PyTree, batch: PyTree) -> jax.Array:
  """Every client's loss at every cluster model.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    models: pytree, every leaf `[K, ...]`.
    batch: pytree, every leaf `[N, B, ...]`.

  Returns:
    `[K, N]` array, entry `[k, i]` is `f_i(theta_k)` on client i's batch.
  """
  per_client = jax.vmap(loss_fn, in_axes=(None, 0))
  return jax.vmap(per_client, in_axes=(0, None))(models, batch)


def loss_assignment(losses: jax.Array) -> jax.Array:
  """`[N]` int32 index of the lowest `[K, N]` loss (ties: lowest index).

  A non-finite loss never wins unless every loss of the client is non-finite.
  """
  losses = jnp.where(jnp.isfinite(losses), losses, jnp.inf)
  return jnp.argmin(losses, axis=0).astype(jnp.int32)


def count_nonempty(segment_ids: jax.Array, num_segments: int) -> jax.Array:
  """Number of segments with at least one member, as a float32 scalar."""
  sizes = jax.ops.segment_sum(jnp.ones_like(segment_ids), segment_ids,
                              num_segments)
  return jnp.sum(sizes > 0).astype(jnp.float32)


def keep_where_empty(nonempty: jax.Array, new: PyTree, old: PyTree) -> PyTree:
  """Per-cluster select: `new[k]` where `nonempty[k]`, else `old[k]`.

  Leaves without a leading axis (e.g. optax's empty states) are taken from
  `new`.
  """
  def sel(a, b):
    if jnp.ndim(a) == 0:
      return a
    return tree_lib.where(nonempty, a, b)
  return jax.tree.map(sel, new, old)


def cosine_similarity(points: PyTree) -> jax.Array:
  """`[N, N]` cosine similarities of stacked points (0 where a norm is 0).

  Non-finite entries (e.g. from NaN messages) are set to 0.

  Args:
    points: pytree, every leaf `[N, ...]`.
  """
  g = tree_lib.gram(points)
  norms = jnp.sqrt(jnp.maximum(jnp.diagonal(g), 0.0))
  denom = norms[:, None] * norms[None, :]
  sim = jnp.where(denom > 0, g / jnp.where(denom > 0, denom, 1.0), 0.0)
  return jnp.where(jnp.isfinite(sim), jnp.clip(sim, -1.0, 1.0), 0.0)
