"""Theorem 2's rate, measured: FC's gradient norm against n_i and T.

Theorem 2 (Werner et al., 2023) bounds FC's average squared gradient norm
`(1/T) sum_t E ||grad f_i(x_{i,t-1})||^2` by
`sqrt(max(1, A^2) (sigma^2 / n_i + sigma^3 / Delta + beta sigma Delta) / T)`;
without Byzantine clients and with Delta large, the noise term
`sigma / sqrt(n_i T)` dominates, so on a log-log plot the measured average
should fall with slope -1/2 in n_i (more clients in a cluster to average) and
-1/2 in T.

The federation is Figure 3's synthetic linear regression (K clusters of n_i
clients, d = 10, 9 samples per client, features N(k, 1) in cluster k), with
stochastic gradients made explicit: client i's loss at round t is
`f_i(x) + <xi_i, x>` with `xi_i ~ N(0, sigma^2 / d I)` drawn every round, so
`E ||g_i(x) - grad f_i(x)||^2 = sigma^2` exactly (Assumption 6). The cluster
optima are scaled by `--separation` (Delta grows with them) and every model
starts at `--start-distance` from its optimum, so that the initial gradient is
below sigma: the noise-dominated regime. FC runs plain SGD (the theorem's
update) with 10 Threshold-Clustering steps and the theorem's fixed radius
tau (`fc`), or the experiments' quantile radius (`fc_quantile`); the ground
truth (averaging its n_i cluster members exactly) is the rate's best case.

The theorem's step size depends on T, so each (n_i, T) point is the best of a
geometric grid of constant learning rates. A constant-step run's first T
rounds are the T-round run with that step, so one run of the largest T per
(n_i, learning rate) gives every T: the average over its first T rounds. Each
n_i's learning-rate grid is one XLA program (`prfl.sweep`).

  python -m experiments.theorem2 \\
      --config experiments/configs/theorem2/rate.toml \\
      --out experiments/results/theorem2
  python -m experiments.theorem2 --smoke          # seconds

Writes `config.json` (first, with versions and backend),
`results.json` (every grid point's running average), `summary.csv` (the
best learning rate per (algorithm, n_i, T)), `rate.png` (log-log, with the
fitted slopes) to `--out`.
"""

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import prfl_jax as prfl
from experiments import cli
from experiments import files
from experiments import groups
from experiments import options
from experiments.options import group, option

# fc: the theorem's fixed radius tau; fc_quantile: the experiments' radius
# (a quantile of the distances); oracle: the exact cluster average.
ALGORITHMS = ("fc", "fc_quantile", "oracle")


@dataclasses.dataclass(frozen=True)
class Config:
  """Every option of the rate measurement (defaults: the committed run's but
  for `--clients`, which adds 64)."""
  run: groups.Run = group(groups.Run)
  federation: groups.Clusters = group(groups.Clusters)
  clustering: groups.Radius = group(groups.Radius)
  clients: tuple[int, ...] = option(
      (4, 8, 16, 32, 64), "comma-separated n_i (clients per cluster)", low=1)
  horizons: tuple[int, ...] = option(
      (125, 250, 500, 1000, 2000), "comma-separated T; the largest is the "
      "run's length", low=1)
  sigma: float = option(1.0, "gradient noise: E ||g_i - grad f_i||^2 = "
                        "sigma^2", low=0, low_open=True)
  start_distance: float = option(
      0.01, "every model starts at its cluster's optimum plus a random "
      "vector of this norm (the noise-dominated regime needs a small initial "
      "gradient, below sigma)", low=0, low_open=True)
  separation: float = option(
      5.0, "the cluster optima x*_k are scaled by this factor (Delta grows "
      "with it; the theorem asks Delta >~ sigma)", low=0, low_open=True)
  num_lrs: int = option(10, "learning rates in each grid (a factor sqrt(2) "
                        "apart)", low=1)
  lr_max: float = option(0.008, "largest learning rate (below 1 / L of the "
                         "stiffest cluster)", low=0, low_open=True)
  methods: tuple[str, ...] = option(("fc", "oracle"), "what runs: FC with "
                                    "the theorem's fixed radius, FC with the "
                                    "quantile radius, the ground truth",
                                    choices=ALGORITHMS)
  radius: float = option(
      2.0, "fc's fixed radius tau (the theorem's choice: above a cluster's "
      "noise spread sigma, below the separation)", low=0, low_open=True)


