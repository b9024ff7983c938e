"""Threshold-Clustering (Werner et al., 2023, Algorithm 2) and its radius rules.

Each centre `v_k` is moved, for `num_iters` steps, by eq. (t-c-update-rule):

  v_k <- (1/W) * sum_i w_i * ( z_i if ||z_i - v_k|| <= tau_k else v_k ),

with `w_i` the client weights (1 by default, 0 for absent or padding clients)
and `W = sum_i w_i`. A point whose distance is not finite (NaN/Inf from a broken
or malicious client) is outside every ball, so the output stays finite whenever
the initial centres are.

Two kernels compute the same thing:
* `"direct"`: distances from the points themselves, `O(K * N * P)` per step.
* `"gram"`: every centre stays `v_k = v0_k + sum_i a_ki (z_i - v0_k)`, so all
  distances follow from the `[N, N]` Gram matrix of `z_i - v0_k`; after one GEMM
  each step is `O(K * N^2)`, independent of the model size `P`.
  `threshold_clustering` computes one such Gram matrix per centre;
  `cluster_and_assign(..., method="gram")` needs only ONE Gram matrix of the
  points for the clustering and the assignment (and `farthest_first` can
  share it), which is what makes Myopic- and Momentum-Clustering cheap at
  large N * P.
"""

import functools
from typing import Any, Callable, NamedTuple, Union

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax import validation

PyTree = Any
RadiusRule = Callable[[jax.Array, jax.Array], jax.Array]
Radius = Union[float, jax.Array, RadiusRule]

_METHODS = ("direct", "gram")


def check_method(method) -> str:
  """Raises ValueError unless `method` is a Threshold-Clustering kernel name.

  Args:
    method: `"direct"` or `"gram"`.

  Returns:
    `method`.
  """
  if not isinstance(method, str) or method not in _METHODS:
    raise ValueError(f"`method` must be one of {_METHODS}, got {method!r}.")
  return method


def _check_gram(gram, num_points: int):
  """Raises ValueError unless `gram` is None or an `[N, N]` array."""
  if gram is not None and np.shape(gram) != (num_points, num_points):
    raise ValueError(
        f"`gram` must be the [{num_points}, {num_points}] Gram matrix "
        f"`tree.gram(points)`, got shape {np.shape(gram)}.")


# Up to this many points the quantile uses O(N^2) rank counting, which XLA runs
# much faster than a sort, notably under vmap (3x on a vmapped sweep on CPU).
RANK_QUANTILE_MAX_N = 512


def masked_quantile(values: jax.Array, present: jax.Array,
                    q: jax.Array) -> jax.Array:
  """`jnp.quantile(values[present], q)` (linear interpolation) under jit.

  NaN values count as +inf, and an infinite neighbour makes the result
  infinite. With no present value the result is 0.

  Args:
    values: `[N]` array.
    present: `[N]` bool mask of the values that take part.
    q: scalar in [0, 1].

  Returns:
    scalar.
  """
  values = jnp.where(jnp.isnan(values), jnp.inf, values)
  masked = jnp.where(present, values, jnp.inf)
  count = jnp.sum(present)
  pos = q * jnp.maximum(count - 1, 0).astype(values.dtype)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.ceil(pos).astype(jnp.int32)
  if values.shape[0] <= RANK_QUANTILE_MAX_N:
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


class ClusteringInfo(NamedTuple):
  """What the last clustering step saw."""
  inside: jax.Array  # [K, N] bool: point i inside centre k's ball at the end.
  radius: jax.Array  # [K] radius used at the last step.


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


def _check_num_iters(num_iters):
  validation.check_positive_int(num_iters, "num_iters")


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


def _float_dtype():
  """JAX's default float dtype (float64 under `jax_enable_x64`)."""
  return jax.dtypes.canonicalize_dtype(jnp.float64)


def as_float(tree: PyTree) -> PyTree:
  """Casts integer and bool leaves to the default float dtype (others kept).

  Integer points would otherwise round every centre update to integers.
  """
  def cast(x):
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(
        _float_dtype())
  return jax.tree.map(cast, tree)


