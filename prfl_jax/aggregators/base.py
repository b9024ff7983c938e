"""What every aggregator shares: argument checks, present rows, distances.

An aggregator is `agg(messages, weights=None) -> aggregate` (see the package
docstring). This module holds the pieces the rules are built from; none of
them is a rule itself.
"""

import functools
import math
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax import validation

PyTree = Any
Aggregator = Callable[..., PyTree]


def check_weights(weights, n: int):
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


def weight_dtype(messages: PyTree):
  """float32, or the widest float dtype among the leaves if wider."""
  return functools.reduce(jnp.promote_types, [
      x.dtype for x in jax.tree.leaves(messages)
      if jnp.issubdtype(x.dtype, jnp.floating)], jnp.dtype(jnp.float32))


def prepare(messages: PyTree, weights, finite_only: bool = True):
  """Returns `(n, weights [N], present [N] bool, zeroed messages)`.

  The weights are float32, or float64 for float64 messages.

  `present` marks rows of positive weight (and finite entries when
  `finite_only`); absent rows are replaced by zeros so that `0 * NaN` never
  reaches a sum, and their weight is 0.
  """
  n = tree_lib.num_leading(messages, "messages")
  dtype = weight_dtype(messages)
  if weights is None:
    weights = jnp.ones((n,), dtype)
  else:
    check_weights(weights, n)
    weights = jnp.asarray(weights, dtype)
  present = weights > 0
  if finite_only:
    present = present & tree_lib.all_finite(messages)
  weights = jnp.where(present, weights, 0.0)
  zeroed = tree_lib.where(present, messages,
                          jax.tree.map(jnp.zeros_like, messages))
  return n, weights, present, zeroed


def check_positive_float(value, name: str):
  if (isinstance(value, bool) or not isinstance(value, numbers.Real) or
      not math.isfinite(value) or value <= 0):
    raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.")


def check_fraction(value, name: str, low: float, high: float):
  """Raises ValueError unless `low <= value < high` (a real, not a bool)."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Real) or
      not low <= value < high):
    raise ValueError(f"`{name}` must be in [{low}, {high}), got {value!r}.")


def check_num_byzantine(num_byzantine, n: int, rule: str, factor: int = 2,
                        extra: int = 0):
  """Raises ValueError unless `factor * f + extra < n` (f = num_byzantine).

  Args:
    num_byzantine: f.
    n: the number of message rows N (static).
    rule: the rule's name, quoted in the message.
    factor, extra: the rule's requirement `n > factor * f + extra`.
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)
  if factor * num_byzantine + extra >= n:
    raise ValueError(
        f"`num_byzantine`={num_byzantine} is too large for {rule} with N={n} "
        f"messages: {rule} needs N > {factor} * num_byzantine"
        + (f" + {extra}" if extra else "") + ".")


def pairwise_sq_distances(points: PyTree) -> jax.Array:
  """`[N, N]` squared distances `||z_i - z_j||^2` of flattened pytrees.

  From the Gram matrix at full float32 precision (`prfl_jax.tree.gram`), so
  no `[N, N, P]` array is formed; clipped at 0 against round-off.
  """
  g = tree_lib.gram(points)
  sq = jnp.diagonal(g)
  return jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0)


