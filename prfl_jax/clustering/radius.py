"""Radius rules of Threshold-Clustering and the ball test.

A radius `tau` is a non-negative scalar, one per centre `[K]`, or a rule
`rule(distances [N], present [N]) -> tau` evaluated for every centre at every
clustering step, such as `quantile_radius(q)` (Werner et al., 2023, Section
5.2). `_inside` applies it: which points lie in which centre's ball.
"""

from typing import Callable, NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np

RadiusRule = Callable[[jax.Array, jax.Array], jax.Array]
Radius = Union[float, jax.Array, RadiusRule]


# Up to this many points the quantile uses O(N^2) rank counting, which XLA runs
# much faster than a sort, notably under vmap (3x on a vmapped sweep on CPU).
RANK_QUANTILE_MAX_N = 512


_QUANTILE_METHODS = ("auto", "rank", "sort")


def masked_quantile(values: jax.Array, present: jax.Array, q: jax.Array, *,
                    method: str = "auto") -> jax.Array:
  """`jnp.quantile(values[present], q)` (linear interpolation) under jit.

  NaN values count as +inf, and an infinite neighbour makes the result
  infinite. With no present value the result is 0.

  Args:
    values: `[N]` array.
    present: `[N]` bool mask of the values that take part.
    q: scalar in [0, 1].
    method: how the k-th smallest value is found (same result): `"rank"`
      counts ranks (`O(N^2)` comparisons), `"sort"` sorts, `"auto"` ranks
      for N <= `RANK_QUANTILE_MAX_N` and sorts above.

  Returns:
    scalar.

  Raises:
    ValueError: on an unknown `method`.
  """
  if method not in _QUANTILE_METHODS:
    raise ValueError(
        f"`method` must be one of {_QUANTILE_METHODS}, got {method!r}.")
  if method == "auto":
    method = "rank" if values.shape[0] <= RANK_QUANTILE_MAX_N else "sort"
  values = jnp.where(jnp.isnan(values), jnp.inf, values)
  masked = jnp.where(present, values, jnp.inf)
  count = jnp.sum(present)
  pos = q * jnp.maximum(count - 1, 0).astype(values.dtype)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.ceil(pos).astype(jnp.int32)
  if method == "rank":
    # The k-th smallest value (0-based) is the least v_j with at least k + 1
    # values <= v_j.
    at_most = jnp.sum(masked[None, :] <= masked[:, None], axis=1)
    kth = lambda k: jnp.min(jnp.where(at_most >= k + 1, masked, jnp.inf))
    v_lo, v_hi = kth(lo), kth(hi)
  else:
    ordered = jnp.sort(masked)
    v_lo, v_hi = ordered[lo], ordered[hi]
  frac = (pos - lo).astype(values.dtype)
  interp = jnp.where(v_hi == v_lo, v_lo, v_lo + frac * (v_hi - v_lo))
  return jnp.where(count > 0, interp, jnp.zeros_like(interp))


class QuantileRadius(NamedTuple):
  """Radius rule: the `q`-quantile of the present points' distances."""
  q: Union[float, jax.Array]

  def __call__(self, distances: jax.Array, present: jax.Array) -> jax.Array:
    """Returns `tau` for one centre from its `[N]` distances."""
    return masked_quantile(distances, present, self.q)


def quantile_radius(q: Union[float, jax.Array]) -> QuantileRadius:
  """Adaptive radius: `tau_{k,l} = quantile(||z_i - v_{k,l-1}||, q)`.

  Recomputed at every clustering step from the distances of the present points
  (weight > 0) to the current centre, as in the paper's MNIST and CIFAR
  experiments (Werner et al., 2023, Section 5.2: 20th percentile).

  Args:
    q: quantile in (0, 1] (q = 0 would keep only the nearest point, i.e. the
      centre would follow a single client); may be a traced array (e.g. in a
      vmapped sweep), which is not checked.

  Raises:
    TypeError: if a concrete `q` is not a real number (e.g. a string, None or
      a bool).
    ValueError: if a concrete `q` is not a scalar in (0, 1].
  """
  if not isinstance(q, jax.core.Tracer):
    qa = None if isinstance(q, (str, bytes)) else np.asarray(q)
    if qa is None or qa.dtype.kind not in "iuf":
      raise TypeError(
          f"`q` must be a real number in (0, 1], got {type(q).__name__} "
          f"{q!r}.")
    if qa.ndim != 0 or not np.isfinite(qa) or not 0.0 < float(qa) <= 1.0:
      raise ValueError(f"`q` must be a scalar in (0, 1], got {q!r}.")
  return QuantileRadius(q)


