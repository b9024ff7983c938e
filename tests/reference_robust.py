"""Plain NumPy references of the robust aggregators and pre-aggregators.

Written from the papers' definitions with Python loops, in float64, on the
present rows only: `x` is `[n, P]`, `w` the `[n]` positive weights. The
tests drop absent and non-finite rows before calling them.
"""

import itertools

import numpy as np


def weighted_mean(x, w):
  return (w[:, None] * x).sum(0) / w.sum()


def weighted_median(values, w):
  """Mean of the lower and upper weighted medians of one column."""
  order = np.argsort(values, kind="stable")
  v, cum = values[order], np.cumsum(w[order])
  half = 0.5 * w.sum()
  lo, hi = v[np.argmax(cum >= half)], v[np.argmax(cum > half)]
  return lo if lo == hi else 0.5 * (lo + hi)


def mean_around_median(x, w, count):
  out = np.zeros(x.shape[1])
  for k in range(x.shape[1]):
    med = weighted_median(x[:, k], w)
    near = np.argsort(np.abs(x[:, k] - med), kind="stable")[:count]
    out[k] = weighted_mean(x[near, k:k + 1], w[near])[0]
  return out


def meamed(x, w, f):
  return mean_around_median(x, w, len(x) - f)


def krum_pick(x, f, candidates):
  """Index (into x) of Krum's choice among `candidates`."""
  m = len(candidates)
  k = max(m - f - 2, 1)
  scores = []
  for i in candidates:
    d2 = sorted(((x[i] - x[j]) ** 2).sum() for j in candidates if j != i)
    scores.append(sum(d2[:k]) if d2 else np.inf)
  return candidates[int(np.argmin(scores))]


def bulyan(x, w, f):
  remaining, chosen = list(range(len(x))), []
  for _ in range(len(x) - 2 * f):
    pick = krum_pick(x, f, remaining)
    chosen.append(pick)
    remaining.remove(pick)
  chosen = sorted(chosen)
  return mean_around_median(x[chosen], w[chosen], len(chosen) - 2 * f)


def _best_subset(x, w, f, cost):
  best, best_cost = None, np.inf
  for subset in itertools.combinations(range(len(x)), len(x) - f):
    c = cost(x[list(subset)], w[list(subset)])
    if c < best_cost:
      best, best_cost = list(subset), c
  return weighted_mean(x[best], w[best])


def mda(x, w, f):
  return _best_subset(x, w, f, lambda s, _: max(
      np.linalg.norm(a - b) for a in s for b in s))


def covariance(x, w):
  mu = weighted_mean(x, w)
  d = x - mu
  return (w[:, None, None] * d[:, :, None] * d[:, None, :]).sum(0) / w.sum()


def smea(x, w, f):
  return _best_subset(x, w, f,
                      lambda s, sw: np.linalg.eigvalsh(covariance(s, sw))[-1])


def nearest_means(x, w, count):
  out = np.zeros_like(x)
  for i in range(len(x)):
    near = np.argsort(np.linalg.norm(x - x[i], axis=1), kind="stable")[:count]
    out[i] = weighted_mean(x[near], w[near])
  return out


def monna(x, w, f, index):
  return nearest_means(x, w, len(x) - f)[index]


def caf(x, w, f):
  c = w.astype(np.float64).copy()
  stop = (1 - 2 * f / len(x)) * w.sum()
  best, best_lam = weighted_mean(x, w), np.inf
  while c.sum() > stop:
    mu = weighted_mean(x, c)
    values, vectors = np.linalg.eigh(covariance(x, c))
    if values[-1] <= 0:
      break
    if values[-1] < best_lam:
      best, best_lam = mu, values[-1]
    tau = ((x - mu) @ vectors[:, -1]) ** 2
    c = c * np.maximum(1 - tau / tau.max(), 0)
  return best


def dnc(x, w, f, filter_frac=1.0):
  mu = weighted_mean(x, w)
  values, vectors = np.linalg.eigh(covariance(x, w))
  score = ((x - mu) @ vectors[:, -1]) ** 2
  keep = np.argsort(score, kind="stable")[:len(x) - int(filter_frac * f)]
  return weighted_mean(x[keep], w[keep])


def signguard(x, w, low=0.1, high=3.0, quantile=0.5, iters=50):
  norms = np.linalg.norm(x, axis=1)
  med = np.median(norms)
  s1 = (norms / med >= low) & (norms / med <= high)
  feats = np.stack([(x > 0).mean(1), (x == 0).mean(1), (x < 0).mean(1)], 1)
  n = len(x)
  d = np.linalg.norm(feats[:, None] - feats[None], axis=-1)
  k = min(max(int(np.floor(quantile * n)), 1), n - 1)
  h = np.mean(np.sort(d, axis=1)[:, k])
  modes = feats.copy()
  for _ in range(iters):
    new = modes.copy()
    for i in range(n):
      near = np.linalg.norm(feats - modes[i], axis=1) <= h
      if near.any():
        new[i] = feats[near].mean(0)
    modes = new
  same = np.linalg.norm(modes[:, None] - modes[None], axis=-1) <= h / 2
  s2 = same[np.argmax(same.sum(1))]
  scale = np.minimum(1.0, med / norms)
  sel = s1 & s2
  return weighted_mean((x * scale[:, None])[sel], w[sel])


def nnm(x, w, f):
  return nearest_means(x, w, len(x) - f)


def bucket_means(x, w, order, s):
  """Buckets of s consecutive rows of x[order] (present rows only)."""
  x, w = x[order], w[order]
  rows, weights = [], []
  for start in range(0, len(x), s):
    rows.append(weighted_mean(x[start:start + s], w[start:start + s]))
    weights.append(w[start:start + s].mean())
  return np.array(rows), np.array(weights)


def clip(x, c):
  norms = np.linalg.norm(x, axis=1)
  return x * np.minimum(1.0, c / np.maximum(norms, 1e-300))[:, None]


def arc(x, f):
  n = len(x)
  k = (2 * f * (n - f)) // n
  norms = np.sort(np.linalg.norm(x, axis=1))
  return clip(x, norms[n - k - 1])
