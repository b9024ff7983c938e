"""K-centre assignment: farthest-first seeding and nearest-centre assignment.

`farthest_first` spreads K initial centres over the points; `assign` sends
every point to its nearest centre; `cluster_and_assign` runs
Threshold-Clustering (Werner et al., 2023, Algorithm 2) and then the
assignment, with one Gram matrix of the points for both under
`method="gram"`: the server side of Myopic- and Momentum-Clustering.
"""

import functools
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.clustering.radius import _inside
from prfl_jax.clustering.radius import Radius
from prfl_jax.clustering.threshold import _prepare
from prfl_jax.clustering.threshold import as_float
from prfl_jax.clustering.threshold import check_method
from prfl_jax.clustering.threshold import ClusteringInfo
from prfl_jax.clustering.threshold import threshold_clustering_with_info

PyTree = Any

def _check_gram(gram, num_points: int):
  """Raises ValueError unless `gram` is None or an `[N, N]` array."""
  if gram is not None and np.shape(gram) != (num_points, num_points):
    raise ValueError(
        f"`gram` must be the [{num_points}, {num_points}] Gram matrix "
        f"`tree.gram(points)`, got shape {np.shape(gram)}.")


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
  gzc = jnp.where(valid[:, None],
                  tree_lib.inner_products(points, init_centers), 0.0)
  return _Shared(gzz, gzc, jnp.where(valid, zz, 0.0),
                 tree_lib.sq_norms(init_centers), valid,
                 _first_equal(init_centers))


def _first_equal(init_centers) -> jax.Array:
  """`[K]` int32: the lowest j with `v0_j == v0_k` exactly.

  Repeated initial centres (e.g. farthest-first's unopened slots) follow
  the same iterates and lose every tie in `assign`, exactly as in `direct`.
  """
  equal = functools.reduce(jnp.logical_and, [
      jnp.all((v[:, None] == v[None, :]).reshape(v.shape[0], v.shape[0], -1),
              axis=-1) for v in jax.tree.leaves(init_centers)])
  equal = equal | jnp.eye(equal.shape[0], dtype=bool)
  return jnp.argmax(equal, axis=1).astype(jnp.int32)


def _gram_sq_distances(sh: _Shared, a: jax.Array, b: jax.Array) -> jax.Array:
  """`[K, N]` `||z_i - c_k||^2` for centres `c_k = b_k v0_k + sum_i a_ki z_i`."""
  ga = jnp.matmul(a, sh.gzz, precision=lax.Precision.HIGHEST)  # [K, N]
  cross = ga + b[:, None] * sh.gzc.T  # <c_k, z_i>
  cc = (jnp.sum(a * ga, axis=1) + 2.0 * b * jnp.sum(a * sh.gzc.T, axis=1) +
        b * b * sh.cc)  # ||c_k||^2
  return sh.zz[None, :] - 2.0 * cross + cc[:, None]


_BALLS = ("all", "assigned")


def check_balls(balls) -> str:
  """Raises ValueError unless `balls` is `"all"` or `"assigned"`."""
  if not isinstance(balls, str) or balls not in _BALLS:
    raise ValueError(f"`balls` must be one of {_BALLS}, got {balls!r}.")
  return balls


def _combination_cluster_and_assign(points, init_centers, radius, num_iters,
                                    weights, gram, method, balls, members,
                                    sticky):
  """Clustering on centres `c_k = b_k v0_k + sum_i a_ki z_i`.

  `method="gram"` reads every distance off one Gram matrix; `"direct"`
  materialises the centres at each step. Returns (centers, assignment, info).
  """
  k, n = tree_lib.num_leading(init_centers), weights.shape[0]
  if method == "gram":
    sh = _shared(points, init_centers, gram)
    valid, first = sh.valid, sh.first
    sq_dist = functools.partial(_gram_sq_distances, sh)
  else:
    valid, first = tree_lib.usable(points), _first_equal(init_centers)
    points = tree_lib.where(valid, points, jax.tree.map(jnp.zeros_like,
                                                        points))

    def sq_dist(a, b):
      centers = jax.tree.map(
          lambda m, v: m + b.reshape((-1,) + (1,) * (v.ndim - 1)).astype(
              v.dtype) * v, tree_lib.combine(a, points), init_centers)
      return tree_lib.sq_distances(points, centers).T
  if members is not None:
    # A centre with members of its own follows them, so centres that start
    # equal part as soon as their members differ; a repeated start without
    # members still follows the first one's iterates.
    owns = jnp.any(members[None, :] == jnp.arange(k)[:, None], axis=1)
    first = jnp.where(owns, jnp.arange(k, dtype=jnp.int32), first)
  valid_kn = jnp.broadcast_to(valid, (k, n))
  dtype = weights.dtype

  def nearest(d2):
    d2 = jnp.where(valid_kn & (first == jnp.arange(k))[:, None] &
                   jnp.isfinite(d2), d2, jnp.inf)
    return jnp.argmin(d2, axis=0).astype(jnp.int32)

  def body(_, carry):
    a, b, _, _ = carry
    d2 = sq_dist(a, b)
    if balls == "assigned":  # Each centre's ball over its own members.
      own = nearest(d2)
      if members is not None:
        own = jnp.where(members >= 0, members, own)
      member = jax.nn.one_hot(own, k, dtype=dtype).T * jnp.where(
          valid, weights, 0.0)[None, :]
    else:
      member = jnp.broadcast_to(weights, (k, n))
    total = jnp.sum(member, axis=1, keepdims=True)
    inside, tau = _inside(d2, valid_kn, member > 0, radius)
    step = jnp.where(inside, member / jnp.where(total > 0, total, 1.0), 0.0)
    keep = 1.0 - jnp.sum(step, axis=1)
    a, b = keep[:, None] * a + step, keep * b
    return a[first], b[first], inside, tau.astype(dtype)

  a, b, inside, tau = lax.fori_loop(
      0, num_iters, body, (jnp.zeros((k, n), dtype), jnp.ones((k,), dtype),
                           jnp.zeros((k, n), bool), jnp.zeros((k,), dtype)))
  d2 = sq_dist(a, b)
  assignment = nearest(d2)
  if sticky:  # Inside its centre's final ball: a point stays.
    own = jnp.maximum(members, 0)
    dist = jnp.sqrt(jnp.maximum(d2[own, jnp.arange(n)], 0.0))
    stay = (members >= 0) & valid & (dist <= tau[own])
    assignment = jnp.where(stay, own, assignment).astype(jnp.int32)
  moved = jax.vmap(tree_lib.masked_combination, in_axes=(0, None, None))(
      a, points, valid)
  centers = jax.tree.map(
      lambda m, v: m + b.reshape((-1,) + (1,) * (v.ndim - 1)).astype(
          v.dtype) * v, moved, init_centers)
  return centers, assignment, ClusteringInfo(inside, tau, a)


