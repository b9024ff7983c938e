"""Figure 7 and Theorem 1 of Werner et al. (2023): Threshold-Clustering alone.

Figure 7 ("Empirical study on clipping iterations"): 90 ten-dimensional points
in 10 clusters from scikit-learn's `make_blobs`, the same centres for every
`sigma` in {0.5, 1, 2, 4} (`cluster_std`, per coordinate), radius at the 10th
percentile of the distances to the current centre (`prfl.quantile_radius`),
10 repeats. Every point starts a centre at its own position (as
Federated-Clustering starts each model's centre at its own gradient; the proof
of Theorem 1 likewise assumes a start within sigma of the mean), and the plot
is the mean distance f(l) from each point's centre to its true cluster centre
after l = 0..T clipping iterations, with the paper's elbow ratio
g(l) = (f(l) - f(l-1)) / (f(l-1) - min_l f(l)). Since 1 + g(l) is the factor by
which step l shrinks the gap to the minimum, the remaining gap after l steps
is prod_{j <= l} (1 + g(j)); the elbow is the first l where it is at most
`--elbow-tol` (5%) of the initial gap.

Theorem 1: the squared error ||v_k - E z||^2 of Threshold-Clustering after
`--theorem-iters` steps against the bound sigma^2/n_i + sigma^3/Delta +
beta*sigma*Delta (sigma^2 = E||z - E z||^2, the total variance), sweeping
n_i, Delta, sigma and the Byzantine fraction beta around a base point. K
centres at pairwise distance exactly Delta, one centre per cluster started at
a random point of it; Byzantine points are placed against each centre either
just inside its ball, all in one direction, re-placed at every step ("edge",
the paper's threat model) or far away ("far"). Radius rules: the quantiles
in `--theorem-quantiles` (10% and 5%) and the theorem's
tau = sqrt(2 sigma^2 + delta_i sigma Delta).

  python -m experiments.threshold_clustering            # about a minute
  python -m experiments.threshold_clustering --smoke    # seconds

Writes `results.json`, `figure7.png`, `theorem1.png` and `summary.md` to
`--out` (default `results/threshold_clustering/`).
"""

import dataclasses
import math
import platform
import sys
import time
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
from scipy import optimize
import sklearn
from sklearn import datasets

import prfl_jax as prfl
from experiments import cli
from experiments import common

ATTACKS = ("edge", "far")
AXES = ("n_i", "Delta", "sigma", "beta")


@dataclasses.dataclass
class Config:
  """Experiment configuration (defaults: the paper's Figure 7)."""
  sigmas: tuple = (0.5, 1.0, 2.0, 4.0)  # make_blobs cluster_std.
  num_points: int = 90
  num_clusters: int = 10
  dim: int = 10
  center_box: float = 10.0  # make_blobs centres uniform in [-box, box]^dim.
  quantile: float = 0.1
  repeats: int = 10
  num_iters: int = 100  # Figure 7: l = 0..num_iters.
  elbow_tol: float = 0.05
  # Theorem 1 sweeps: one axis at a time around the base point.
  theorem: bool = True
  base_n: int = 10
  base_delta: float = 20.0
  base_sigma: float = 1.0
  n_values: tuple = (2, 4, 8, 16, 32, 64)
  delta_values: tuple = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
  sigma_values: tuple = (0.25, 0.5, 1.0, 2.0, 4.0)
  beta_values: tuple = (0.0, 0.01, 0.02, 0.05, 0.1)
  attack_beta: float = 0.05  # Byzantine fraction of the Delta and sigma sweeps.
  theorem_quantiles: tuple = (0.1, 0.05)  # Quantile radius rules tried.
  theorem_iters: int = 100
  seed: int = 0
  out: str = "results/threshold_clustering"


SMOKE = dict(sigmas=(1.0, 4.0), repeats=2, num_iters=12, base_n=4,
             n_values=(2, 8), delta_values=(10.0, 40.0),
             sigma_values=(0.5, 2.0), beta_values=(0.0, 0.1),
             theorem_quantiles=(0.1,),
             theorem_iters=12)


def validate(cfg: Config):
  """Raises ValueError on a bad configuration, before anything runs."""
  ints = dict(num_points=cfg.num_points, num_clusters=cfg.num_clusters,
              dim=cfg.dim, repeats=cfg.repeats, num_iters=cfg.num_iters,
              base_n=cfg.base_n, theorem_iters=cfg.theorem_iters)
  for name, value in ints.items():
    prfl.validation.check_positive_int(value, name)
  if cfg.num_points < cfg.num_clusters:
    raise ValueError(f"`points` ({cfg.num_points}) must be >= `clusters` "
                     f"({cfg.num_clusters}).")
  positive = dict(sigmas=cfg.sigmas, center_box=(cfg.center_box,),
                  delta_values=cfg.delta_values, sigma_values=cfg.sigma_values,
                  base_delta=(cfg.base_delta,), base_sigma=(cfg.base_sigma,))
  for name, values in positive.items():
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
      raise ValueError(f"`{name}` must be finite and > 0, got {values}.")
  for q in (cfg.quantile,) + tuple(cfg.theorem_quantiles):
    if not 0 < q < 1:
      raise ValueError(f"quantiles (`quantile`, `theorem_quantiles`) must be "
                       f"in (0, 1), got {q}.")
  if not 0 < cfg.elbow_tol < 1:
    raise ValueError(f"`elbow_tol` must be in (0, 1), got {cfg.elbow_tol}.")
  if not cfg.n_values or any(
      not isinstance(n, int) or n < 1 for n in cfg.n_values):
    raise ValueError(f"`n_values` must be integers >= 1, got {cfg.n_values}.")
  betas = tuple(cfg.beta_values) + (cfg.attack_beta,)
  if not cfg.beta_values or not all(0 <= b < 1 for b in betas):
    raise ValueError(f"Byzantine fractions must lie in [0, 1), got {betas}.")
  if cfg.theorem and cfg.dim < cfg.num_clusters:
    raise ValueError(
        f"Theorem 1 places the {cfg.num_clusters} centres on orthogonal axes: "
        f"`dim` ({cfg.dim}) must be >= `clusters`, or pass --no-theorem.")


