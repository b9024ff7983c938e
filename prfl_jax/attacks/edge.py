"""Attacks at the edge of Threshold-Clustering's ball (Werner et al., 2023,
Section 3.1.1, threat model): one tied point per cluster, or several that
spread out (the adaptive attack on Federated-Clustering)."""

import math
import numbers

import jax
import jax.numpy as jnp

from prfl_jax import clustering
from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.attacks import base

Attack = base.Attack


def edge_radius(radius, distances: jax.Array, benign: jax.Array) -> jax.Array:
  """Largest distance from a centre at which Byzantine points stay inside.

  Args:
    radius: the defender's radius: a scalar (returned as is) or a
      `clustering.QuantileRadius`.
    distances: `[K, N]` distances from K centres to the N messages.
    benign: `[N]` bool; the other rows are the (co-located) Byzantine ones.

  Returns:
    `[K]` radii. For `quantile_radius(q)` over the N rows the radius is
    the `l`-th smallest (0-based) benign distance, `l = floor(q (N - 1))`:
    with every Byzantine point at that distance at most `l` points lie
    strictly closer, so the q-quantile of all N distances (Byzantine ones
    included, linear interpolation) is at least that distance and the
    Byzantine points are inside the ball; at any larger distance `l + 1`
    benign points are closer, the quantile falls below it and they are
    outside. If the benign rows are too few to reach rank `l`, the largest
    benign distance is used. Byzantine rows at other places (other
    clusters' edges) are assumed outside the ball, i.e. farther than that
    benign point, which holds when clusters are farther apart than the
    radius.
  """
  if not isinstance(radius, clustering.QuantileRadius):
    return jnp.broadcast_to(jnp.asarray(radius, distances.dtype),
                            distances.shape[:1])
  n = benign.shape[0]
  rank = jnp.floor(radius.q * (n - 1)).astype(jnp.int32)
  rank = jnp.minimum(rank, jnp.sum(benign) - 1)
  ordered = jnp.sort(jnp.where(benign[None, :], distances, jnp.inf), axis=1)
  return jnp.take_along_axis(ordered, jnp.broadcast_to(
      rank, distances.shape[:1])[:, None], axis=1)[:, 0]


def threshold_edge(radius, *, num_iters: int = 10, margin: float = 0.05,
                   direction: str = "against",
                   method: str = "direct") -> Attack:
  """The worst case for Threshold-Clustering: points just inside the ball.

  Werner et al. (2023, Section 3.1.1, threat model): a bad point has the most
  influence on a cluster-centre estimate when it sits just inside the ball
  around that estimate, at distance `tau` from it; the bad points then add
  an error of order `beta_i * tau^2 ~ beta_i sigma Delta` (Theorem 1). Each
  Byzantine client j here:

  1. estimates its own cluster's centre `v_j` the way the defender would:
     Threshold-Clustering of the benign messages (Byzantine rows weight 0)
     started at j's honest message, with the defender's `radius` and
     `num_iters`;
  2. takes the edge radius `r_j` at `v_j` (`edge_radius`: the defender's
     scalar radius, or for `quantile_radius(q)` the largest distance at
     which the Byzantine points are still inside the q-quantile ball);
  3. sends `v_j + (1 - margin) * r_j * u_j`.

  The direction `u_j` is consistent from round to round: `"against"` is
  `-v_j / ||v_j||` (the estimate is shrunk or reversed, as a gradient this
  stalls descent); `"fixed"` is the all-ones unit vector (a constant bias
  on the model). A zero estimate falls back to the all-ones direction.

  In Federated-Clustering the attack runs once per model i on the gradients
  `g_j(x_i)`, so the Byzantine clients of i's own cluster target i's
  estimate, and those of other clusters sit at the edge of their own
  cluster's ball, far from i's. Messages are pytrees; distances are over the
  flattened pytree.

  Args:
    radius: the defender's radius: a non-negative scalar or
      `prfl_jax.quantile_radius(q)`.
    num_iters: the defender's Threshold-Clustering steps (>= 1).
    margin: in [0, 1): the points sit at `(1 - margin) * r` from the estimate.
    direction: `"against"` or `"fixed"`.
    method: how step 1 clusters. `"direct"` runs
      `clustering.threshold_clustering` from the N starts, `O(N^2 P)` per
      step for P coordinates. `"gram"` runs
      `clustering.cluster_and_assign(..., method="gram")`, which reads every
      step's distances off one `[N, N]` Gram matrix: `O(N^2 P)` once. The
      estimates are the same in exact arithmetic; the Gram's distances come
      by cancellation, so in float32 they can differ by about
      `eps ||g||^2`, and a point within that of the ball's edge can fall
      on the other side. Use `"gram"` for large models.

  Raises:
    ValueError: on a bad radius, `num_iters`, `margin`, `direction` or
      `method`.
    TypeError: if `radius` is a rule other than `quantile_radius`.
  """
  return _edge_attack(radius, num_iters, margin, direction, 0.0, method)