def check_weights(weights, num_points: int) -> jax.Array:
  """Validates client weights and returns them as a float `[N]` array.

  Concrete weights must be finite and >= 0 (a negative or infinite weight
  would move a centre outside the points' hull, a NaN weight would make it
  NaN). Traced weights (under jit) cannot be checked: there a negative, NaN
  or infinite weight is treated as 0, i.e. that client is absent.

  Args:
    weights: `[N]` array (bool, integer or float), or None for all ones.
    num_points: N.

  Returns:
    `[N]` float array.

  Raises:
    TypeError: if `weights` is not numeric.
    ValueError: on a wrong shape or a negative, NaN or infinite entry.
  """
  if weights is None:
    return jnp.ones((num_points,), jnp.float32)
  if np.shape(weights) != (num_points,):
    raise ValueError(
        f"`weights` must have shape [{num_points}] (one per point), got "
        f"{np.shape(weights)}.")
  if not isinstance(weights, jax.core.Tracer):
    w = np.asarray(weights)
    if w.dtype.kind not in "biuf":
      raise TypeError(f"`weights` must be numeric, got dtype {w.dtype}.")
    bad = ~np.isfinite(w) | (w < 0) if w.dtype.kind == "f" else w < 0
    if np.any(bad):
      raise ValueError(
          "`weights` must be finite and >= 0 (0 marks an absent client); "
          f"entries {np.flatnonzero(bad)[:10].tolist()} are "
          f"{w[bad][:10].tolist()}" + (" ..." if bad.sum() > 10 else "") + ".")
  weights = as_float(weights)
  return jnp.where(jnp.isfinite(weights) & (weights > 0), weights, 0.0)


def _prepare(points, init_centers, radius, num_iters, weights, method):
  """Validates arguments; returns float (points, init_centers, weights [N])."""
  check_method(method)
  n = tree_lib.num_leading(points, "points")
  k = tree_lib.num_leading(init_centers, "init_centers")
  if n == 0:
    raise ValueError("`points` has N=0 points; Threshold-Clustering needs at "
                     "least one point.")
  if k == 0:
    raise ValueError("`init_centers` has K=0 centres; give at least one.")
  tree_lib.check_same_structure(points, init_centers, "points", "init_centers")
  if k > n:
    raise ValueError(
        f"`init_centers` has K={k} centres but `points` only N={n} points; "
        "K must be <= N.")
  _check_num_iters(num_iters)
  check_radius(radius, k, n)
  points, init_centers = as_float(points), as_float(init_centers)
  # Weights (and so the centre update's coefficients) in float32, or float64
  # for float64 points under x64: never below float32, never below the data.
  dtype = functools.reduce(jnp.promote_types,
                           [x.dtype for x in jax.tree.leaves(points)],
                           jnp.dtype(jnp.float32))
  return points, init_centers, check_weights(weights, n).astype(dtype)


class _DirectCarry(NamedTuple):
  centers: PyTree  # leaves [K, ...]
  inside: jax.Array  # [K, N] bool
  tau: jax.Array  # [K]


def _direct(points, init_centers, radius, num_iters, weights):
  """Direct kernel; returns (centers, ClusteringInfo)."""
  finite = tree_lib.usable(points)
  points = jax.tree.map(
      lambda z: jnp.where(
          finite.reshape((-1,) + (1,) * (z.ndim - 1)), z, jnp.zeros_like(z)),
      points)
  total = jnp.sum(weights)
  w_scaled = weights / jnp.where(total > 0, total, 1.0)
  k = tree_lib.num_leading(init_centers)
  n = weights.shape[0]
  # The radius has the distances' dtype (float64 points under x64 included).
  tau_dtype = jax.eval_shape(tree_lib.sq_distances, points,
                             init_centers).dtype

  def body(_, carry: _DirectCarry) -> _DirectCarry:
    d2 = tree_lib.sq_distances(points, carry.centers).T  # [K, N]
    inside, tau = _inside(d2, jnp.broadcast_to(finite, d2.shape),
                          weights > 0, radius)
    tau = tau.astype(tau_dtype)
    coefs = jnp.where(inside, w_scaled[None, :], 0.0)  # [K, N]
    keep = 1.0 - jnp.sum(coefs, axis=1)  # [K]
    moved = tree_lib.combine(coefs, points)
    centers = jax.tree.map(
        lambda m, v: m + keep.reshape((-1,) + (1,) * (v.ndim - 1)).astype(
            v.dtype) * v, moved, carry.centers)
    return _DirectCarry(centers, inside, tau)

  init = _DirectCarry(init_centers, jnp.zeros((k, n), bool),
                      jnp.zeros((k,), tau_dtype))
  out = lax.fori_loop(0, num_iters, body, init)
  return out.centers, ClusteringInfo(out.inside, out.tau)


