"""Byzantine attacks: what malicious clients send instead of honest messages.

An attack is a pure function

  attack(messages, byzantine, key) -> messages

where `messages` is a pytree whose leaves are `[N, ...]` (the honest message
every client would send: a gradient in Federated-Clustering, a momentum in
Momentum-Clustering), `byzantine` is the `[N]` bool mask of malicious clients
and `key` a PRNG key. Rows of benign clients are returned unchanged; attacks
may use every honest message (omniscient attacker, Werner et al., 2023,
Section 5.4). Statistics are taken over benign clients only.

References:
  Baruch et al., 2019 (ALIE); Xie et al., 2020 (IPM); Karimireddy et al., 2022
  (mimic); Werner et al., 2023, Section 5.4 (large gradients, bit flipping),
  Section 3.1.1 (threat model of Threshold-Clustering: `threshold_edge`).
"""

import math
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.scipy import stats

from prfl_jax import clustering
from prfl_jax import tree as tree_lib
from prfl_jax import validation

PyTree = Any
Attack = Callable[[PyTree, jax.Array, jax.Array], PyTree]


def _replace(messages: PyTree, byzantine: jax.Array, bad: PyTree) -> PyTree:
  """Rows of `bad` (leaves `[N, ...]` or `[...]`) where `byzantine`."""
  bad = jax.tree.map(lambda b, m: jnp.broadcast_to(b, m.shape).astype(m.dtype),
                     bad, messages)
  return tree_lib.where(byzantine, bad, messages)


def _benign_stats(messages: PyTree, byzantine: jax.Array):
  """Coordinate-wise mean and std over benign clients (leaves `[...]`)."""
  w = (~byzantine).astype(jnp.float32)
  mean = tree_lib.weighted_mean(messages, w)
  var = tree_lib.weighted_mean(
      jax.tree.map(lambda m, mu: jnp.square(m - mu[None]), messages, mean), w)
  return mean, jax.tree.map(jnp.sqrt, var)


def none() -> Attack:
  """No attack: Byzantine clients behave honestly."""
  def attack(messages, byzantine, key):
    del byzantine, key  # Unused.
    return messages
  return attack


def gaussian(scale: float = 100.0) -> Attack:
  """Byzantine clients send `N(0, scale^2 I)` noise."""
  def attack(messages, byzantine, key):
    leaves, treedef = jax.tree.flatten(messages)
    keys = jax.random.split(key, len(leaves))
    noise = [scale * jax.random.normal(k, x.shape, x.dtype)
             for k, x in zip(keys, leaves)]
    return _replace(messages, byzantine, jax.tree.unflatten(treedef, noise))
  return attack


def large(scale: float = 1e4) -> Attack:
  """Large-gradient attack: `scale` times the client's honest message."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    return _replace(messages, byzantine,
                    jax.tree.map(lambda m: scale * m, messages))
  return attack


def bit_flip() -> Attack:
  """Bit-flipping (sign-flipping) attack: the negated honest message."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    return _replace(messages, byzantine, jax.tree.map(jnp.negative, messages))
  return attack


def alie(z: float | None = None) -> Attack:
  """A Little Is Enough: `mean - z * std` of the benign messages.

  Args:
    z: deviation in standard deviations. None uses Baruch et al.'s value
      `z = Phi^{-1}((N - s) / N)`, `s = floor(N/2 + 1) - f`, with `f` the
      number of Byzantine clients.
  """
  def attack(messages, byzantine, key):
    del key  # Unused.
    mean, std = _benign_stats(messages, byzantine)
    if z is None:
      n = byzantine.shape[0]
      f = jnp.sum(byzantine)
      s = jnp.floor(n / 2 + 1) - f
      zz = stats.norm.ppf(jnp.clip((n - s) / n, 1e-6, 1 - 1e-6))
    else:
      zz = z
    bad = jax.tree.map(lambda mu, sd: mu - zz * sd, mean, std)
    return _replace(messages, byzantine, bad)
  return attack


def ipm(epsilon: float = 0.1) -> Attack:
  """Inner-product manipulation: `-epsilon` times the benign mean."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    mean, _ = _benign_stats(messages, byzantine)
    return _replace(messages, byzantine,
                    jax.tree.map(lambda mu: -epsilon * mu, mean))
  return attack


def mimic() -> Attack:
  """Mimic: every Byzantine client copies the first benign client's message."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    target = jnp.argmax(~byzantine)
    return _replace(messages, byzantine,
                    jax.tree.map(lambda m: m[target], messages))
  return attack


def non_finite(value: float = float("nan")) -> Attack:
  """Byzantine clients send NaN (or +-Inf) messages."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    return _replace(messages, byzantine,
                    jax.tree.map(lambda m: jnp.full((), value, m.dtype),
                                 messages))
  return attack


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
                   direction: str = "against") -> Attack:
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

  Raises:
    ValueError: on a bad radius, `num_iters`, `margin` or `direction`.
    TypeError: if `radius` is a rule other than `quantile_radius`.
  """
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

  def attack(messages, byzantine, key):
    del key  # Unused.
    benign = ~byzantine
    estimates = clustering.threshold_clustering(
        messages, messages, radius=radius, num_iters=num_iters,
        weights=benign.astype(jnp.float32))  # [N, ...]: one per client.
    dist = jnp.sqrt(tree_lib.sq_distances(messages, estimates)).T  # [N, N]
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
    step = (1.0 - margin) * r
    bad = jax.tree.map(
        lambda v, u: v + step.reshape((-1,) + (1,) * (v.ndim - 1)) * u,
        estimates, unit)
    return _replace(messages, byzantine, bad)
  return attack


def flip_labels(labels: jax.Array, byzantine: jax.Array,
                num_classes: int) -> jax.Array:
  """Label-flipping data transform: `y -> num_classes - 1 - y` for Byzantine.

  Labels < 0 (padding, see `prfl_jax.data.federate`) stay as they are.

  Args:
    labels: `[N, M]` integer labels.
    byzantine: `[N]` bool mask.
    num_classes: number of classes.
  """
  flipped = jnp.where(labels >= 0, num_classes - 1 - labels, labels)
  return jnp.where(byzantine[:, None], flipped, labels)