def _tilt(unit, angle: float, key: jax.Array):
  """Each row's unit vector turned by `angle` towards its own random
  direction orthogonal to it: `cos(a) u_j + sin(a) w_j`."""
  leaves, treedef = jax.tree.flatten(unit)
  keys = jax.random.split(key, len(leaves))
  noise = jax.tree.unflatten(treedef, [
      jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])
  dots = sum(jnp.sum((n * u).reshape(n.shape[0], -1), axis=1)
             for n, u in zip(jax.tree.leaves(noise), leaves))
  expand = lambda c, x: c.reshape((-1,) + (1,) * (x.ndim - 1))
  ortho = jax.tree.map(lambda n, u: n - expand(dots, u) * u, noise, unit)
  norm = jnp.sqrt(tree_lib.sq_norms(ortho))
  return jax.tree.map(
      lambda u, o: math.cos(angle) * u + math.sin(angle) * o / expand(
          jnp.maximum(norm, 1e-30), o), unit, ortho)


def spread_edge(radius, *, num_iters: int = 10, margin: float = 0.05,
                direction: str = "against", angle: float = 0.5,
                method: str = "direct") -> Attack:
  """The adaptive attack on Federated-Clustering: `threshold_edge` spread out.

  Every Byzantine client sits, like in `threshold_edge`, at distance
  `(1 - margin) r_j` from its cluster's estimate `v_j` (just inside the
  defender's quantile ball, whose radius it knows), but instead of the
  common direction `u_j` each turns it by `angle` (radians) towards its own
  random direction orthogonal to `u_j` (fresh each round, from `key`):
  `v_j + (1 - margin) r_j (cos(a) u_j + sin(a) w_j)`. The Byzantine points
  of one cluster are then about `sqrt(2) sin(a) (1 - margin) r` apart, no
  longer tied, so a defence that merges near-identical messages
  (`aggregators.cap_duplicates`) counts each of them, while their mean
  still pulls along `u_j` with `cos(a)` of the full strength.

  Args:
    radius, num_iters, margin, direction, method: as in `threshold_edge`.
    angle: in [0, pi/2]; 0 is `threshold_edge` (with key-independent rows).

  Raises:
    ValueError / TypeError: as `threshold_edge`, or on a bad `angle`.
  """
  return _edge_attack(radius, num_iters, margin, direction, angle, method)


def _edge_attack(radius, num_iters: int, margin: float, direction: str,
                 angle: float, method: str) -> Attack:
  """`threshold_edge` (angle 0) and `spread_edge`."""
  if callable(radius) and not isinstance(radius, clustering.QuantileRadius):
    raise TypeError(
        "`radius` must be a scalar or prfl_jax.quantile_radius(q): the attack "
        f"needs to know where the ball's edge is; got {type(radius)}.")
  clustering.check_radius(radius, 1)
  validation.check_positive_int(num_iters, "num_iters")
  if (isinstance(margin, bool) or not isinstance(margin, numbers.Real) or
      not math.isfinite(margin) or not 0 <= margin < 1):
    raise ValueError(f"`margin` must be in [0, 1), got {margin!r}.")
  if direction not in ("against", "fixed"):
    raise ValueError(
        f"`direction` must be 'against' or 'fixed', got {direction!r}.")
  if (isinstance(angle, bool) or not isinstance(angle, numbers.Real) or
      not 0 <= angle <= math.pi / 2):
    raise ValueError(f"`angle` must be in [0, pi/2], got {angle!r}.")
  clustering.check_method(method)

  def estimate(messages, weights):
    """Threshold-Clustering started at every message: `[N, ...]`."""
    if method == "direct":
      return clustering.threshold_clustering(
          messages, messages, radius=radius, num_iters=num_iters,
          weights=weights)
    return clustering.cluster_and_assign(
        messages, messages, radius=radius, num_iters=num_iters,
        weights=weights, method="gram")[0]

  def sq_distances(messages, estimates):
    """`[N, N]` `||z_i - v_k||^2`; under `"gram"` by matmuls, without the
    `[N, N, P]` differences (`||z||^2 - 2 <z, v> + ||v||^2`)."""
    if method == "direct":
      return tree_lib.sq_distances(messages, estimates)
    d2 = (tree_lib.sq_norms(messages)[:, None] -
          2.0 * tree_lib.inner_products(messages, estimates) +
          tree_lib.sq_norms(estimates)[None, :])
    return jnp.maximum(d2, 0.0)

  def attack(messages, byzantine, key):
    benign = ~byzantine
    estimates = estimate(messages, benign.astype(jnp.float32))  # [N, ...]
    dist = jnp.sqrt(sq_distances(messages, estimates)).T  # [N, N]
    r = edge_radius(radius, dist, benign)  # [N]
    norm = jnp.sqrt(tree_lib.sq_norms(estimates))
    size = sum(x[0].size for x in jax.tree.leaves(messages))
    ones = 1.0 / math.sqrt(size)
    if direction == "against":
      coef = jnp.where(norm > 0, -1.0 / jnp.where(norm > 0, norm, 1.0), 0.0)
      unit = jax.tree.map(
          lambda v: jnp.where(
              (norm > 0).reshape((-1,) + (1,) * (v.ndim - 1)),
              coef.reshape((-1,) + (1,) * (v.ndim - 1)) * v, ones), estimates)
    else:
      unit = jax.tree.map(lambda v: jnp.full_like(v, ones), estimates)
    if angle > 0:
      unit = _tilt(unit, angle, key)
    step = (1.0 - margin) * r
    bad = jax.tree.map(
        lambda v, u: v + step.reshape((-1,) + (1,) * (v.ndim - 1)) * u,
        estimates, unit)
    return base.replace(messages, byzantine, bad)
  return attack
