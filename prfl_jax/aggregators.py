"""Robust aggregators: what a server may use in place of the mean.

Each factory returns a pure function

  agg(messages, weights=None) -> aggregate

where `messages` is a pytree whose leaves are `[N, ...]` (one row per client)
and the aggregate is one message (leaves `[...]`). `weights` is an optional
`[N]` array of non-negative weights; a row of weight 0 is absent (padding, a
client outside an IFCA cluster) and never reaches the output, whatever it
holds. The functions are jit- and vmap-compatible; arguments are checked when
the factory is called, and the ones that need N (Krum) when `agg` is traced.

Non-finite rows. Every rule except `mean` treats a row with any NaN or Inf
entry as absent, so a Byzantine client sending NaN/Inf cannot reach the
output (the median of the remaining rows, etc.). `mean` is the plain mean:
one non-finite row makes it non-finite, as in every FedAvg implementation.

Weights other than 0/1. Positive weights scale each row's share of every
average: the weighted mean, the mean of the values a trimmed mean keeps,
Multi-Krum's mean of the selected rows, RFA's weighted Weiszfeld iteration
(Pillutla et al., 2022, with `alpha_i = w_i`) and the clipped mean of
centered clipping. In the median they are multiplicities: an integer weight w
gives the same result as w copies of the row (the weighted median, mean of the
lower and upper weighted medians, which is NumPy's median for equal weights).
Counts (how many values a trimmed mean drops, how many neighbours Krum sums)
count present rows, not weight.

Where a rule needs distances (Krum, geometric median, centered clipping) the
whole pytree is one flattened vector: `||x|| = sqrt(sum over leaves of
||leaf||^2)`. With no present row the aggregate is 0.

References:
  Blanchard et al., 2017 (Krum, Multi-Krum); Yin et al., 2018 (median,
  trimmed mean); Pillutla et al., 2022 (RFA: geometric median by smoothed
  Weiszfeld); Karimireddy et al., 2021 (centered clipping).
"""

import math
import numbers
from typing import Any, Callable, Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax import validation

PyTree = Any
Aggregator = Callable[..., PyTree]


def _check_weights(weights, n: int):
  """Shape check always; sign/finiteness checks on concrete weights."""
  if np.shape(weights) != (n,):
    raise ValueError(
        f"`weights` must have shape [{n}] (one per message row), got "
        f"{np.shape(weights)}.")
  if not isinstance(weights, jax.core.Tracer):
    w = np.asarray(weights, np.float64)
    if not np.all(np.isfinite(w)) or np.any(w < 0):
      raise ValueError(
          f"`weights` must be finite and non-negative, got {weights!r}.")


def _prepare(messages: PyTree, weights, finite_only: bool):
  """Returns `(n, weights [N] float32, present [N] bool, zeroed messages)`.

  `present` marks rows of positive weight (and finite entries when
  `finite_only`); absent rows are replaced by zeros so that `0 * NaN` never
  reaches a sum.
  """
  n = tree_lib.num_leading(messages, "messages")
  if weights is None:
    weights = jnp.ones((n,), jnp.float32)
  else:
    _check_weights(weights, n)
    weights = jnp.asarray(weights, jnp.float32)
  present = weights > 0
  if finite_only:
    present = present & tree_lib.all_finite(messages)
  weights = jnp.where(present, weights, 0.0)
  zeroed = tree_lib.where(present, messages,
                          jax.tree.map(jnp.zeros_like, messages))
  return n, weights, present, zeroed


def _check_positive_float(value, name: str):
  if (isinstance(value, bool) or not isinstance(value, numbers.Real) or
      not math.isfinite(value) or value <= 0):
    raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.")


def mean() -> Aggregator:
  """The (weighted) mean over present rows: FedAvg's aggregation.

  Not robust: one non-finite row makes the mean non-finite. With all weights
  1 it is bit-identical to `prfl_jax.tree.weighted_mean(messages, ones)`.
  """
  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    if weights is None:
      return tree_lib.weighted_mean(messages, jnp.ones((n,), jnp.float32))
    _check_weights(weights, n)
    weights = jnp.asarray(weights, jnp.float32)
    present = weights > 0
    zeroed = tree_lib.where(present, messages,
                            jax.tree.map(jnp.zeros_like, messages))
    return tree_lib.weighted_mean(zeroed, weights)
  return agg


def _sorted_columns(leaf: jax.Array, present: jax.Array, weights: jax.Array):
  """Per coordinate: the present values ascending (absent rows last, +inf).

  Returns `(values [N, P], weights [N, P])` sorted along axis 0.
  """
  flat = leaf.reshape(leaf.shape[0], -1)
  vals = jnp.where(present[:, None], flat, jnp.inf)
  order = jnp.argsort(vals, axis=0)
  sv = jnp.take_along_axis(vals, order, axis=0)
  sw = weights[order]
  return sv, sw


