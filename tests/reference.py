"""Plain NumPy references used by the tests."""

import numpy as np


def threshold_clustering(points, init, radius, num_iters, weights=None,
                         quantile=None):
  """Algorithm 2 of Werner et al. (2023), one Python loop per step and centre.

  Args:
    points: [N, P] float64.
    init: [K, P].
    radius: scalar or [K] (ignored when `quantile` is given).
    num_iters: steps.
    weights: optional [N].
    quantile: q for the quantile radius rule.

  Returns:
    [K, P] centres.
  """
  return threshold_clustering_info(points, init, radius, num_iters, weights,
                                   quantile)[0]


def threshold_clustering_info(points, init, radius, num_iters, weights=None,
                              quantile=None):
  """`threshold_clustering` that also returns what its last step saw.

  Returns:
    `(centres [K, P], inside [K, N] bool, tau [K])`: the points inside each
    centre's ball at the last step and the radius that step used.
  """
  points = np.asarray(points, np.float64)
  v = np.array(init, np.float64)
  n, k = points.shape[0], v.shape[0]
  w = np.ones(n) if weights is None else np.asarray(weights, np.float64)
  total = w.sum()
  finite = np.all(np.isfinite(points), axis=1)
  radius = np.broadcast_to(np.asarray(radius if radius is not None else 0.0,
                                      np.float64), (k,))
  present = w > 0
  inside = np.zeros((k, n), bool)
  taus = np.zeros(k)
  for _ in range(num_iters):
    for c in range(k):
      d = np.full(n, np.inf)
      d[finite] = np.linalg.norm(points[finite] - v[c], axis=1)
      if quantile is not None:
        tau = quantile_linear(d[present], quantile)
      else:
        tau = radius[c]
      new = np.zeros_like(v[c])
      for i in range(n):
        inside[c, i] = present[i] and finite[i] and d[i] <= tau
        new += w[i] * (points[i] if inside[c, i] else v[c])
      v[c] = new / total
      taus[c] = tau
  return v, inside, taus


def quantile_linear(values, q):
  """`np.quantile(values, q)` (linear) where an infinite neighbour gives inf."""
  if values.size == 0:
    return 0.0
  ordered = np.sort(values)
  pos = q * (values.size - 1)
  lo, hi = int(np.floor(pos)), int(np.ceil(pos))
  if ordered[lo] == ordered[hi]:
    return ordered[lo]
  return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])


def combination_stats(coefs, own, rows, same, byzantine):
  """NumPy reference of `prfl_jax.diagnostics.weights.combination_stats`.

  One Python loop over the rows: normalise row i's weights (negatives and
  non-finite values to 0), then its effective count `1 / sum p^2` (0 for an
  all-zero row), own weight, purity and Byzantine weight; each averaged over
  the counted rows (0 if none).
  """
  coefs = np.asarray(coefs, np.float64)
  per_row = {"effective_count": [], "own_weight": [], "purity": [],
             "byzantine_weight": [], "same_available": []}
  for i in np.flatnonzero(rows):
    c = np.where(np.isfinite(coefs[i]) & (coefs[i] > 0), coefs[i], 0.0)
    p = c / c.sum() if c.sum() > 0 else c
    sq = float(np.sum(p * p))
    per_row["effective_count"].append(1.0 / sq if sq > 0 else 0.0)
    per_row["own_weight"].append(float(p[own[i]].sum()))
    per_row["purity"].append(float(p[same[i]].sum()))
    per_row["byzantine_weight"].append(float(p[byzantine[i]].sum()))
    per_row["same_available"].append(float(np.sum(same[i])))
  return {k: float(np.mean(v)) if v else 0.0 for k, v in per_row.items()}