class _GramCarry(NamedTuple):
  coefs: jax.Array  # [K, N]: v_k = v0_k + sum_i coefs[k, i] (z_i - v0_k)
  inside: jax.Array  # [K, N] bool
  tau: jax.Array  # [K]


def gram_clustering_coefs(grams: jax.Array, radius: Radius, num_iters: int,
                          weights: jax.Array):
  """Threshold-Clustering on centred Gram matrices.

  For centre k with initial value `v0_k`, let `y_ki = z_i - v0_k` and
  `grams[k] = [<y_ki, y_kj>]_{ij}`. Every iterate is `v_k = v0_k + sum_i a_ki
  y_ki`, and eq. (t-c-update-rule) becomes `a_k <- (1 - s_k) a_k + w * in_k / W`
  with `s_k = sum_i w_i in_ki / W`.

  Args:
    grams: `[K, N, N]` centred Gram matrices. A point that is not finite
      must have a non-finite diagonal entry (as a Gram matrix of it has); its
      row and column are ignored, whatever they hold.
    radius: scalar, `[K]`, or a radius rule.
    num_iters: number of clustering steps (>= 1).
    weights: `[N]` non-negative client weights.

  Returns:
    `(coefs [K, N], ClusteringInfo)`.
  """
  diag = jnp.diagonal(grams, axis1=1, axis2=2)  # [K, N]
  valid_kn = jnp.isfinite(diag)
  diag = jnp.where(valid_kn, diag, 0.0)
  grams = jnp.where(valid_kn[:, :, None] & valid_kn[:, None, :], grams, 0.0)
  total = jnp.sum(weights)
  w_scaled = weights / jnp.where(total > 0, total, 1.0)
  k, n = diag.shape

  def body(_, carry: _GramCarry) -> _GramCarry:
    ga = jnp.einsum("kij,kj->ki", grams, carry.coefs,
                    precision=lax.Precision.HIGHEST)
    aga = jnp.sum(carry.coefs * ga, axis=1, keepdims=True)
    d2 = diag - 2.0 * ga + aga
    inside, tau = _inside(d2, valid_kn, weights > 0, radius)
    step = jnp.where(inside, w_scaled[None, :], 0.0)
    keep = 1.0 - jnp.sum(step, axis=1, keepdims=True)
    return _GramCarry(keep * carry.coefs + step, inside, tau)

  init = _GramCarry(jnp.zeros((k, n), grams.dtype), jnp.zeros((k, n), bool),
                    jnp.zeros((k,), grams.dtype))
  out = lax.fori_loop(0, num_iters, body, init)
  return out.coefs, ClusteringInfo(out.inside, out.tau)


def threshold_clustering_with_info(points: PyTree, init_centers: PyTree, *,
                                   radius: Radius, num_iters: int = 10,
                                   weights=None, method: str = "direct"):
  """`threshold_clustering` that also returns a `ClusteringInfo`."""
  points, init_centers, weights = _prepare(points, init_centers, radius,
                                           num_iters, weights, method)
  if method == "direct":
    return _direct(points, init_centers, radius, num_iters, weights)
  # Unusable points (`tree.usable`) become NaN, so the Gram kernel's own
  # finiteness test (its diagonal) rejects exactly what `direct` rejects.
  usable = tree_lib.usable(points)
  points = jax.tree.map(lambda z: jnp.where(
      usable.reshape((-1,) + (1,) * (z.ndim - 1)), z, jnp.nan), points)
  # Centre k's points z_i - v0_k, their Gram matrices and finiteness.
  centred = jax.tree.map(lambda z, v: z[None] - v[:, None], points,
                         init_centers)  # [K, N, ...]
  grams = jax.vmap(tree_lib.gram)(centred)
  ok = jnp.isfinite(jnp.diagonal(grams, axis1=1, axis2=2))  # [K, N]
  coefs, info = gram_clustering_coefs(grams, radius, num_iters, weights)
  moved = jax.vmap(tree_lib.masked_combination)(coefs, centred, ok)
  return jax.tree.map(lambda v, m: v + m, init_centers, moved), info