def versions() -> dict:
  return {"python": platform.python_version(), "jax": jax.__version__,
          "numpy": np.__version__, "scikit-learn": sklearn.__version__,
          "prfl_jax": prfl.__version__, "platform": platform.platform(),
          "devices": [str(d) for d in jax.devices()]}


# ----------------------------------------------------------------------------
# Figure 7.
# ----------------------------------------------------------------------------


def blobs(cfg: Config):
  """`make_blobs` data: points [R, S, N, d], labels [R, S, N], centres.

  Repeat r uses `random_state = seed + r` for every sigma, so the sigmas share
  the centres (and the standard-normal draws, scaled by sigma), as the paper
  says ("These datasets share the same ground-truth cluster centers").
  """
  points, labels, centres = [], [], []
  for r in range(cfg.repeats):
    for s in cfg.sigmas:
      x, y, c = datasets.make_blobs(
          n_samples=cfg.num_points, n_features=cfg.dim,
          centers=cfg.num_clusters, cluster_std=s,
          center_box=(-cfg.center_box, cfg.center_box),
          random_state=cfg.seed + r, return_centers=True)
      points.append(x)
      labels.append(y)
    centres.append(c)
  shape = (cfg.repeats, len(cfg.sigmas))
  return (np.asarray(points, np.float32).reshape(shape + points[0].shape),
          np.asarray(labels, np.int32).reshape(shape + labels[0].shape),
          np.asarray(centres, np.float32))


def distance_curve(points, labels, centres, *, quantile, num_iters):
  """f(l), l = 0..num_iters, for one data set.

  Args:
    points: `[N, d]`; every point starts its own centre there.
    labels: `[N]` true clusters.
    centres: `[K, d]` true cluster centres.
    quantile: radius rule `prfl.quantile_radius(quantile)`.
    num_iters: T.

  Returns:
    `[T + 1]`: mean over points of ||v_i(l) - centres[labels[i]]||, where
    v(l) = `prfl.threshold_clustering(points, points, num_iters=l)`. The
    clustering step depends only on the current centres, so l steps of one
    iteration each are l iterations: one `lax.scan` gives every l.
  """
  rule = prfl.quantile_radius(quantile)
  mu = centres[labels]
  mean_dist = lambda v: jnp.mean(jnp.linalg.norm(v - mu, axis=1))

  def step(v, _):
    v = prfl.threshold_clustering(points, v, radius=rule, num_iters=1)
    return v, mean_dist(v)

  _, f = lax.scan(step, points, None, length=num_iters)
  return jnp.concatenate([mean_dist(points)[None], f])