def power_of_two(k: jax.Array, dtype) -> jax.Array:
  """`2^k` in the float `dtype`, exactly, for an integer k in its normal
  range (built from the bits: `2.0 ** k` need not be exact); 0 below that
  range, the largest power of two above it."""
  info = jnp.finfo(dtype)
  bits = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[info.bits // 8]
  biased = jnp.clip(k + (info.maxexp - 1), 0, 2 * info.maxexp - 2).astype(
      bits)
  return jax.lax.bitcast_convert_type(
      jax.lax.shift_left(biased, jnp.asarray(info.nmant, bits)), dtype)


def times_power_of_two(points: PyTree, k: jax.Array) -> PyTree:
  """Every leaf times 2^k (k an integer scalar, or `[N]`: one per row; may
  be traced), applied as two factors 2^(k // 2) and 2^(k - k // 2), each a
  normal number in the leaf's dtype for |k| up to about twice its exponent
  range (2^k itself is not, e.g. 2^-128 or 2^149 in float32). Exact short
  of the result's overflow or subnormal range. Leaves of other than a float
  dtype are brought to float32 first."""
  k = jnp.asarray(k)
  low = k // 2
  high = k - low

  def leaf(x):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      x = x.astype(jnp.float32)
    shape = (-1,) + (1,) * (x.ndim - 1) if k.ndim else ()
    return (x * power_of_two(low, x.dtype).reshape(shape) *
            power_of_two(high, x.dtype).reshape(shape))
  return jax.tree.map(leaf, points)


def row_peaks(points: PyTree) -> jax.Array:
  """`[N]`: every row's largest |entry| over all leaves (0 for no leaves)."""
  leaves = [x.reshape(x.shape[0], -1) for x in jax.tree.leaves(points)]
  if not leaves:
    return jnp.zeros((0,), jnp.float32)
  return functools.reduce(jnp.maximum, [
      jnp.max(jnp.abs(x), axis=1, initial=0) for x in leaves])


def median_peak_exponent(points: PyTree) -> jax.Array:
  """k (an int32 scalar): 2^k brings the median of the rows' nonzero
  `row_peaks` into [0.5, 1); 0 when no row has a nonzero finite peak.

  The median, not the largest: one row far above the others (an attacker's
  1e35) cannot push the others' squares into float32's subnormal range,
  where they flush to 0 and every small distance ties; with fewer than half
  the rows far from the rest, the rest keep their differences. Zero rows
  (absent rows, as `prepare` zeroes them) are left out of the median.
  """
  peaks = row_peaks(points)
  if peaks.shape[0] == 0:
    return jnp.zeros((), jnp.int32)
  peaks = peaks.astype(jnp.result_type(peaks, jnp.float32))
  mid = jnp.nanmedian(jnp.where(peaks > 0, peaks, jnp.nan))
  _, e = jnp.frexp(mid)  # 0 for NaN and inf.
  return -e


def max_peak_exponent(points: PyTree) -> jax.Array:
  """k (an int32 scalar): 2^k brings the largest |entry| of all rows into
  [0.5, 1); 0 when all are 0 or one is not finite.

  With the rows times 2^k no square or inner product overflows, so a Gram
  matrix of them is finite (an eigendecomposition of one with inf entries
  is NaN throughout); rows below ~1e-19 of the largest flush to 0. For
  rules that rank rows by their distances `median_peak_exponent` keeps the
  small rows apart instead.
  """
  peaks = row_peaks(points)
  if peaks.shape[0] == 0:
    return jnp.zeros((), jnp.int32)
  _, e = jnp.frexp(jnp.max(peaks.astype(
      jnp.result_type(peaks, jnp.float32))))
  return -e


def scaled_sq_distances(points: PyTree) -> jax.Array:
  """`[N, N]`: the squared distances times 2^(2k), for comparisons.

  `pairwise_sq_distances` of the rows times 2^k (`times_power_of_two`), k
  from `median_peak_exponent` (the rows' median largest |entry| brought to
  [0.5, 1)); NaN, which finite rows give only where squares overflow (inf
  - inf), read as inf. One 2^(2k) for every entry and a power of two
  changes no rounding, so orderings, argmins, ties and sums of the entries
  are those of `pairwise_sq_distances(points)` bit for bit wherever that
  neither overflows nor underflows, while finite float32 rows of size ~1e19
  (squares inf: every distance inf, every row tied) or ~1e-22 (squares 0)
  are told apart. Rows more than ~1e19 times the median overflow to inf
  distances (far from everything), as large rows did unscaled. Not
  distances in the rows' units: a caller that needs those multiplies by
  2^(-2k), or their square roots by 2^-k.

  Args:
    points: pytree of rows with finite entries, leaves `[N, ...]`.
  """
  d2 = pairwise_sq_distances(
      times_power_of_two(points, median_peak_exponent(points)))
  return jnp.where(jnp.isnan(d2), jnp.inf, d2)


def _unit_rows(zeroed: PyTree):
  """`(m [N], s [N], r [N])` for rows of finite entries: m_i the row's
  largest |entry| over all leaves, s_i = 1 / sqrt(m_i) (1 for a zero row)
  and r_i = ||x_i s_i s_i||, the norm of the row brought to largest |entry|
  1 (in [1, sqrt(P)] up to rounding, 0 for a zero row), so that ||x_i|| =
  m_i r_i with no square above 1.

  The rows are multiplied by s_i twice rather than divided by m_i: XLA turns
  a division by a broadcast into a product with the reciprocal, and 1 / m_i
  is subnormal (0 on CPU, which flushes them) for m_i above ~8.5e37, while
  1 / sqrt(m_i) is a normal number for every finite m_i.
  """
  leaves = [x.reshape(x.shape[0], -1) for x in jax.tree.leaves(zeroed)]
  peaks = functools.reduce(jnp.maximum, [
      jnp.max(jnp.abs(x), axis=1, initial=0) for x in leaves])
  inv_root = jax.lax.rsqrt(jnp.where(peaks > 0, peaks, 1).astype(
      jnp.result_type(peaks, jnp.float32)))
  units = jnp.sqrt(sum(
      jnp.sum(jnp.square(x * inv_root[:, None] * inv_root[:, None]), axis=1)
      for x in leaves))
  return peaks, inv_root, units


def _squares_usable(sq: jax.Array) -> jax.Array:
  """`[N]` bool: the squared norms that are finite and not below the
  smallest normal number (where `sqrt` gives the norm to rounding)."""
  tiny = jnp.finfo(sq.dtype).tiny if jnp.issubdtype(
      sq.dtype, jnp.inexact) else 0
  return jnp.isfinite(sq) & (sq >= tiny)


def _norm_parts(zeroed: PyTree):
  """`(norms, usable, inv_root, units)`, each `[N]`: `row_norms`' norms,
  where the squared norms are usable (`_squares_usable`), and `_unit_rows`'
  s_i and r_i, which `clip_rows` also reads."""
  sq = tree_lib.sq_norms(zeroed)
  peaks, inv_root, units = _unit_rows(zeroed)
  usable = _squares_usable(sq)
  norms = jnp.where(usable, jnp.sqrt(sq), peaks * units)
  return norms, usable, inv_root, units


def row_norms(zeroed: PyTree) -> jax.Array:
  """`[N]`: every row's l2 norm over all leaves, safe from the squares'
  overflow and underflow.

  Where the squared norm (`tree.sq_norms`) is finite and normal the norm is
  its square root, as before (to float32 rounding); elsewhere (a float32
  entry above ~1.8e19 squares to inf, a row below ~1e-19 to a subnormal or
  0) it is
  `m_i * ||x_i / m_i||`, m_i the row's largest |entry|. It is inf only when
  the norm itself exceeds the dtype's largest value (3.4e38 in float32).

  Args:
    zeroed: messages with finite entries, leaves `[N, ...]` (e.g. from
      `prepare`).
  """
  return _norm_parts(zeroed)[0]


def clip_rows(zeroed: PyTree, threshold) -> PyTree:
  """Every row times `min(1, threshold / ||x_i||)`, norms from `row_norms`.

  A row whose norm is above `threshold` is brought to it in its own
  direction: as `x_i * (threshold / ||x_i||)` where the squared norm is
  usable (as `row_norms` says; the plain clip), else as
  `(x_i / m_i) * (threshold / ||x_i / m_i||)`, so a finite row whose
  squared norm (or norm) overflows is clipped, not zeroed by `threshold /
  inf`. A row at exactly `threshold` (inf included) is left alone.

  Args:
    zeroed: messages with finite entries, leaves `[N, ...]`.
    threshold: scalar c >= 0 (may be traced, may be inf).

  Returns:
    pytree like `zeroed`.
  """
  norms, usable, inv_root, units = _norm_parts(zeroed)
  clip = norms > threshold
  inv_root = jnp.where(clip & ~usable, inv_root, 1.0)
  factor = jnp.where(clip, jnp.where(
      usable, threshold / jnp.maximum(norms, 1e-30),
      threshold / jnp.where(units > 0, units, 1.0)), 1.0)

  def leaf(x):
    shape = (-1,) + (1,) * (x.ndim - 1)
    s = inv_root.reshape(shape).astype(x.dtype)
    return x * s * s * factor.reshape(shape).astype(x.dtype)
  return jax.tree.map(leaf, zeroed)


def flatten(messages: PyTree) -> jax.Array:
  """`[N, P]`: every row's leaves concatenated (in `jax.tree.leaves` order)."""
  return jnp.concatenate([x.reshape(x.shape[0], -1)
                          for x in jax.tree.leaves(messages)], axis=1)


def unflatten(vector: jax.Array, like: PyTree) -> PyTree:
  """Inverse of `flatten` for one row: `[P]` -> a pytree like `like[0]`."""
  leaves, treedef = jax.tree.flatten(like)
  out, offset = [], 0
  for x in leaves:
    size = int(np.prod(x.shape[1:]))
    out.append(vector[offset:offset + size].reshape(x.shape[1:]).astype(
        x.dtype))
    offset += size
  return jax.tree.unflatten(treedef, out)


def nearest(d2: jax.Array, present: jax.Array, count) -> jax.Array:
  """`[M, N]` bool: for each of M rows of distances, its `count` nearest
  present columns (ties: lower index; `count` may be traced).

  Args:
    d2: `[M, N]` distances (any monotone transform of them).
    present: `[N]` bool, the columns that may be chosen.
    count: how many to choose per row (at most the present count).
  """
  n = d2.shape[1]
  d2 = jnp.where(present[None, :], d2, jnp.inf)
  order = jnp.lexsort((jnp.broadcast_to(jnp.arange(n), d2.shape), d2,
                       ~jnp.broadcast_to(present, d2.shape)), axis=1)
  rank = jnp.zeros_like(order).at[
      jnp.arange(d2.shape[0])[:, None], order].set(jnp.arange(n)[None, :])
  return (rank < count) & present[None, :]


def selected_mean(zeroed: PyTree, weights: jax.Array,
                  selected: jax.Array) -> PyTree:
  """Weighted mean of the `selected` rows (`[N]` bool) of zeroed messages."""
  return tree_lib.weighted_mean(zeroed, jnp.where(selected, weights, 0.0))