def threshold_clustering(points: PyTree, init_centers: PyTree, *,
                         radius: Radius, num_iters: int = 10, weights=None,
                         method: str = "direct") -> PyTree:
  """Threshold-Clustering: robust estimates of K cluster centres.

  A point is *usable* iff its squared norm is finite in its dtype (so every
  coordinate is finite and nothing overflows: `tree.usable`); a point that is
  not usable, or whose distance to a centre overflows, is outside every ball
  (also for `radius=inf`) and counts as infinitely far in a radius rule. Both
  methods apply this one definition.

  Args:
    points: pytree, every leaf `[N, ...]` (e.g. N clients' gradients), N >= 1.
      Integer or bool leaves are cast to the default float dtype.
    init_centers: pytree of the same structure, every leaf `[K, ...]`,
      1 <= K <= N (cast like `points`).
    radius: the ball radius `tau`: a non-negative scalar, an array `[K]` (one
      per centre), or a rule `rule(distances [N], present [N]) -> tau` (one
      real scalar) such as `quantile_radius(q)`, evaluated for every centre at
      every step.
    num_iters: number of clustering steps `M` (>= 1).
    weights: optional `[N]` finite non-negative weights; 0 marks an absent
      client (e.g. padding), which never moves a centre nor counts in `W`.
      Concrete weights are checked; traced weights (under jit) cannot be, so
      there a negative, NaN or infinite weight counts as 0.
    method: `"direct"` or `"gram"` (same result, see the module docstring).

  Returns:
    pytree, every leaf `[K, ...]`: the centres `v_{k, M}`.

  Raises:
    ValueError: on N = 0 or K = 0, mismatched leading axes or leaf shapes,
      K > N, a negative or wrongly shaped radius (or a rule not returning a
      scalar), `num_iters < 1`, weights of
      the wrong shape or with a negative, NaN or infinite entry, or an
      unknown method.
    TypeError: on a radius that is neither a number, an array nor a rule, a
      rule that fails or returns no real array, or non-numeric weights.

  References:
    Werner et al., 2023, Algorithm 2 (Threshold-Clustering), eq.
    (t-c-update-rule).
  """
  centers, _ = threshold_clustering_with_info(
      points, init_centers, radius=radius, num_iters=num_iters,
      weights=weights, method=method)
  return centers


def farthest_first(points: PyTree, num_centers: int, key: jax.Array, *,
                   separation=0.0, gram=None) -> jax.Array:
  """Farthest-first traversal (Gonzalez, 1985): indices of K spread points.

  Only usable points (`tree.usable`) are chosen while there are any.

  Args:
    points: pytree, every leaf `[N, ...]`.
    num_centers: number of centres K, an integer with 1 <= K <= N (static).
    key: PRNG key choosing the first centre uniformly among usable points.
    separation: a new centre is opened only if the farthest point is more
      than `separation` (>= 0) away from every open centre; the unopened
      slots repeat the first centre's index.
    gram: optional `[N, N]` Gram matrix `tree.gram(points)`: the distances
      are then read off it (`G_ii - 2 G_ij + G_jj`, `O(K * N)` after the
      Gram) instead of computed from the points (`O(K * N * P)`), and a point
      is usable iff `G_ii` is finite. Pass the Gram that
      `cluster_and_assign(..., method="gram", gram=gram)` reuses.

  Returns:
    `[K]` int32 indices into the points.

  Raises:
    ValueError: if `num_centers` is not an integer in [1, N] (K > N would
      have to repeat points), a concrete `separation` is negative or NaN, or
      `gram` is not `[N, N]`.
  """
  n = tree_lib.num_leading(points, "points")
  validation.check_positive_int(num_centers, "num_centers")
  if num_centers > n:
    raise ValueError(
        f"`num_centers`={num_centers} exceeds the number of points N={n}; "
        "farthest-first picks K distinct points, so K must be <= N.")
  if not isinstance(separation, jax.core.Tracer):
    sep = np.asarray(separation, dtype=np.float64)
    if sep.ndim != 0 or np.isnan(sep) or sep < 0:
      raise ValueError(
          f"`separation` must be a scalar >= 0, got {separation!r}.")
  _check_gram(gram, n)
  points = as_float(points)
  if gram is None:
    finite = tree_lib.usable(points)
  else:
    diag = jnp.diagonal(gram)
    finite = jnp.isfinite(diag)
    diag = jnp.where(finite, diag, 0.0)
    gram = jnp.where(finite[:, None] & finite[None, :], gram, 0.0)
  start = jax.random.categorical(key, jnp.where(finite, 0.0, -jnp.inf))
  start = jnp.where(jnp.any(finite), start, 0).astype(jnp.int32)
  sep2 = jnp.square(jnp.asarray(separation, jnp.float32))

  def sq_dist_to(j):
    if gram is None:
      d2 = tree_lib.sq_distances(points, tree_lib.take(points, j[None]))[:, 0]
    else:
      d2 = jnp.maximum(diag - 2.0 * gram[:, j] + diag[j], 0.0)
    return jnp.where(finite, jnp.nan_to_num(d2, nan=jnp.inf), -jnp.inf)

  def body(k, carry):
    index, min_d2 = carry
    j = jnp.argmax(min_d2).astype(jnp.int32)
    opened = min_d2[j] > sep2
    index = index.at[k].set(jnp.where(opened, j, start))
    min_d2 = jnp.where(opened, jnp.minimum(min_d2, sq_dist_to(j)), min_d2)
    return index, min_d2

  index = jnp.full((num_centers,), start, jnp.int32)
  index, _ = lax.fori_loop(1, num_centers, body, (index, sq_dist_to(start)))
  return index


