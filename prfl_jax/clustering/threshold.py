"""Threshold-Clustering (Werner et al., 2023, Algorithm 2).

Each centre `v_k` is moved, for `num_iters` steps, by eq. (t-c-update-rule):

  v_k <- (1/W) * sum_i w_i * ( z_i if ||z_i - v_k|| <= tau_k else v_k ),

with `w_i` the client weights (1 by default, 0 for absent or padding clients)
and `W = sum_i w_i`; the two kernels, `"direct"` and `"gram"`, are described
in the package docstring (`prfl_jax.clustering`).
"""

import functools
from typing import Any, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.clustering.radius import _inside
from prfl_jax.clustering.radius import check_radius
from prfl_jax.clustering.radius import Radius

PyTree = Any

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


class ClusteringInfo(NamedTuple):
  """What the last clustering step saw, and the centres' weights."""
  inside: jax.Array  # [K, N] bool: point i inside centre k's ball at the end.
  radius: jax.Array  # [K] radius used at the last step.
  # [K, N] weight a_ki of point i in centre k: v_k = (1 - sum_i a_ki) v0_k +
  # sum_i a_ki z_i (0 for unusable points; see `prfl_jax.diagnostics`).
  coefs: Optional[jax.Array] = None


def _check_num_iters(num_iters):
  validation.check_positive_int(num_iters, "num_iters")


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
  coefs: jax.Array  # [K, N] weights of the points in the centres.


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
    return _DirectCarry(centers, inside, tau,
                        keep[:, None] * carry.coefs + coefs)

  init = _DirectCarry(init_centers, jnp.zeros((k, n), bool),
                      jnp.zeros((k,), tau_dtype),
                      jnp.zeros((k, n), weights.dtype))
  out = lax.fori_loop(0, num_iters, body, init)
  return out.centers, ClusteringInfo(out.inside, out.tau, out.coefs)


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
    `(coefs [K, N], ClusteringInfo)`, in float32 at least: bfloat16 / float16
    Gram matrices are promoted (their 8-11 bit mantissas would round the
    coefficients of a few hundred clients away).
  """
  dtype = jnp.promote_types(grams.dtype, jnp.float32)
  grams, weights = grams.astype(dtype), jnp.asarray(weights).astype(dtype)
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
  return out.coefs, ClusteringInfo(out.inside, out.tau, out.coefs)


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
