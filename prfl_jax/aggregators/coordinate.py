"""Coordinate-wise rules: mean, median, trimmed mean, mean around the median.

Each coordinate of the aggregate is computed from that coordinate of the
present rows alone (Yin et al., 2018; Xie, Koyejo and Gupta, 2018).
"""

from typing import Optional

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax.aggregators import base

PyTree = base.PyTree
Aggregator = base.Aggregator


def mean() -> Aggregator:
  """The (weighted) mean over present rows: FedAvg's aggregation.

  Not robust: one non-finite row makes the mean non-finite. With all weights
  1 it is bit-identical to `prfl_jax.tree.weighted_mean(messages, ones)`.
  """
  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    if weights is None:
      return tree_lib.weighted_mean(messages, jnp.ones((n,), jnp.float32))
    base.check_weights(weights, n)
    weights = jnp.asarray(weights, jnp.float32)
    present = weights > 0
    zeroed = tree_lib.where(present, messages,
                            jax.tree.map(jnp.zeros_like, messages))
    return tree_lib.weighted_mean(zeroed, weights)
  return agg


def sorted_columns(leaf: jax.Array, present: jax.Array, weights: jax.Array):
  """Per coordinate: the present values ascending (absent rows last, +inf).

  Returns `(values [N, P], weights [N, P])` sorted along axis 0.
  """
  flat = leaf.reshape(leaf.shape[0], -1)
  vals = jnp.where(present[:, None], flat, jnp.inf)
  order = jnp.argsort(vals, axis=0)
  sv = jnp.take_along_axis(vals, order, axis=0)
  sw = weights[order]
  return sv, sw


def weighted_median_leaf(leaf: jax.Array, present: jax.Array,
                         weights: jax.Array) -> jax.Array:
  """Coordinate-wise weighted median of one leaf `[N, ...]` -> `[...]`."""
  sv, sw = sorted_columns(leaf, present, weights)
  cum = jnp.cumsum(sw, axis=0)
  half = 0.5 * jnp.sum(weights)
  # Lower / upper weighted medians: the first values whose cumulative weight
  # reaches / passes half the total (NumPy's two middle values for equal
  # weights and an even count, the same value for an odd count).
  lo = jnp.argmax(cum >= half, axis=0)
  hi = jnp.argmax(cum > half, axis=0)
  v_lo = jnp.take_along_axis(sv, lo[None], axis=0)[0]
  v_hi = jnp.take_along_axis(sv, hi[None], axis=0)[0]
  med = jnp.where(v_lo == v_hi, v_lo, 0.5 * (v_lo + v_hi))
  med = jnp.where(half > 0, med, 0.0)
  return med.reshape(leaf.shape[1:]).astype(leaf.dtype)


def weighted_median(messages: PyTree, present: jax.Array,
                    weights: jax.Array) -> PyTree:
  """Coordinate-wise weighted median of the present rows (leaves `[...]`)."""
  return jax.tree.map(lambda x: weighted_median_leaf(x, present, weights),
                      messages)


def median() -> Aggregator:
  """Coordinate-wise median (Yin et al., 2018).

  For an even count the mean of the two middle values, as `np.median`.
  Weights are multiplicities (see the package docstring); weight-0 and
  non-finite rows are left out.
  """
  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = base.prepare(messages, weights)
    return weighted_median(zeroed, present, weights)
  return agg


def _ranked_mean(values: jax.Array, weights: jax.Array, keep: jax.Array):
  """Per column, the weighted mean of the `keep` entries (0 if none)."""
  kw = jnp.where(keep, weights, 0.0)
  total = jnp.sum(kw, axis=0)
  s = jnp.sum(jnp.where(keep, values * kw, 0.0), axis=0)
  return jnp.where(total > 0, s / jnp.where(total > 0, total, 1.0), 0.0)


def trimmed_mean(trim_fraction: float) -> Aggregator:
  """Coordinate-wise trimmed mean (Yin et al., 2018).

  Per coordinate, with n present rows, drops the `b = floor(trim_fraction *
  n)` largest and `b` smallest values and averages the rest (weighted by
  their rows' weights), as `scipy.stats.trim_mean`. ByzFL's `TrMean(f)` is
  this rule with `b = f`.

  Args:
    trim_fraction: in [0, 0.5); 0 gives the mean of the present rows.

  Raises:
    ValueError: if `trim_fraction` is outside [0, 0.5).
  """
  if (isinstance(trim_fraction, bool) or
      not isinstance(trim_fraction, (int, float)) or
      not 0 <= trim_fraction < 0.5):
    raise ValueError(
        f"`trim_fraction` must be in [0, 0.5) (the share of values dropped at "
        f"each end), got {trim_fraction!r}.")

  def leaf_mean(leaf, present, weights):
    sv, sw = sorted_columns(leaf, present, weights)
    count = jnp.sum(present)
    b = jnp.floor(trim_fraction * count.astype(jnp.float32)).astype(jnp.int32)
    rank = jnp.arange(leaf.shape[0])[:, None]
    out = _ranked_mean(sv, sw, (rank >= b) & (rank < count - b))
    return out.reshape(leaf.shape[1:]).astype(leaf.dtype)

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = base.prepare(messages, weights)
    return jax.tree.map(lambda x: leaf_mean(x, present, weights), zeroed)
  return agg


def mean_around_median(leaf: jax.Array, present: jax.Array,
                       weights: jax.Array, count) -> jax.Array:
  """Per coordinate of one leaf, the weighted mean of the `count` present
  values nearest the coordinate's weighted median (ties: lower row)."""
  med = weighted_median_leaf(leaf, present, weights).reshape(-1)
  flat = leaf.reshape(leaf.shape[0], -1)
  gap = jnp.where(present[:, None], jnp.abs(flat - med[None, :]), jnp.inf)
  rank = jnp.argsort(jnp.argsort(gap, axis=0, stable=True), axis=0)
  out = _ranked_mean(flat, jnp.broadcast_to(weights[:, None], flat.shape),
                     (rank < count) & present[:, None])
  return out.reshape(leaf.shape[1:]).astype(leaf.dtype)


def meamed(num_byzantine: int) -> Aggregator:
  """Mean around the median, Meamed (Xie, Koyejo and Gupta, 2018).

  Per coordinate k, with n present rows and f = `num_byzantine`,

    Meamed(x)_k = 1/(n - f) * sum_{j=1}^{n-f} [x_{pi_k(j)}]_k,

  where `pi_k` orders the rows by `|[x_i]_k - median_i([x_i]_k)|`
  ascending: the mean of the n - f values nearest the coordinate-wise
  median. Weights: the median is the weighted median and the n - f values
  are averaged with their rows' weights; n - f counts rows.

  Args:
    num_byzantine: f, with 2 f < N.

  Raises:
    ValueError: on a negative `num_byzantine`; when `agg` is traced, if
      `2 * num_byzantine >= N`.

  References:
    Xie, Koyejo and Gupta, 2018, "Generalized Byzantine-tolerant SGD",
    Definition 4 (mean around median); ByzFL's `Meamed`.
  """
  base.check_num_byzantine(num_byzantine, 10 ** 9, "Meamed")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    base.check_num_byzantine(num_byzantine, n, "Meamed")
    _, weights, present, zeroed = base.prepare(messages, weights)
    count = jnp.sum(present) - num_byzantine
    return jax.tree.map(
        lambda x: mean_around_median(x, present, weights, count), zeroed)
  return agg