def elbow_ratio(f: np.ndarray) -> np.ndarray:
  """The paper's (f(l) - f(l-1)) / (f(l-1) - min f), l = 1..T (NaN at 0/0)."""
  f = np.asarray(f, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    return (f[1:] - f[:-1]) / (f[:-1] - f.min())


def remaining_gap(f: np.ndarray) -> np.ndarray:
  """(f(l) - min f) / (f(0) - min f) = prod_{j <= l} (1 + elbow_ratio(j))."""
  f = np.asarray(f, np.float64)
  span = f[0] - f.min()
  return (f - f.min()) / span if span > 0 else np.zeros_like(f)


def elbow(f: np.ndarray, tol: float) -> int:
  """First l whose remaining gap is at most `tol` of the initial gap."""
  return int(np.argmax(remaining_gap(f) <= tol))


def theorem_iterations(sigma_total, delta, frac) -> float:
  """Theorem 1's l >~ max(1, log(sigma / Delta) / log(1 - delta_i / 2))."""
  return max(1.0, math.log(sigma_total / delta) / math.log(1 - frac / 2))


def run_figure7(cfg: Config, log) -> dict:
  """All repeats and sigmas as one jitted, vmapped program."""
  points, labels, centres = blobs(cfg)
  curve = lambda x, y, c: distance_curve(x, y, c, quantile=cfg.quantile,
                                         num_iters=cfg.num_iters)
  program = jax.jit(jax.vmap(jax.vmap(curve, (0, 0, None))))
  t0 = time.perf_counter()
  f = np.asarray(program(points, labels, centres))  # [R, S, T + 1]
  seconds = time.perf_counter() - t0
  log(f"[figure 7] {cfg.repeats} repeats x {len(cfg.sigmas)} sigmas x "
      f"{cfg.num_iters + 1} iteration counts in one program: {seconds:.1f}s "
      "(with compilation)")
  pairs = np.linalg.norm(centres[:, :, None] - centres[:, None], axis=-1)
  pairs[:, np.arange(cfg.num_clusters), np.arange(cfg.num_clusters)] = np.inf
  min_sep = pairs.min(axis=(1, 2))  # [R]: Delta of each repeat.
  frac = 1.0 / cfg.num_clusters
  rows = []
  for j, s in enumerate(cfg.sigmas):
    mean = f[:, j].mean(0)
    per_repeat = [elbow(f[r, j], cfg.elbow_tol) for r in range(cfg.repeats)]
    l_star = elbow(mean, cfg.elbow_tol)
    sigma_total = s * math.sqrt(cfg.dim)
    rows.append({
        "sigma": s, "sigma_total": sigma_total,
        "elbow": l_star, "elbow_per_repeat_mean": float(np.mean(per_repeat)),
        "elbow_per_repeat_std": float(np.std(per_repeat)),
        "elbow_per_repeat": per_repeat,
        "f0": float(mean[0]), "f_elbow": float(mean[l_star]),
        "f_min": float(mean.min()), "argmin": int(np.argmin(mean)),
        "f_last": float(mean[-1]),
        "theorem_iters": float(np.mean([
            theorem_iterations(sigma_total, d, frac) for d in min_sep])),
    })
    log(f"  sigma={s:g}: f(0)={mean[0]:.3f}, elbow l={l_star} (per repeat "
        f"{np.mean(per_repeat):.1f} +- {np.std(per_repeat):.1f}), "
        f"f(elbow)={mean[l_star]:.3f}, min f={mean.min():.3f} at "
        f"l={np.argmin(mean)}")
  return {"distance": f, "rows": rows, "min_separation": min_sep,
          "seconds": seconds}


def figure7_verdict(fig7: dict, cfg: Config) -> str:
  """Plain words on whether the elbow moves with sigma."""
  rows = fig7["rows"]
  elbows = [r["elbow"] for r in rows]
  f = fig7["distance"].mean(0)  # [S, T + 1]
  scaled = f / np.asarray(cfg.sigmas)[:, None]
  spread = float(np.max(np.abs(scaled - scaled[0])) / scaled[0].max())
  moves = max(elbows) - min(elbows)
  text = (f"Elbows (first l with at most {cfg.elbow_tol:.0%} of the initial "
          f"gap left) for sigma = {', '.join(f'{s:g}' for s in cfg.sigmas)}: "
          f"{', '.join(map(str, elbows))}. ")
  if moves <= 2:
    text += ("The elbow does NOT move with sigma here: ")
  else:
    text += (f"The elbow moves by {moves} iterations across sigma "
             f"({'later' if elbows[-1] > elbows[0] else 'earlier'} for the "
             "largest sigma): ")
  text += (
      f"the curves divided by sigma differ by at most {spread:.1%} of their "
      "height. With every centre starting at its own point, the problem is "
      "scale-invariant until the clusters overlap: each step moves a centre a "
      "fraction (points in the ball) / N ~ 1/K of the way to the ball's mean, "
      "whatever sigma is, so the number of steps to converge does not depend "
      "on sigma; only a sigma large enough to mix clusters changes the curve "
      "(its minimum then rises above the sample-mean error and the curve can "
      "turn up again). The paper reads its Figure 7 as l >~ log(sigma) but "
      "gives no numbers; Theorem 1's own iteration count, log(sigma/Delta) / "
      "log(1 - delta_i/2), decreases as sigma grows ("
      + ", ".join(f"{r['theorem_iters']:.0f}" for r in rows) +
      " here), because its target error sigma^3/Delta grows with sigma.")
  return text


# ----------------------------------------------------------------------------
# Theorem 1.
# ----------------------------------------------------------------------------


class Condition(NamedTuple):
  """One point of a Theorem 1 sweep."""
  axis: str
  n: int  # Points per cluster n_i.
  delta: float  # Distance between every two cluster means.
  sigma: float  # Total standard deviation: E||z - E z||^2 = sigma^2.
  num_bad: int  # Byzantine points against each centre.
  attack: str  # "edge" or "far".
  radius: str  # "quantile" or "theory".
  quantile: float  # The quantile of a "quantile" radius (0 for "theory").

  def beta(self, num_clusters: int) -> float:
    return self.num_bad / (num_clusters * self.n + self.num_bad)

  def frac(self, num_clusters: int) -> float:
    """delta_i = n_i / N, the cluster's fraction of all points."""
    return self.n / (num_clusters * self.n + self.num_bad)

  def within_assumptions(self, num_clusters: int) -> bool:
    """Theorem 1's Delta >~ sigma / delta_i and beta <~ delta_i (constant 1)."""
    frac = self.frac(num_clusters)
    return (self.delta >= self.sigma / frac and
            self.beta(num_clusters) <= frac)

  def label(self) -> str:
    if self.radius == "theory":
      return "theory tau"
    return f"{self.quantile:.0%} quantile"


def num_bad(beta: float, num_good: int) -> int:
  """Byzantine points that make a fraction `beta` of all points."""
  return int(round(beta * num_good / (1 - beta)))


def conditions(cfg: Config) -> dict:
  """Axis -> list of Conditions, for every radius rule."""
  k = cfg.num_clusters
  base = dict(n=cfg.base_n, delta=cfg.base_delta, sigma=cfg.base_sigma)
  radii = [("quantile", q) for q in cfg.theorem_quantiles] + [("theory", 0.0)]
  out = {a: [] for a in AXES}
  for radius, q in radii:
    rule = dict(radius=radius, quantile=q)
    for n in cfg.n_values:
      out["n_i"].append(Condition("n_i", **{**base, "n": n}, num_bad=0,
                                  attack="edge", **rule))
    for beta in sorted({0.0, cfg.attack_beta}):
      bad = num_bad(beta, k * cfg.base_n)
      for d in cfg.delta_values:
        out["Delta"].append(Condition("Delta", **{**base, "delta": d},
                                      num_bad=bad, attack="edge", **rule))
      for s in cfg.sigma_values:
        out["sigma"].append(Condition("sigma", **{**base, "sigma": s},
                                      num_bad=bad, attack="edge", **rule))
    for attack in ATTACKS:
      for beta in cfg.beta_values:
        out["beta"].append(Condition("beta", **base,
                                     num_bad=num_bad(beta, k * cfg.base_n),
                                     attack=attack, **rule))
  return out


class Draws(NamedTuple):
  """The random draws of one repeat, shared by every condition."""
  noise: jax.Array  # [K, n_max, d] standard normal.
  first: jax.Array  # [K] uniform in [0, 1): which point starts centre k.
  direction: jax.Array  # [K, d] unit vectors: where the attack pushes.


def draw(seed: int, *, repeats, num_clusters, dim, n_max) -> Draws:
  """Draws of every repeat, leaves `[repeats, ...]`.

  NumPy, not jax.random: compiling threefry under vmap takes longer on a CPU
  than the whole sweep runs.
  """
  rng = np.random.default_rng(seed)
  u = rng.standard_normal((repeats, num_clusters, dim))
  return Draws(
      rng.standard_normal((repeats, num_clusters, n_max, dim)).astype(
          np.float32),
      rng.uniform(size=(repeats, num_clusters)).astype(np.float32),
      (u / np.linalg.norm(u, axis=-1, keepdims=True)).astype(np.float32))


def theorem_error(draws: Draws, n, delta, sigma, bad, far, theory, quantile,
                  *, bad_max, num_iters):
  """Mean squared error over the K centres after `num_iters` steps.

  Static shapes: `n_max` points per cluster and `bad_max` Byzantine points,
  those beyond `n` and `bad` with weight 0 (absent). Cluster means are
  `delta / sqrt(2) * e_k` (pairwise distance `delta`), points
  `mean + sigma / sqrt(dim) * noise`; centre k starts at a random one of its
  cluster's points. The radius is Theorem 1's `tau = sqrt(2 sigma^2 +
  delta_i sigma delta)` if `theory` (the 2 sigma^2 keeps the first ball, around
  a point, wide enough for its cluster), else the `quantile` of the
  distances.

  Byzantine points against centre k (each centre has its own) sit at
  `mean_k + 10 delta u_k` if `far`, else just inside the ball around the
  current centre, `v + 0.9999 r u_k`, re-placed at every step, with r the
  radius (`theory`) or the distance of the good point at the quantile's
  position among all points (then the quantile of all distances is >= r, so
  the Byzantine points are inside).
  """
  k, n_max, d = draws.noise.shape
  means = delta / math.sqrt(2) * jnp.eye(k, d)
  noise = sigma / math.sqrt(d) * draws.noise
  good = (means[:, None] + noise).reshape(k * n_max, d)
  good_w = jnp.tile(jnp.arange(n_max) < n, k)
  first = jnp.minimum(jnp.floor(draws.first * n).astype(jnp.int32), n - 1)
  init = means + noise[jnp.arange(k), first]
  total = k * n + bad
  tau = jnp.sqrt(2 * sigma**2 + n / total * sigma * delta)
  weights = jnp.concatenate([good_w, jnp.arange(bad_max) < bad]).astype(
      jnp.float32)
  position = jnp.floor(quantile * (total - 1)).astype(jnp.int32)
  rule = lambda dist, present: jnp.where(
      theory, tau, prfl.masked_quantile(dist, present, quantile))

  def one_centre(v0, mean, direction):
    def step(v, _):
      good_dist = jnp.where(good_w, jnp.linalg.norm(good - v, axis=1), jnp.inf)
      edge = jnp.where(theory, tau, jnp.sort(good_dist)[position])
      bad_at = jnp.where(far, mean + 10 * delta * direction,
                         v + 0.9999 * edge * direction)
      points = jnp.concatenate([good, jnp.broadcast_to(bad_at, (bad_max, d))])
      v = prfl.threshold_clustering(points, v[None], radius=rule, num_iters=1,
                                    weights=weights)[0]
      return v, None

    v, _ = lax.scan(step, v0, None, length=num_iters)
    return jnp.sum(jnp.square(v - mean))

  return jnp.mean(jax.vmap(one_centre)(init, means, draws.direction))


def run_conditions(conds: list, cfg: Config, draws: Draws) -> np.ndarray:
  """Squared errors `[len(conds), repeats]`, one jitted program.

  Every condition of a repeat sees the same draws (common random numbers):
  cluster k's j-th point is the same standard-normal draw wherever n_i > j.
  """
  n_max = max(c.n for c in conds)
  draws = draws._replace(noise=draws.noise[:, :, :n_max])
  bad_max = max(c.num_bad for c in conds)
  fn = lambda draws, *c: theorem_error(
      draws, *c, bad_max=bad_max, num_iters=cfg.theorem_iters)
  columns = (
      jnp.array([c.n for c in conds]),
      jnp.array([c.delta for c in conds], jnp.float32),
      jnp.array([c.sigma for c in conds], jnp.float32),
      jnp.array([c.num_bad for c in conds]),
      jnp.array([c.attack == "far" for c in conds]),
      jnp.array([c.radius == "theory" for c in conds]),
      jnp.array([c.quantile for c in conds], jnp.float32))
  program = jax.jit(jax.vmap(jax.vmap(fn, (0,) + (None,) * 7),
                             (None,) + (0,) * 7))
  return np.asarray(program(draws, *columns))


def bound_terms(c: Condition, num_clusters: int) -> np.ndarray:
  """[sigma^2 / n_i, sigma^3 / Delta, beta sigma Delta]."""
  return np.array([c.sigma**2 / c.n, c.sigma**3 / c.delta,
                   c.beta(num_clusters) * c.sigma * c.delta])


def fit_bound(terms: np.ndarray, errors: np.ndarray) -> dict:
  """Non-negative constants a with errors ~ terms @ a, in relative error.

  Minimises sum_j (terms_j @ a / e_j - 1)^2 over a >= 0; reports the RMS and
  the largest |log10(fit / measured)|, and the constant C = max_j e_j /
  sum(terms_j) that the bound needs with unit constants.
  """
  coefs, _ = optimize.nnls(terms / errors[:, None], np.ones(len(errors)))
  log_ratio = np.log10(np.maximum(terms @ coefs, 1e-30) / errors)
  return {"coefs": coefs, "rms_log10": float(np.sqrt(np.mean(log_ratio**2))),
          "max_abs_log10": float(np.max(np.abs(log_ratio))),
          "c_max": float(np.max(errors / terms.sum(1)))}


def _variable(c: Condition, axis: str, num_clusters: int) -> float:
  return {"n_i": c.n, "Delta": c.delta, "sigma": c.sigma,
          "beta": c.beta(num_clusters)}[axis]


def _series(c: Condition, axis: str) -> tuple:
  """What identifies a line inside one axis' panel."""
  variant = c.attack if axis == "beta" else ("attacked" if c.num_bad else
                                             "clean")
  return (c.label(), variant)


def log_slope(x, y) -> float:
  """Least-squares slope of log y against log x (positive x only)."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  keep = (x > 0) & (y > 0)
  if keep.sum() < 2:
    return float("nan")
  return float(np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)[0])


def run_theorem(cfg: Config, log) -> dict:
  """Every sweep, the bound's fit per radius rule and per-axis slopes.

  Conditions with n_i <= the base n_i run as one jitted program (padded to
  the base n_i), each larger n_i as its own, so that the padding does not
  cost more than the sweep.
  """
  k = cfg.num_clusters
  conds = conditions(cfg)
  all_conds = [c for a in AXES for c in conds[a]]
  sizes = [max(c.n, cfg.base_n) for c in all_conds]
  groups = [[j for j, s in enumerate(sizes) if s == size]
            for size in sorted(set(sizes))]
  draws = draw(cfg.seed + 1, repeats=cfg.repeats, num_clusters=k,
               dim=cfg.dim, n_max=max(sizes))
  errors = np.zeros((len(all_conds), cfg.repeats))
  start = time.perf_counter()
  for i, idx in enumerate(groups):
    t0 = time.perf_counter()
    errors[idx] = run_conditions([all_conds[j] for j in idx], cfg, draws)
    elapsed = time.perf_counter() - start
    log(f"[theorem 1: {i + 1}/{len(groups)}] {len(idx)} conditions with n_i "
        f"<= {sizes[idx[0]]} x {cfg.repeats} repeats x {cfg.theorem_iters} "
        f"steps in one program: {time.perf_counter() - t0:.1f}s "
        f"({elapsed:.0f}s elapsed; {len(groups) - i - 1} programs left)")
  seconds = time.perf_counter() - start
  records = []
  for c, e in zip(all_conds, errors):
    terms = bound_terms(c, k)
    records.append({**c._asdict(), "beta": c.beta(k), "delta_i": c.frac(k),
                    "within_assumptions": c.within_assumptions(k),
                    "error": float(e.mean()), "error_std": float(e.std()),
                    "bound": float(terms.sum()), "terms": terms,
                    "errors": e})
  fits = {}
  for label in dict.fromkeys(c.label() for c in all_conds):
    for scope in ("within", "all"):
      idx = [j for j, c in enumerate(all_conds) if c.label() == label and (
          scope == "all" or records[j]["within_assumptions"])]
      if not idx:
        continue
      fit = fit_bound(np.array([records[j]["terms"] for j in idx]),
                      np.array([records[j]["error"] for j in idx]))
      fits[f"{label}, {scope}"] = {**fit, "conditions": len(idx)}
      log(f"  {label:12s} {scope:6s} ({len(idx):2d} conditions): error ~ "
          f"{fit['coefs'][0]:.3g} sigma^2/n_i + {fit['coefs'][1]:.3g} "
          f"sigma^3/Delta + {fit['coefs'][2]:.3g} beta sigma Delta (RMS "
          f"log10 misfit {fit['rms_log10']:.2f}); unit constants need "
          f"C = {fit['c_max']:.3g}")
  slopes = []
  for axis in AXES:
    series = {}
    for rec, c in zip(records, all_conds):
      if c.axis == axis and rec["within_assumptions"]:
        series.setdefault(_series(c, axis), []).append((c, rec))
    for (label, variant), items in series.items():
      x = [_variable(c, axis, k) for c, _ in items]
      slopes.append({
          "axis": axis, "radius": label, "variant": variant,
          "points": sum(v > 0 for v in x),
          "measured": log_slope(x, [r["error"] for _, r in items]),
          "bound": log_slope(x, [r["bound"] for _, r in items])})
  return {"records": records, "fits": fits, "slopes": slopes,
          "seconds": seconds}


def theorem_verdict(theorem: dict) -> str:
  """Plain words on the bound, from the fits and slopes."""
  c_max = {name[:-len(", within")]: fit["c_max"]
           for name, fit in theorem["fits"].items()
           if name.endswith(", within")}
  slope = {(s["axis"], s["radius"], s["variant"]): s["measured"]
           for s in theorem["slopes"]}
  text = ("Largest measured error / bound with unit constants over the "
          "conditions that meet the theorem's assumptions: " +
          "; ".join(f"{k}: C = {v:.3g}" for k, v in c_max.items()) + ". ")
  clean = [v for (axis, _, variant), v in slope.items()
           if axis == "n_i" and variant == "clean"]
  if clean:
    text += ("Without Byzantine points the error falls like n_i^"
             f"{np.mean(clean):.2f} (the sample mean's sigma^2/n_i) for every "
             "radius; the sigma^3/Delta term does not show while the clusters "
             "are apart. ")
  attacked = [(label, slope.get(("Delta", label, "attacked")))
              for label in c_max]
  attacked = [(label, s) for label, s in attacked
              if s is not None and np.isfinite(s)]
  if attacked:
    text += ("Under the edge attack the error grows with Delta like " +
             ", ".join(f"Delta^{s:.2f} ({label})" for label, s in attacked) +
             "; the bound allows Delta^1. ")
  text += ("A quantile radius whose position q (N - 1) passes the cluster's "
           "own points reaches the next cluster, so an attacker just inside "
           "it sits about Delta away and the error grows like "
           "(beta/delta_i)^2 Delta^2; the theorem's tau ~ sqrt(delta_i sigma "
           "Delta) keeps the error at the bound's scale.")
  return text


# ----------------------------------------------------------------------------
# Plots and summary.
# ----------------------------------------------------------------------------


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def plot_figure7(fig7: dict, cfg: Config, path: str):
  plt = _pyplot()
  f = fig7["distance"]  # [R, S, T + 1]
  ls = np.arange(f.shape[-1])
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.4))
  fig.subplots_adjust(wspace=0.35)
  for j, (s, row) in enumerate(zip(cfg.sigmas, fig7["rows"])):
    color = f"C{j}"
    mean, std = f[:, j].mean(0), f[:, j].std(0)
    label = rf"$\sigma$ = {s:g} (elbow l = {row['elbow']})"
    axes[0].plot(ls, mean, color=color, lw=2, label=label)
    axes[0].fill_between(ls, mean - std, mean + std, color=color, alpha=0.2)
    axes[0].plot(row["elbow"], mean[row["elbow"]], "o", color=color, ms=8,
                 mec="k")
    axes[1].plot(ls[1:], elbow_ratio(mean), color=color, lw=1.5)
    axes[1].axvline(row["elbow"], color=color, ls=":", lw=1)
    axes[2].semilogy(ls, np.maximum(remaining_gap(mean), 1e-8), color=color,
                     lw=1.5)
    axes[2].axvline(row["elbow"], color=color, ls=":", lw=1)
  axes[0].set_ylabel("mean distance to the true cluster centre\n"
                     "(data units; band: +-1 sd over repeats)")
  axes[0].set_title("Mean distance vs clipping iterations")
  axes[1].set_ylabel("(f(l) - f(l-1)) / (f(l-1) - min f)\n(noisy once f "
                     "reaches float precision)")
  axes[1].set_ylim(-1.05, 0.3)
  axes[1].set_title("The paper's elbow ratio")
  axes[2].axhline(cfg.elbow_tol, color="k", ls="--", lw=1,
                  label=f"elbow: {cfg.elbow_tol:.0%} of the gap left")
  axes[2].set_ylabel("remaining gap (f(l) - min f) / (f(0) - min f) (log)")
  axes[2].set_title("Remaining gap = product of (1 + ratio): elbow rule")
  axes[2].legend(loc="upper right", fontsize=8)
  for ax in axes:
    ax.set_xlabel("clipping iterations l")
    ax.grid(alpha=0.3)
  axes[0].legend(loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2,
                 fontsize=8)
  fig.suptitle(
      f"Threshold-Clustering on make_blobs ({cfg.num_points} points, "
      f"{cfg.num_clusters} clusters, d={cfg.dim}, radius = "
      f"{cfg.quantile:.0%} quantile, {cfg.repeats} repeats) — Werner et al. "
      "2023, Fig. 7", y=1.02)
  common.save_figure(fig, path)
  plt.close(fig)


def plot_theorem(theorem: dict, cfg: Config, path: str):
  plt = _pyplot()
  import matplotlib  # pylint: disable=import-outside-toplevel
  records = theorem["records"]
  conds = [Condition(**{f: r[f] for f in Condition._fields}) for r in records]
  labels = list(dict.fromkeys(c.label() for c in conds))
  colors = dict(zip(labels, ["C0", "C2", "C4", "C5", "C6"][:len(labels) - 1]
                    + ["C3"]))
  styles = {"clean": "-", "attacked": "--", "edge": "--", "far": "-."}
  fig, axes = plt.subplots(2, 3, figsize=(17, 10))
  xlabels = {"n_i": "points per cluster $n_i$ (log)",
             "Delta": r"separation $\Delta$ (data units, log)",
             "sigma": r"total std $\sigma$ (data units, log)",
             "beta": r"Byzantine fraction $\beta$ (log; $\beta$=0 not shown)"}
  others = {"n_i": f"Delta={cfg.base_delta:g}, sigma={cfg.base_sigma:g}",
            "Delta": f"n_i={cfg.base_n}, sigma={cfg.base_sigma:g}",
            "sigma": f"n_i={cfg.base_n}, Delta={cfg.base_delta:g}",
            "beta": f"n_i={cfg.base_n}, Delta={cfg.base_delta:g}, "
                    f"sigma={cfg.base_sigma:g}"}
  handles = {}
  for axis, ax in zip(AXES, axes.flat):
    series = {}
    for c, r in zip(conds, records):
      if c.axis == axis:
        series.setdefault(_series(c, axis), []).append((c, r))
    for (label, variant), items in series.items():
      x = np.array([_variable(c, axis, cfg.num_clusters) for c, _ in items])
      e = np.array([r["error"] for _, r in items])
      sd = np.array([r["error_std"] for _, r in items])
      inside = np.array([r["within_assumptions"] for _, r in items])
      keep = x > 0
      theory = label == "theory tau"
      h = ax.errorbar(x[keep], e[keep],
                      yerr=np.minimum(sd[keep], 0.999 * e[keep]),
                      color=colors[label], ls=styles[variant],
                      lw=1.5 if theory else 2.5, capsize=2)
      for mask, face in ((inside, colors[label]), (~inside, "white")):
        ax.plot(x[keep & mask], e[keep & mask], "o", color=colors[label],
                mfc=face, ms=6)
      handles.setdefault(f"{label}, {variant}", h)
      bound = np.array([r["bound"] for _, r in items])
      attacked = variant != "clean" and axis != "n_i"
      name = f"bound (unit constants), beta {'>' if attacked else '='} 0"
      h = ax.plot(x[keep], bound[keep], ls=":", color="0.55" if attacked
                  else "k", lw=2.5 if attacked else 1.2, zorder=0)[0]
      handles.setdefault(name, h)
      ticks = sorted(set(x[keep]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.3g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(xlabels[axis])
    ax.set_ylabel(r"squared error $\|v_k - E z\|^2$ (log)")
    ax.set_title(f"vary {axis} ({others[axis]})", fontsize=10)
    ax.grid(alpha=0.3, which="both")
  ax = axes.flat[4]
  for label in labels:
    for inside, face in ((True, colors[label]), (False, "white")):
      rs = [r for c, r in zip(conds, records) if c.label() == label and
            r["within_assumptions"] == inside]
      ax.loglog([r["bound"] for r in rs], [r["error"] for r in rs], "o",
                color=colors[label], mfc=face, alpha=0.8)
  lo = min(min(r["error"], r["bound"]) for r in records)
  hi = max(max(r["error"], r["bound"]) for r in records)
  ax.plot([lo, hi], [lo, hi], "k--", lw=1)
  ax.set_xlabel(r"bound $\sigma^2/n_i + \sigma^3/\Delta + \beta\sigma\Delta$"
                " (unit constants, log)")
  ax.set_ylabel("measured squared error (log)")
  ax.set_title("every condition; above the dashed line: bound exceeded",
               fontsize=10)
  ax.grid(alpha=0.3, which="both")
  legend_ax = axes.flat[5]
  legend_ax.axis("off")
  legend_ax.legend(
      list(handles.values()), list(handles), loc="upper left", fontsize=8,
      title="mean +- sd over repeats; hollow: outside the theorem's\n"
      r"assumptions ($\Delta \geq \sigma/\delta_i$, $\beta \leq \delta_i$); "
      f"attacked: beta={cfg.attack_beta:g}, edge attack")
  fig.suptitle("Theorem 1 of Werner et al. 2023: error of Threshold-Clustering"
               r" vs $\sigma^2/n_i + \sigma^3/\Delta + \beta\sigma\Delta$",
               y=1.0)
  fig.tight_layout()
  common.save_figure(fig, path)
  plt.close(fig)


def summary_markdown(cfg: Config, fig7: dict, theorem, command: str) -> str:
  lines = [
      "# Threshold-Clustering: Figure 7 and Theorem 1 (Werner et al., 2023)",
      "", f"Command: `{command}`", "",
      f"## Figure 7 ({cfg.repeats} repeats, {cfg.num_points} points, "
      f"{cfg.num_clusters} clusters, d={cfg.dim}, radius at the "
      f"{cfg.quantile:.0%} quantile; {fig7['seconds']:.1f}s)", "",
      "f(l): mean distance from each point's centre (started at the point) to "
      "its true centre. Elbow: the first l at which at most "
      f"{cfg.elbow_tol:.0%} of the gap f(0) - min f is left, i.e. the product "
      "of (1 + the paper's ratio (f(l) - f(l-1)) / (f(l-1) - min f)). The "
      "paper shows Figure 7 without numbers and says the elbow follows "
      "l >~ log(sigma).", "",
      "| sigma (per coord.) | sigma (total) | f(0) | elbow l (mean curve) | "
      "elbow per repeat | f(elbow) | min f (at l) | f(T) | Theorem 1's l |",
      "|---|---|---|---|---|---|---|---|---|"]
  for r in fig7["rows"]:
    lines.append(
        f"| {r['sigma']:g} | {r['sigma_total']:.2f} | {r['f0']:.3f} | "
        f"{r['elbow']} | {r['elbow_per_repeat_mean']:.1f} +- "
        f"{r['elbow_per_repeat_std']:.1f} | {r['f_elbow']:.3f} | "
        f"{r['f_min']:.3f} ({r['argmin']}) | {r['f_last']:.3f} | "
        f"{r['theorem_iters']:.0f} |")
  lines += ["", "Min. separation of the make_blobs centres per repeat: "
            + ", ".join(f"{d:.1f}" for d in fig7["min_separation"]) + ".", "",
            "**Does the elbow move with sigma?** " + figure7_verdict(fig7, cfg),
            ""]
  if theorem is None:
    return "\n".join(lines)
  lines += [
      f"## Theorem 1 ({cfg.repeats} repeats, {cfg.theorem_iters} steps, "
      f"{theorem['seconds']:.1f}s)", "",
      "Bound: E||v - E z||^2 <~ sigma^2/n_i + sigma^3/Delta + beta sigma "
      f"Delta (sigma: total std). Base point n_i={cfg.base_n}, "
      f"Delta={cfg.base_delta:g}, sigma={cfg.base_sigma:g}, "
      f"K={cfg.num_clusters}, d={cfg.dim}; one sweep per variable; the Delta "
      f"and sigma sweeps also run with beta={cfg.attack_beta:g} (edge "
      "attack). 'within': only conditions that meet the theorem's "
      "assumptions Delta >= sigma/delta_i and beta <= delta_i (constant 1). "
      "Fit: non-negative a, b, c minimising the relative misfit. C: largest "
      "measured / bound with unit constants (C <= 1: bound holds as written).",
      "", "| radius, conditions | a (sigma^2/n_i) | b (sigma^3/Delta) | "
      "c (beta sigma Delta) | RMS log10 misfit | max log10 misfit | C |",
      "|---|---|---|---|---|---|---|"]
  for name, f in theorem["fits"].items():
    lines.append(f"| {name} ({f['conditions']}) | {f['coefs'][0]:.3g} | "
                 f"{f['coefs'][1]:.3g} | {f['coefs'][2]:.3g} | "
                 f"{f['rms_log10']:.2f} | {f['max_abs_log10']:.2f} | "
                 f"{f['c_max']:.3g} |")
  lines += ["", "Log-log slopes of the error along each sweep, over the "
            "conditions within the assumptions (measured vs the bound with "
            "unit constants):", "",
            "| sweep | radius | variant | points | measured slope | "
            "bound's slope |", "|---|---|---|---|---|---|"]
  for s in theorem["slopes"]:
    lines.append(f"| {s['axis']} | {s['radius']} | {s['variant']} | "
                 f"{s['points']} | {s['measured']:.2f} | {s['bound']:.2f} |")
  lines += ["", "**Does the bound hold?** " + theorem_verdict(theorem), ""]
  return "\n".join(lines)


# ----------------------------------------------------------------------------
# CLI.
# ----------------------------------------------------------------------------


def _g(values) -> str:
  """A tuple of numbers as a command-line list (`(1.0, 4.0)` -> "1,4")."""
  return ",".join(f"{v:g}" for v in values)


# SMOKE as command-line values (option dest -> text), for `cli.parser`.
SMOKE_ARGS = {"iters" if k == "num_iters" else k:
              _g(v) if isinstance(v, tuple) else str(v)
              for k, v in SMOKE.items()}


def build_parser():
  """The command line (every option typed; defaults: the paper's Figure 7)."""
  d = Config()
  positive = cli.real(low=0, low_open=True)
  fraction = cli.real(0, 1, high_open=True)  # Byzantine fraction, [0, 1).
  unit = cli.real(0, 1, low_open=True, high_open=True)  # (0, 1).
  p = cli.parser(__doc__, out=d.out, smoke=SMOKE_ARGS)
  p.add_argument("--sigmas", type=cli.list_of(positive), default=_g(d.sigmas),
                 help="make_blobs cluster_std values")
  p.add_argument("--repeats", type=cli.positive_int, default=d.repeats)
  p.add_argument("--iters", type=cli.positive_int, default=d.num_iters,
                 help="Figure 7: l = 0..ITERS")
  p.add_argument("--points", type=cli.positive_int, default=d.num_points)
  p.add_argument("--clusters", type=cli.positive_int, default=d.num_clusters)
  p.add_argument("--dim", type=cli.positive_int, default=d.dim)
  p.add_argument("--quantile", type=unit, default=d.quantile)
  p.add_argument("--elbow-tol", type=unit, default=d.elbow_tol)
  p.add_argument("--no-theorem", action="store_true")
  p.add_argument("--theorem-iters", type=cli.positive_int,
                 default=d.theorem_iters)
  p.add_argument("--base-n", type=cli.positive_int, default=d.base_n)
  p.add_argument("--base-delta", type=positive, default=d.base_delta)
  p.add_argument("--base-sigma", type=positive, default=d.base_sigma)
  p.add_argument("--n-values", type=cli.list_of(cli.positive_int),
                 default=_g(d.n_values))
  p.add_argument("--delta-values", type=cli.list_of(positive),
                 default=_g(d.delta_values))
  p.add_argument("--sigma-values", type=cli.list_of(positive),
                 default=_g(d.sigma_values))
  p.add_argument("--beta-values", type=cli.list_of(fraction),
                 default=_g(d.beta_values))
  p.add_argument("--attack-beta", type=fraction, default=d.attack_beta)
  p.add_argument("--theorem-quantiles", type=cli.list_of(unit),
                 default=_g(d.theorem_quantiles),
                 help="quantile radius rules of the Theorem 1 sweeps")
  p.add_argument("--no-plots", action="store_true")
  p.set_defaults(seed=d.seed)
  return p


def config_from_args(args) -> Config:
  """The `Config` of parsed options."""
  return Config(
      sigmas=args.sigmas, repeats=args.repeats, num_iters=args.iters,
      num_points=args.points, num_clusters=args.clusters, dim=args.dim,
      quantile=args.quantile, elbow_tol=args.elbow_tol,
      theorem=not args.no_theorem, theorem_iters=args.theorem_iters,
      base_n=args.base_n, base_delta=args.base_delta,
      base_sigma=args.base_sigma, n_values=args.n_values,
      delta_values=args.delta_values, sigma_values=args.sigma_values,
      beta_values=args.beta_values, attack_beta=args.attack_beta,
      theorem_quantiles=args.theorem_quantiles, seed=args.seed, out=args.out)


def parse_config(argv) -> tuple:
  """Parses and checks `argv` (cross-option rules: `validate`), before any
  compute; returns `(Config, argparse.Namespace)`."""
  args = cli.parse(build_parser(), argv,
                   check=lambda a: validate(config_from_args(a)))
  return config_from_args(args), args


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  cfg, args = parse_config(argv)
  cli.write_config(cfg.out, cfg)
  log = lambda s: print(s, flush=True)
  command = " ".join(["python -m experiments.threshold_clustering"] + argv)
  start = time.perf_counter()
  log(f"Threshold-Clustering experiments: sigmas {cfg.sigmas}, "
      f"{cfg.repeats} repeats, l = 0..{cfg.num_iters}"
      + ("" if not cfg.theorem else
         f"; Theorem 1 sweeps with {cfg.theorem_iters} steps"))
  fig7 = run_figure7(cfg, log)
  theorem = run_theorem(cfg, log) if cfg.theorem else None
  seconds = time.perf_counter() - start
  common.write_json(f"{cfg.out}/results.json", {
      "config": dataclasses.asdict(cfg), "versions": versions(),
      "command": command, "seconds": seconds,
      "figure7": {"rows": fig7["rows"], "distance": fig7["distance"],
                  "min_separation": fig7["min_separation"],
                  "verdict": figure7_verdict(fig7, cfg)},
      "theorem1": None if theorem is None else {
          "records": theorem["records"], "slopes": theorem["slopes"],
          "verdict": theorem_verdict(theorem),
          "fits": {k: {"a": v["coefs"][0], "b": v["coefs"][1],
                       "c": v["coefs"][2], "rms_log10": v["rms_log10"],
                       "max_abs_log10": v["max_abs_log10"],
                       "c_max": v["c_max"], "conditions": v["conditions"]}
                   for k, v in theorem["fits"].items()}}})
  text = summary_markdown(cfg, fig7, theorem, command)
  common._atomic_write(  # pylint: disable=protected-access
      f"{cfg.out}/summary.md", lambda f: f.write(text))
  if not args.no_plots:
    plot_figure7(fig7, cfg, f"{cfg.out}/figure7.png")
    if theorem is not None:
      plot_theorem(theorem, cfg, f"{cfg.out}/theorem1.png")
  log(f"\n{text}")
  log(f"Done in {seconds:.1f}s; wrote {cfg.out}/results.json, summary.md"
      + ("" if args.no_plots else ", figure7.png"
         + (", theorem1.png" if theorem is not None else "")))
  return fig7, theorem


if __name__ == "__main__":
  main()