def resolve(cfg: Config) -> Config:
  """The horizons in order, the output directory filled in."""
  return options.replace(
      cfg, horizons=tuple(sorted(cfg.horizons)), out=cfg.run.out or
      os.path.join("results", "theorem2",
                   *(["smoke"] if cfg.run.smoke else [])))


def federation(cfg: Config, n_i: int):
  """Figure 3's federation with its optima scaled by `--separation`, and the
  `[N, d]` starting models at `--start-distance` from them.

  Every n_i takes the first n_i clients of each cluster of one federation of
  `max(--clients)` per cluster, so a larger cluster only adds clients (the
  n_i points do not differ by their data draws)."""
  k = cfg.federation.clusters
  data_key, start_key = jax.random.split(jax.random.key(cfg.run.seed))
  most = max(cfg.clients)
  data = prfl.data.synthetic_regression(
      data_key, num_clusters=k, clients_per_cluster=most)[0]
  keep = (np.arange(k)[:, None] * most +
          np.arange(n_i)[None]).ravel()
  s = cfg.separation
  x_star = s * data.test["x_star"][keep]
  data = data._replace(
      train={"a": data.train["a"][keep], "y": s * data.train["y"][keep]},
      test={"x_star": x_star}, clusters=data.clusters[keep])
  u = jax.random.normal(start_key, (k * most,
                                    x_star.shape[1]))[keep]
  u = u / jnp.linalg.norm(u, axis=1, keepdims=True)
  return data, x_star + cfg.start_distance * u


def noisy_loss(params, batch):
  """`f_i(x) + <xi_i, x>`: the gradient is `grad f_i(x) + xi_i`."""
  clean = {"a": batch["a"], "y": batch["y"]}
  return prfl.data.regression_loss(params, clean) + jnp.dot(params,
                                                            batch["xi"])


def build(name: str, lr, cfg: Config, clusters):
  opt = optax.sgd(lr)
  if name == "oracle":
    return prfl.algorithms.oracle(noisy_loss, opt, clusters=clusters)
  radius = (cfg.radius if name == "fc" else
            prfl.quantile_radius(cfg.clustering.quantile))
  return prfl.algorithms.federated_clustering(noisy_loss, opt, radius=radius,
                                              num_iters=10)


def with_grad_norm(alg, train):
  """`alg` whose step metrics hold `mean_i ||grad f_i(x_i)||^2` before it."""
  clean = jax.vmap(jax.grad(prfl.data.regression_loss))

  def step(state, batch, key):
    sq = jnp.mean(jnp.sum(jnp.square(clean(state.params, train)), axis=1))
    state, metrics = alg.step(state, batch, key)
    return state, {**metrics, "grad_sq": sq}
  return alg._replace(step=step)


def run_grid(cfg: Config, name: str, n_i: int, lrs: np.ndarray) -> np.ndarray:
  """`[L, T]` per-round mean squared gradient norm of every learning rate."""
  data, params = federation(cfg, n_i)
  n, dim = params.shape
  scale = cfg.sigma / np.sqrt(dim)

  def sampler(key):
    return {**data.train, "xi": scale * jax.random.normal(key, (n, dim))}

  make = lambda hp: with_grad_norm(
      build(name, hp["lr"], cfg, data.clusters), data.train)
  keys = jnp.stack([jax.random.key(cfg.run.seed + 1)] * len(lrs))
  out = jax.jit(lambda h, k: prfl.sweep.sweep(
      make, h, params, sampler, max(cfg.horizons), keys=k))(
          {"lr": jnp.asarray(lrs, jnp.float32)}, keys)
  return np.asarray(out.metrics["grad_sq"])


def best_over_lrs(curves: np.ndarray, lrs, horizons) -> list:
  """Per T: the smallest average of the first T rounds, and its lr."""
  with np.errstate(over="ignore", invalid="ignore"):
    avg = np.cumsum(curves, axis=1) / np.arange(1, curves.shape[1] + 1)
  avg = np.where(np.isfinite(avg), avg, np.inf)
  out = []
  for t in horizons:
    i = int(np.argmin(avg[:, t - 1]))
    out.append({"T": t, "avg_grad_sq": float(avg[i, t - 1]),
                "lr": float(lrs[i]), "lr_at_grid_edge":
                    bool(i in (0, len(lrs) - 1))})
  return out


