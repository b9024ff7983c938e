"""SignGuard (Xu et al., 2022): norm filtering and sign-statistics clustering."""

from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import validation
from prfl_jax.aggregators import base

PyTree = base.PyTree
Aggregator = base.Aggregator


def sign_features(flat: jax.Array) -> jax.Array:
  """`[N, 3]`: each row's shares of positive, zero and negative entries."""
  return jnp.stack([jnp.mean(flat > 0, axis=1), jnp.mean(flat == 0, axis=1),
                    jnp.mean(flat < 0, axis=1)], axis=1)


def largest_mean_shift_cluster(points: jax.Array, present: jax.Array,
                               quantile: float, num_iters: int) -> jax.Array:
  """`[N]` bool: the largest cluster of a flat-kernel mean shift.

  The bandwidth h is the mean, over present points, of the distance to the
  `floor(quantile * n)`-th nearest present point (scikit-learn's
  `estimate_bandwidth`); every point climbs `num_iters` times to the mean
  of the present points within h of it; points whose modes lie within h / 2
  of each other form a cluster, and the cluster of the mode with the most
  such points (ties: lower index) is returned.
  """
  n = points.shape[0]
  d = jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(
      points[:, None] - points[None]), axis=-1), 0.0))
  d = jnp.where(present[None, :], d, jnp.inf)
  count = jnp.sum(present)
  k = jnp.clip(jnp.floor(quantile * count).astype(jnp.int32), 1, count - 1)
  kth = jnp.take_along_axis(jnp.sort(d, axis=1), k[None, None] * jnp.ones(
      (n, 1), jnp.int32), axis=1)[:, 0]
  h = jnp.sum(jnp.where(present, kth, 0.0)) / jnp.maximum(count, 1)

  def climb(_, modes):
    near = (jnp.sum(jnp.square(modes[:, None] - points[None]), -1) <= h * h)
    near = near & present[None, :]
    w = near / jnp.maximum(jnp.sum(near, axis=1, keepdims=True), 1)
    return jnp.where(jnp.any(near, axis=1, keepdims=True), w @ points, modes)

  modes = lax.fori_loop(0, num_iters, climb, points)
  same = jnp.sum(jnp.square(modes[:, None] - modes[None]), -1) <= h * h / 4
  same = same & present[:, None] & present[None, :]
  size = jnp.sum(same, axis=1)
  return same[jnp.argmax(size)]


def signguard(*, low: float = 0.1, high: float = 3.0,
              coord_frac: float = 1.0, bandwidth_quantile: float = 0.5,
              num_iters: int = 50) -> Aggregator:
  """SignGuard (Xu, Huang, Tang, Qi and Tian, 2022, Algorithm 1).

  With M the median norm of the n present rows:

  1. norm filter: S1 = {i : low <= ||x_i|| / M <= high};
  2. sign clustering: on a random share `coord_frac` of the coordinates
     (all of them by default), every row's shares of positive, zero and
     negative entries are clustered by mean shift, S2 = the largest
     cluster (`largest_mean_shift_cluster`: the paper uses scikit-learn's
     MeanShift; this is the same flat-kernel climb, with the bandwidth
     scikit-learn would estimate);
  3. the aggregate is the weighted mean over S1 and S2 of the rows clipped
     to norm M, `x_i * min(1, M / ||x_i||)`.

  The norms are `base.row_norms` and the clip `base.clip_rows`: a finite
  row whose squared norm overflows (float32 entries ~1e19) or underflows
  keeps its norm, so M and the answer stay finite and right.

  Args:
    low, high: the norm filter's bounds (the paper: 0.1 and 3.0).
    coord_frac: share of coordinates the sign statistics look at, in
      (0, 1]; below 1 `agg` needs `key` (`agg(messages, weights, key=key)`).
    bandwidth_quantile: in (0, 1), for the bandwidth (see above).
    num_iters: mean-shift steps.

  Raises:
    ValueError: on bad arguments, or when `agg` is traced with
      `coord_frac < 1` and no key.

  References:
    Xu, Huang, Tang, Qi and Tian, 2022, "SignGuard: Byzantine-robust
    Federated Learning through Collaborative Malicious Gradient Filtering",
    ICDCS, Algorithm 1.
  """
  base.check_positive_float(low, "low")
  base.check_positive_float(high, "high")
  if low >= high:
    raise ValueError(f"`low`={low} must be below `high`={high}.")
  base.check_fraction(coord_frac, "coord_frac", 1e-9, 1.0 + 1e-9)
  base.check_fraction(bandwidth_quantile, "bandwidth_quantile", 1e-9, 1.0)
  validation.check_positive_int(num_iters, "num_iters")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None, *,
          key: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = base.prepare(messages, weights)
    flat = base.flatten(zeroed)
    if coord_frac < 1.0:
      if key is None:
        raise ValueError(
            f"SignGuard with `coord_frac`={coord_frac} < 1 draws random "
            "coordinates: call agg(messages, weights, key=key).")
      size = flat.shape[1]
      flat = flat[:, jax.random.choice(
          key, size, (max(1, int(coord_frac * size)),), replace=False)]
    norms = base.row_norms(zeroed)
    med = jnp.nanmedian(jnp.where(present, norms, jnp.nan))
    med = jnp.where(jnp.isnan(med), 0.0, med)
    ratio = norms / jnp.where(med > 0, med, 1.0)
    s1 = present & (ratio >= low) & (ratio <= high)
    s2 = largest_mean_shift_cluster(sign_features(flat), present,
                                    bandwidth_quantile, num_iters)
    return base.selected_mean(base.clip_rows(zeroed, med), weights, s1 & s2)
  return agg