def assign(points: PyTree, centers: PyTree) -> jax.Array:
  """Index of the nearest centre for every point.

  Args:
    points: pytree, every leaf `[N, ...]`.
    centers: pytree of the same structure, every leaf `[K, ...]`.

  Returns:
    `[N]` int32; ties go to the lowest index, non-finite distances lose.
  """
  tree_lib.num_leading(points, "points")
  tree_lib.num_leading(centers, "centers")
  tree_lib.check_same_structure(points, centers, "points", "centers")
  d2 = tree_lib.sq_distances(points, centers)
  d2 = jnp.where(jnp.isfinite(d2), d2, jnp.inf)
  return jnp.argmin(d2, axis=1).astype(jnp.int32)


class _Shared(NamedTuple):
  """Everything the one-Gram kernel needs about N points and K centres v0."""
  gzz: jax.Array  # [N, N] <z_i, z_j>, 0 in rows/columns of unusable points.
  gzc: jax.Array  # [N, K] <z_i, v0_k>, 0 in rows of unusable points.
  zz: jax.Array  # [N] ||z_i||^2 (0 for unusable points).
  cc: jax.Array  # [K] ||v0_k||^2.
  valid: jax.Array  # [N] bool: usable points (finite ||z_i||^2).
  first: jax.Array  # [K] int32: lowest j with v0_j == v0_k exactly.


def _shared(points, init_centers, gram) -> _Shared:
  """One Gram matrix of the points (or `gram`) plus `O(N * K * P)` extras."""
  if gram is None:
    gram = tree_lib.gram(points)
  zz = jnp.diagonal(gram)
  valid = jnp.isfinite(zz)
  gzz = jnp.where(valid[:, None] & valid[None, :], gram, 0.0)
  gzc = sum(jnp.matmul(z.reshape(z.shape[0], -1), v.reshape(v.shape[0], -1).T,
                       precision=lax.Precision.HIGHEST)
            for z, v in zip(jax.tree.leaves(points),
                            jax.tree.leaves(init_centers)))
  gzc = jnp.where(valid[:, None], gzc, 0.0)
  # Repeated initial centres (e.g. farthest-first's unopened slots) follow
  # the same iterates and lose every tie in `assign`, exactly as in `direct`.
  equal = functools.reduce(jnp.logical_and, [
      jnp.all((v[:, None] == v[None, :]).reshape(v.shape[0], v.shape[0], -1),
              axis=-1) for v in jax.tree.leaves(init_centers)])
  k = equal.shape[0]
  equal = equal | jnp.eye(k, dtype=bool)
  first = jnp.argmax(equal, axis=1).astype(jnp.int32)
  return _Shared(gzz, gzc, jnp.where(valid, zz, 0.0),
                 tree_lib.sq_norms(init_centers), valid, first)


def _gram_sq_distances(sh: _Shared, a: jax.Array, b: jax.Array) -> jax.Array:
  """`[K, N]` `||z_i - c_k||^2` for centres `c_k = b_k v0_k + sum_i a_ki z_i`."""
  ga = jnp.matmul(a, sh.gzz, precision=lax.Precision.HIGHEST)  # [K, N]
  cross = ga + b[:, None] * sh.gzc.T  # <c_k, z_i>
  cc = (jnp.sum(a * ga, axis=1) + 2.0 * b * jnp.sum(a * sh.gzc.T, axis=1) +
        b * b * sh.cc)  # ||c_k||^2
  return sh.zz[None, :] - 2.0 * cross + cc[:, None]