def fit_slopes(rows: list) -> dict:
  """Least-squares fit of log(avg) = c + a log(n_i) + b log(T)."""
  x = np.array([[1.0, np.log(r["n_i"]), np.log(r["T"])] for r in rows])
  y = np.log([r["avg_grad_sq"] for r in rows])
  coef, *_ = np.linalg.lstsq(x, y, rcond=None)
  resid = y - x @ coef
  return {"slope_n_i": float(coef[1]), "slope_T": float(coef[2]),
          "intercept": float(coef[0]),
          "rms_residual": float(np.sqrt(np.mean(resid ** 2)))}


def plot(rows: list, fits: dict, cfg: Config, path: str):
  plt = files.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
  styles = {"fc": "-o", "fc_quantile": ":^", "oracle": "--s"}
  for name in cfg.methods:
    mine = [r for r in rows if r["algorithm"] == name]
    f = fits[name]
    for t in cfg.horizons:
      pts = [r for r in mine if r["T"] == t]
      axes[0].loglog([r["n_i"] for r in pts],
                     [r["avg_grad_sq"] for r in pts], styles[name], ms=3,
                     label=f"{name}, T={t}" if t in (cfg.horizons[0],
                                                     cfg.horizons[-1])
                     else None)
    for n_i in cfg.clients:
      pts = [r for r in mine if r["n_i"] == n_i]
      axes[1].loglog([r["T"] for r in pts],
                     [r["avg_grad_sq"] for r in pts], styles[name], ms=3,
                     label=f"{name}, n_i={n_i}" if n_i in (
                         cfg.clients[0], cfg.clients[-1]) else None)
    axes[0].plot([], [], " ", label=f"{name}: fitted slope "
                 f"{f['slope_n_i']:.2f} in n_i")
    axes[1].plot([], [], " ", label=f"{name}: fitted slope "
                 f"{f['slope_T']:.2f} in T")
  for ax, what in zip(axes, ("n_i (clients per cluster)", "T (rounds)")):
    ax.set_xlabel(what)
    ax.set_ylabel(r"$\frac{1}{T}\sum_t \|\nabla f_i(x_{i,t-1})\|^2$ "
                  "(mean over clients)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
  fig.suptitle(r"Theorem 2: the $\sigma/\sqrt{n_i T}$ term predicts slope "
               rf"-1/2 in both ($\sigma$ = {cfg.sigma:g}, K = "
               f"{cfg.federation.clusters}, best constant lr per point)")
  files.save_figure(fig, path)
  plt.close(fig)


def run(cfg: Config, prepared, tracker, command: str = "") -> dict:
  """Every (method, n_i) grid; writes results.json, summary.csv, rate.png."""
  del prepared, command  # Nothing to load; the command is in config.json.
  lrs = cfg.lr_max / np.sqrt(2.0) ** np.arange(cfg.num_lrs)
  rows, curves, start = [], {}, time.perf_counter()
  for name in cfg.methods:
    for n_i in cfg.clients:
      t0 = time.perf_counter()
      c = run_grid(cfg, name, n_i, lrs)
      curves[f"{name}/{n_i}"] = c
      for r in best_over_lrs(c, lrs, cfg.horizons):
        rows.append({"algorithm": name, "n_i": n_i, **r})
      tracker.log(f"{name} n_i={n_i}: {len(lrs)} learning rates x "
                  f"{max(cfg.horizons)} rounds in "
                  f"{time.perf_counter() - t0:.1f}s; best average at T = " +
                  ", ".join(f"{r['T']}: {r['avg_grad_sq']:.3g}"
                            for r in rows[-len(cfg.horizons):]))
  fits = {name: fit_slopes([r for r in rows if r["algorithm"] == name])
          for name in cfg.methods}
  out = cfg.run.out
  files.write_json(os.path.join(out, "results.json"), {
      "config": options.to_dict(cfg), "learning_rates": lrs, "best": rows,
      "fits": fits, "curves": curves,
      "seconds": time.perf_counter() - start})
  files.write_csv(os.path.join(out, "summary.csv"), rows)
  if cfg.run.plots:
    plot(rows, fits, cfg, os.path.join(out, "rate.png"))
  for name, f in fits.items():
    tracker.log(f"{name}: slope {f['slope_n_i']:.3f} in n_i, "
                f"{f['slope_T']:.3f} in T (theorem: -0.5, -0.5); rms "
                f"residual {f['rms_residual']:.3f}")
  return {"best": rows, "fits": fits}


EXPERIMENT = cli.Experiment("theorem2", __doc__, Config, resolve,
                            lambda cfg: None, run)

main = EXPERIMENT.main


if __name__ == "__main__":
  main()