def check_radius(radius, num_centers: int, num_points: int = 4):
  """Raises unless `radius` fits `num_centers` centres.

  A radius is a rule (callable), a non-negative scalar or a `[K]` array; traced
  arrays are checked for shape only. A rule other than `QuantileRadius` is
  traced once with `jax.eval_shape` on `num_points` distances (nothing runs)
  to check that it returns one real scalar.

  Raises:
    TypeError: if `radius` is not a number, an array or a callable, or a rule
      fails or does not return a real array.
    ValueError: if a concrete radius is negative or NaN, or has a wrong shape,
      or a rule does not return a scalar.
  """
  if callable(radius):
    if not isinstance(radius, QuantileRadius):
      _check_rule(radius, num_points)
    return
  if isinstance(radius, jax.core.Tracer):
    if radius.ndim not in (0, 1) or (radius.ndim == 1 and
                                     radius.shape[0] != num_centers):
      raise ValueError(
          f"`radius` must be a scalar or have shape [{num_centers}], got "
          f"shape {radius.shape}.")
    return
  try:
    r = np.asarray(radius, dtype=np.float64)
  except (TypeError, ValueError):
    raise TypeError(
        "`radius` must be a number, an array [K] or a rule such as "
        f"quantile_radius(q), got {type(radius).__name__} {radius!r}."
    ) from None
  if r.ndim not in (0, 1) or (r.ndim == 1 and r.shape[0] != num_centers):
    raise ValueError(
        f"`radius` must be a scalar, an array of shape [{num_centers}] (one "
        f"per centre) or a rule such as quantile_radius(q); got shape "
        f"{r.shape}.")
  if np.any(np.isnan(r)) or np.any(r < 0):
    raise ValueError(f"`radius` must be non-negative, got {radius!r}.")


def _check_rule(rule, num_points: int):
  """Checks that `rule(distances [N], present [N])` traces to a real scalar.

  Raises:
    TypeError: if the rule fails when traced or returns no real array.
    ValueError: if it returns an array that is not a scalar.
  """
  distances = jax.ShapeDtypeStruct((num_points,), jnp.float32)
  present = jax.ShapeDtypeStruct((num_points,), jnp.bool_)
  try:
    out = jax.eval_shape(rule, distances, present)
  except Exception as e:  # pylint: disable=broad-except
    raise TypeError(
        f"radius rule {rule!r} failed on `(distances [{num_points}] float32, "
        f"present [{num_points}] bool)`: {type(e).__name__}: {e}") from e
  if not isinstance(out, jax.ShapeDtypeStruct) or not (
      jnp.issubdtype(out.dtype, jnp.floating) or
      jnp.issubdtype(out.dtype, jnp.integer)):
    raise TypeError(
        f"radius rule {rule!r} must return one real scalar (the radius of "
        f"one centre) from `(distances [N], present [N])`; it returned "
        f"{out}.")
  if out.shape != ():
    raise ValueError(
        f"radius rule {rule!r} must return a scalar (the radius of one "
        f"centre) from `(distances [N], present [N])`; it returned shape "
        f"{out.shape} for N={num_points}.")


def _radii(radius: Radius, distances: jax.Array,
           present: jax.Array) -> jax.Array:
  """`[K]` radii for `[K, N]` distances and `[K, N]` presence."""
  if callable(radius):
    return jax.vmap(radius)(distances, present)
  r = jnp.asarray(radius, distances.dtype)
  return jnp.broadcast_to(r, distances.shape[:1])


def _inside(d2: jax.Array, valid: jax.Array, present: jax.Array,
            radius: Radius):
  """Ball membership `[K, N]` and radii `[K]` from squared distances `[K, N]`.

  `valid` `[K, N]` marks usable points (`tree.usable`); `present` `[N]` the
  points with positive weight. A point that is not valid or whose distance
  is not finite (it overflowed) counts as infinitely far in a radius rule
  (e.g. the quantile) and is never inside, even for `radius=inf`: both
  kernels read "finite" this one way.
  """
  dist = jnp.sqrt(jnp.maximum(d2, 0.0))
  finite = jnp.isfinite(dist) & valid
  dist = jnp.where(finite, dist, jnp.inf)
  present = jnp.broadcast_to(present, dist.shape)
  tau = _radii(radius, dist, present)
  inside = finite & present & (dist <= tau[:, None])
  return inside, tau