def _gram_cluster_and_assign(points, init_centers, radius, num_iters,
                             weights, gram):
  """One-Gram kernel of `cluster_and_assign`; returns (centers, assignment)."""
  sh = _shared(points, init_centers, gram)
  dtype = weights.dtype
  total = jnp.sum(weights)
  w_scaled = weights / jnp.where(total > 0, total, 1.0)
  k, n = tree_lib.num_leading(init_centers), weights.shape[0]
  valid = jnp.broadcast_to(sh.valid, (k, n))

  def body(_, carry):
    a, b = carry
    inside, _ = _inside(_gram_sq_distances(sh, a, b), valid, weights > 0,
                        radius)
    step = jnp.where(inside, w_scaled[None, :], 0.0)
    keep = 1.0 - jnp.sum(step, axis=1)
    a, b = keep[:, None] * a + step, keep * b
    return a[sh.first], b[sh.first]

  a, b = lax.fori_loop(0, num_iters, body, (jnp.zeros((k, n), dtype),
                                            jnp.ones((k,), dtype)))
  d2 = _gram_sq_distances(sh, a, b).T  # [N, K]
  d2 = jnp.where(sh.valid[:, None] & (sh.first == jnp.arange(k))[None, :] &
                 jnp.isfinite(d2), d2, jnp.inf)
  assignment = jnp.argmin(d2, axis=1).astype(jnp.int32)
  moved = jax.vmap(tree_lib.masked_combination, in_axes=(0, None, None))(
      a, points, sh.valid)
  centers = jax.tree.map(
      lambda m, v: m + b.reshape((-1,) + (1,) * (v.ndim - 1)).astype(
          v.dtype) * v, moved, init_centers)
  return centers, assignment


def cluster_and_assign(points: PyTree, init_centers: PyTree, *,
                       radius: Radius, num_iters: int = 10, weights=None,
                       method: str = "direct", gram=None):
  """Threshold-Clustering, then every point's nearest centre.

  The server side of Myopic-Clustering and Momentum-Clustering.

  With `method="gram"` the whole call costs ONE Gram matrix of the points
  (`O(N^2 * P)`, or none when `gram` is given) plus `O(N * K * P)` for the
  inner products with the initial centres and the final centres: every
  iterate is `c_k = b_k v0_k + sum_i a_ki z_i`, so the distances of every
  Threshold-Clustering step and of the assignment,
  `||z_i - c_k||^2 = ||z_i||^2 - 2 <z_i, c_k> + ||c_k||^2`, follow from
  `G = [<z_i, z_j>]`, `<z_i, v0_k>` and `||v0_k||^2` in `O(K * N^2)`.
  `"direct"` costs `O(K * N * P)` per step instead. Both give the same
  result up to float rounding of the distances (the Gram kernel reads them
  off by cancellation, so a point within rounding of a ball's radius may
  fall on the other side).

  Args:
    points: pytree, every leaf `[N, ...]`.
    init_centers: pytree, every leaf `[K, ...]`.
    radius, num_iters, weights, method: as in `threshold_clustering`.
    gram: optional `[N, N]` `tree.gram(points)` already computed (e.g. for
      `farthest_first(..., gram=gram)`), only with `method="gram"`.

  Returns:
    `(centers, assignment, assigned)`: centres leaves `[K, ...]`, `[N]` int32
    nearest-centre indices (ties go to the lowest index), and each point's
    centre, leaves `[N, ...]`.

  Raises:
    ValueError: as `threshold_clustering`, or if `gram` is given with
      another method or is not `[N, N]`.
  """
  check_method(method)
  if gram is not None:
    if method != "gram":
      raise ValueError(
          f"`gram` is only used by method='gram', got method={method!r}.")
    _check_gram(gram, tree_lib.num_leading(points, "points"))
  if method == "direct":
    centers = threshold_clustering(points, init_centers, radius=radius,
                                   num_iters=num_iters, weights=weights,
                                   method=method)
    assignment = assign(points, centers)
  else:
    points, init_centers, weights = _prepare(points, init_centers, radius,
                                             num_iters, weights, method)
    centers, assignment = _gram_cluster_and_assign(
        points, init_centers, radius, num_iters, weights, gram)
  return centers, assignment, tree_lib.take(centers, assignment)


__all__ = [
    "ClusteringInfo", "QuantileRadius", "assign", "check_method",
    "cluster_and_assign",
    "farthest_first", "masked_quantile",
    "quantile_radius", "threshold_clustering",
    "threshold_clustering_with_info",
]