def _weighted_median_leaf(leaf: jax.Array, present: jax.Array,
                          weights: jax.Array) -> jax.Array:
  """Coordinate-wise weighted median of one leaf `[N, ...]` -> `[...]`."""
  sv, sw = _sorted_columns(leaf, present, weights)
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


def _median(messages: PyTree, present: jax.Array,
            weights: jax.Array) -> PyTree:
  return jax.tree.map(lambda x: _weighted_median_leaf(x, present, weights),
                      messages)


def median() -> Aggregator:
  """Coordinate-wise median (Yin et al., 2018).

  For an even count the mean of the two middle values, as `np.median`.
  Weights are multiplicities (see the module docstring); weight-0 and
  non-finite rows are left out.
  """
  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = _prepare(messages, weights, True)
    return _median(zeroed, present, weights)
  return agg


def trimmed_mean(trim_fraction: float) -> Aggregator:
  """Coordinate-wise trimmed mean (Yin et al., 2018).

  Per coordinate, with n present rows, drops the `b = floor(trim_fraction *
  n)` largest and `b` smallest values and averages the rest (weighted by
  their rows' weights), as `scipy.stats.trim_mean`.

  Args:
    trim_fraction: in [0, 0.5); 0 gives the mean of the present rows.

  Raises:
    ValueError: if `trim_fraction` is outside [0, 0.5).
  """
  if (isinstance(trim_fraction, bool) or
      not isinstance(trim_fraction, numbers.Real) or
      not 0 <= trim_fraction < 0.5):
    raise ValueError(
        f"`trim_fraction` must be in [0, 0.5) (the share of values dropped at "
        f"each end), got {trim_fraction!r}.")

  def leaf_mean(leaf, present, weights):
    sv, sw = _sorted_columns(leaf, present, weights)
    count = jnp.sum(present)
    b = jnp.floor(trim_fraction * count.astype(jnp.float32)).astype(jnp.int32)
    rank = jnp.arange(leaf.shape[0])[:, None]
    keep = (rank >= b) & (rank < count - b)
    kw = jnp.where(keep, sw, 0.0)
    total = jnp.sum(kw, axis=0)
    s = jnp.sum(jnp.where(keep, sv * kw, 0.0), axis=0)
    out = jnp.where(total > 0, s / jnp.where(total > 0, total, 1.0), 0.0)
    return out.reshape(leaf.shape[1:]).astype(leaf.dtype)

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = _prepare(messages, weights, True)
    return jax.tree.map(lambda x: leaf_mean(x, present, weights), zeroed)
  return agg


def pairwise_sq_distances(points: PyTree) -> jax.Array:
  """`[N, N]` squared distances `||z_i - z_j||^2` of flattened pytrees.

  From the Gram matrix at full float32 precision (`prfl_jax.tree.gram`), so
  no `[N, N, P]` array is formed; clipped at 0 against round-off.
  """
  g = tree_lib.gram(points)
  sq = jnp.diagonal(g)
  return jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0)


def check_krum(num_byzantine: int, num_clients: int):
  """Raises ValueError unless Krum's `2 f + 2 < N` (Blanchard et al.) holds."""
  if 2 * num_byzantine + 2 >= num_clients:
    raise ValueError(
        f"`num_byzantine`={num_byzantine} is too large for Krum with N="
        f"{num_clients} messages: Krum needs N > 2 * num_byzantine + 2 "
        f"(here num_byzantine <= {max((num_clients - 3) // 2, -1)}).")