def cluster_and_assign_with_info(points: PyTree, init_centers: PyTree, *,
                                 radius: Radius, num_iters: int = 10,
                                 weights=None, method: str = "direct",
                                 gram=None, balls: str = "all",
                                 members=None, sticky: bool = False):
  """`cluster_and_assign` that also returns the last step's `ClusteringInfo`.

  `info.coefs[k, i]` is the weight of point i in centre k; the initial
  centre keeps `1 - sum_i info.coefs[k, i]`.
  """
  check_method(method)
  check_balls(balls)
  if members is not None:
    if balls != "assigned":
      raise ValueError("`members` is only used with balls='assigned'.")
    n = tree_lib.num_leading(points, "points")
    if np.shape(members) != (n,):
      raise ValueError(f"`members` must have shape [{n}] (a centre per "
                       f"point), got {np.shape(members)}.")
  if sticky and members is None:
    raise ValueError("`sticky` needs `members` (the centres points stay "
                     "with).")
  if gram is not None:
    if method != "gram":
      raise ValueError(
          f"`gram` is only used by method='gram', got method={method!r}.")
    _check_gram(gram, tree_lib.num_leading(points, "points"))
  if method == "direct" and balls == "all":
    centers, info = threshold_clustering_with_info(
        points, init_centers, radius=radius, num_iters=num_iters,
        weights=weights, method=method)
    assignment = assign(points, centers)
  else:
    points, init_centers, weights = _prepare(points, init_centers, radius,
                                             num_iters, weights, method)
    centers, assignment, info = _combination_cluster_and_assign(
        points, init_centers, radius, num_iters, weights, gram, method, balls,
        members, sticky)
  return centers, assignment, tree_lib.take(centers, assignment), info


def cluster_and_assign(points: PyTree, init_centers: PyTree, *,
                       radius: Radius, num_iters: int = 10, weights=None,
                       method: str = "direct", gram=None,
                       balls: str = "all", members=None,
                       sticky: bool = False):
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

  `balls="all"` is Algorithm 2 as written: every centre's ball, radius rule
  and average run over all N points, so the balls do not compete and
  centres whose balls overlap are pulled to the same points.
  `balls="assigned"` (beyond the paper) gives each centre, at every step,
  only the points nearest to it: its radius rule (e.g. the quantile) and
  its average `1/W_k sum_{i nearest to k} (...)` run over those, as in a
  trimmed k-means; a centre without points stays where it is, and an
  unusable point belongs to no centre. Repeated initial centres then get
  no points (ties go to the lowest index). With `members` (e.g. the last
  round's assignment) each centre keeps those points for all the steps
  instead (also centres that start equal: each follows its own members;
  a repeated start that has none follows the first, as above),
  so the centres follow their points wherever they moved, and only
  the final assignment changes membership; with `sticky=True` a point
  inside its member centre's final ball (the last step's radius) stays
  with it, and only the others go to their nearest centre.

  Args:
    points: pytree, every leaf `[N, ...]`.
    init_centers: pytree, every leaf `[K, ...]`.
    radius, num_iters, weights, method: as in `threshold_clustering`.
    gram: optional `[N, N]` `tree.gram(points)` already computed (e.g. for
      `farthest_first(..., gram=gram)`), only with `method="gram"`.
    balls: `"all"` or `"assigned"` (see above).
    members: optional `[N]` int centre of every point during the steps, only
      with `balls="assigned"` (see above); a negative entry gives that point
      its nearest centre at every step.
    sticky: with `members`, keep points inside their centre's final ball.

  Returns:
    `(centers, assignment, assigned)`: centres leaves `[K, ...]`, `[N]` int32
    nearest-centre indices (ties go to the lowest index), and each point's
    centre, leaves `[N, ...]`.

  Raises:
    ValueError: as `threshold_clustering`, on an unknown `balls`, or if
      `gram` is given with another method or is not `[N, N]`.
  """
  centers, assignment, assigned, _ = cluster_and_assign_with_info(
      points, init_centers, radius=radius, num_iters=num_iters,
      weights=weights, method=method, gram=gram, balls=balls,
      members=members, sticky=sticky)
  return centers, assignment, assigned
