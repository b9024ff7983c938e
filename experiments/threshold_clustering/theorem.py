"""Theorem 1 of Werner et al. (2023): the error of Threshold-Clustering
against sigma^2/n_i + sigma^3/Delta + beta sigma Delta, swept one variable at
a time around a base point (see the package docstring)."""

import math
import time
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

import prfl_jax as prfl

ATTACKS = ("edge", "far")
AXES = ("n_i", "Delta", "sigma", "beta")


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


def conditions(cfg) -> dict:
  """Axis -> list of Conditions, for every radius rule."""
  k = cfg.blob_clusters
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


def run_conditions(conds: list, cfg, draws: Draws) -> np.ndarray:
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


def run_theorem(cfg, log) -> dict:
  """Every sweep, the bound's fit per radius rule and per-axis slopes.

  Conditions with n_i <= the base n_i run as one jitted program (padded to
  the base n_i), each larger n_i as its own, so that the padding does not
  cost more than the sweep.
  """
  k = cfg.blob_clusters
  conds = conditions(cfg)
  all_conds = [c for a in AXES for c in conds[a]]
  sizes = [max(c.n, cfg.base_n) for c in all_conds]
  groups = [[j for j, s in enumerate(sizes) if s == size]
            for size in sorted(set(sizes))]
  draws = draw(cfg.run.seed + 1, repeats=cfg.repeats, num_clusters=k,
               dim=cfg.blob_dim, n_max=max(sizes))
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