def krum(num_byzantine: int, num_selected: int = 1) -> Aggregator:
  """Krum and Multi-Krum (Blanchard et al., 2017).

  With n present rows, `score_i = sum of ||x_i - x_j||^2 over the n -
  num_byzantine - 2 nearest other present rows` (at least 1); the aggregate
  is the (weighted) mean of the `num_selected` lowest-scoring rows (ties:
  lower index). `num_selected=1` is Krum.

  Args:
    num_byzantine: f, the number of Byzantine rows Krum must tolerate.
    num_selected: m, rows averaged (Multi-Krum when m > 1).

  Raises:
    ValueError: on a negative `num_byzantine` or `num_selected < 1` at once;
      when `agg` is traced, if `2 * num_byzantine + 2 >= N` or
      `num_selected > N`.
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)
  validation.check_positive_int(num_selected, "num_selected")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    check_krum(num_byzantine, n)
    if num_selected > n:
      raise ValueError(
          f"`num_selected`={num_selected} exceeds the N={n} messages.")
    n, weights, present, zeroed = _prepare(messages, weights, True)
    d2 = pairwise_sq_distances(zeroed)
    pair = present[:, None] & present[None, :] & ~jnp.eye(n, dtype=bool)
    d2 = jnp.where(pair, d2, jnp.inf)
    count = jnp.sum(present)
    neighbours = jnp.maximum(count - num_byzantine - 2, 1)
    nearest = jnp.sort(d2, axis=1)
    rank = jnp.arange(n)[None, :]
    score = jnp.sum(jnp.where(rank < neighbours, nearest, 0.0), axis=1)
    # Present rows first (a lone present row has an infinite score), then by
    # score, then by index.
    order = jnp.lexsort((jnp.arange(n), score, ~present))
    selected = jnp.zeros((n,), bool).at[order[:num_selected]].set(True)
    selected = selected & present
    return tree_lib.weighted_mean(zeroed, jnp.where(selected, weights, 0.0))
  return agg


def geometric_median(num_iters: int, eps: float = 1e-8) -> Aggregator:
  """Geometric median by smoothed Weiszfeld iterations (RFA).

  From the weighted mean z of the present rows, `num_iters` times
  `z <- sum_i w_i x_i / max(eps, ||x_i - z||) / sum_i w_i / max(eps,
  ||x_i - z||)`.

  Args:
    num_iters: Weiszfeld iterations (>= 1).
    eps: smoothing (> 0): distances below it count as `eps`.

  Raises:
    ValueError: if `num_iters < 1` or `eps <= 0`.

  References:
    Pillutla, Kakade and Harchaoui, 2022, "Robust Aggregation for Federated
    Learning", Algorithm 2 (smoothed Weiszfeld).
  """
  validation.check_positive_int(num_iters, "num_iters")
  _check_positive_float(eps, "eps")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = _prepare(messages, weights, True)

    def body(_, z):
      d2 = tree_lib.sq_distances(zeroed, jax.tree.map(lambda v: v[None], z))
      dist = jnp.sqrt(d2[:, 0])
      beta = jnp.where(present, weights / jnp.maximum(eps, dist), 0.0)
      return tree_lib.weighted_mean(zeroed, beta)

    return lax.fori_loop(0, num_iters, body, tree_lib.weighted_mean(zeroed, weights))
  return agg


def centered_clipping(radius: float, num_iters: int,
                      center: Optional[PyTree] = None) -> Aggregator:
  """Centered clipping (Karimireddy et al., 2021).

  `num_iters` times `v <- v + mean_i clip(x_i - v, radius)` (weighted mean
  over present rows), `clip(u, r) = u * min(1, r / ||u||)`, from `center` or,
  if None, the coordinate-wise (weighted) median of the present rows.

  Args:
    radius: clipping radius tau (> 0).
    num_iters: clipping iterations (>= 1).
    center: optional starting point, a pytree like one message (leaves
      `[...]`), e.g. the previous round's aggregate.

  Raises:
    ValueError: if `radius <= 0` or `num_iters < 1`.

  References:
    Karimireddy, He and Jaggi, 2021, "Learning from History for Byzantine
    Robust Optimization", eq. (CC).
  """
  _check_positive_float(radius, "radius")
  validation.check_positive_int(num_iters, "num_iters")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = _prepare(messages, weights, True)
    if center is None:
      v0 = _median(zeroed, present, weights)
    else:
      tree_lib.check_same_structure(
          zeroed, jax.tree.map(lambda c: jnp.asarray(c)[None], center),
          "messages", "center")
      v0 = jax.tree.map(lambda c, x: jnp.asarray(c, x.dtype), center, zeroed)

    total = jnp.sum(weights)
    share = weights / jnp.where(total > 0, total, 1.0)  # [N], 0 if absent.

    def body(_, v):
      diff = jax.tree.map(lambda x, c: x - c[None], zeroed, v)
      norm = jnp.sqrt(tree_lib.sq_norms(diff))
      coef = share * jnp.minimum(1.0, radius / jnp.maximum(norm, 1e-30))
      return jax.tree.map(
          lambda c, d: c + jnp.tensordot(coef.astype(d.dtype), d, axes=1),
          v, diff)

    return lax.fori_loop(0, num_iters, body, v0)
  return agg


def per_segment(aggregator: Aggregator, messages: PyTree,
                segment_ids: jax.Array, num_segments: int,
                weights: Optional[jax.Array] = None):
  """`aggregator` over each segment's rows (e.g. IFCA's cluster members).

  Args:
    aggregator: an `agg(messages, weights)` of this module.
    messages: leaves `[N, ...]`.
    segment_ids: `[N]` int, segment of each row.
    num_segments: K.
    weights: optional `[N]` row weights.

  Returns:
    `(aggregates, sizes)`: leaves `[K, ...]` and `[K]` summed weights
    (0 for an empty segment, whose aggregate is 0).
  """
  n = tree_lib.num_leading(messages, "messages")
  w = jnp.ones((n,), jnp.float32) if weights is None else jnp.asarray(
      weights, jnp.float32)
  member = (segment_ids[None, :] == jnp.arange(num_segments)[:, None])
  seg_w = jnp.where(member, w[None, :], 0.0)  # [K, N]
  out = jax.vmap(lambda sw: aggregator(messages, sw))(seg_w)
  return out, jnp.sum(seg_w, axis=1)
