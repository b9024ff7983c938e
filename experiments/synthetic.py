"""Figures 2 and 3 of Werner et al. (2023) on the synthetic federation (§5.1).

Figure 3: the error `||x_i - x*||` over rounds of every algorithm, each at the
best learning rate of its own grid, for (K, n_i) in {(4, 4), (4, 16), (16, 4)}.
Figure 2: the empirical constants of Assumptions 4 and 5 (`A^2`, `Delta^2`)
along a run with perfect clustering assignments (the ground-truth oracle).

  python -m experiments.synthetic                 # defaults, a few minutes
  python -m experiments.synthetic --settings 4x4 --rounds 500 --out /tmp/s
  python -m experiments.synthetic --smoke         # seconds

Writes `config.json` (first, with versions and backend), `results.json`,
`summary.csv`, `figure3.png` and `figure2.png` to `--out` and prints a
summary table.
"""

import argparse
import dataclasses
import itertools
import sys
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import optax

import prfl_jax as prfl
from experiments import cli
from experiments import common

LOSS = prfl.data.regression_loss
SOLVED = 1e-2  # A client is "solved" when ||x_i - x*|| < SOLVED.
GRAD_FLOOR = 1e-6  # ||grad f_bar_i||^2 below which A^2 is not estimated.


@dataclasses.dataclass
class Config:
  """Experiment configuration (defaults reproduce Figures 2 and 3)."""
  settings: tuple = ((4, 4), (4, 16), (16, 4))  # (K, n_i).
  algorithms: tuple = ("fc", "mc", "myopic", "ifca", "ifca2", "hypcluster",
                       "cfl", "ditto", "oracle", "local", "global")
  num_rounds: int = 2000
  eval_every: int = 100
  # Learning rates as fractions of the heavy-ball stability limit
  # 2 (1 + momentum) / lambda_max, lambda_max ~ d K^2 + 1 for the cluster with
  # feature mean K (the stiffest); `lrs` (absolute) overrides them.
  lr_fractions: tuple = (0.1, 0.4, 0.8)
  lrs: Optional[tuple] = None
  quantiles: tuple = (0.05, 0.1)  # Radius rules tried for FC, MC, Myopic.
  momentum: float = 0.9  # Heavy-ball momentum of every client optimizer.
  num_iters: int = 10  # Threshold-Clustering steps (the paper's l = 10).
  mc_alpha: float = 0.1  # Momentum-Clustering's alpha.
  local_steps: int = 3  # IFCA II, Clustered FL, Ditto (9 samples = 3 x 3).
  cfl_eps: tuple = (1.0, 2.0)  # Clustered FL's (eps1, eps2).
  dim: int = 10
  num_samples: int = 9
  batch_size: Optional[int] = None  # None: full local data (9 samples).
  seed: int = 0
  out: str = "results/synthetic"


@dataclasses.dataclass
class Method:
  """How to build one algorithm from (lr, radius quantile or None)."""
  label: str
  build: Callable
  uses_quantile: bool = False


def methods(data, cfg: Config, num_clusters: int) -> dict:
  """Every algorithm of Figure 3 by name.

  kNN-Per is left out: its personalization is a kNN over a classifier's
  features, which this regression task does not have.
  """
  opt = lambda lr: optax.sgd(lr, momentum=cfg.momentum or None)
  table = {
      "fc": Method("Federated-Clustering", lambda lr, q: (
          prfl.algorithms.federated_clustering(
              LOSS, opt(lr), radius=prfl.quantile_radius(q),
              num_iters=cfg.num_iters)), True),
      # Momentum-Clustering has its own momentum (alpha): plain SGD on top.
      "mc": Method("Momentum-Clustering", lambda lr, q: (
          prfl.algorithms.momentum_clustering(
              LOSS, optax.sgd(lr), num_clusters=num_clusters,
              radius=prfl.quantile_radius(q), num_iters=cfg.num_iters,
              alpha=cfg.mc_alpha)), True),
      "oracle": Method("Ground truth (oracle)", lambda lr, q: (
          prfl.algorithms.oracle(LOSS, opt(lr), clusters=data.clusters))),
      "local": Method("Local", lambda lr, q: prfl.algorithms.local(
          LOSS, opt(lr))),
      "global": Method("Global (FedAvg)", lambda lr, q: (
          prfl.algorithms.fedavg(LOSS, opt(lr)))),
      "myopic": Method("Myopic-Clustering", lambda lr, q: (
          prfl.algorithms.myopic_clustering(
              LOSS, opt(lr), num_clusters=num_clusters,
              radius=prfl.quantile_radius(q), num_iters=cfg.num_iters)), True),
      "ifca": Method("IFCA (Option I)", lambda lr, q: prfl.algorithms.ifca(
          LOSS, opt(lr), num_clusters=num_clusters, option=1,
          key=init_key(cfg.seed))),
      "ifca2": Method(f"IFCA (Option II, {cfg.local_steps} local steps)",
                      lambda lr, q: prfl.algorithms.ifca(
                          LOSS, opt(lr), num_clusters=num_clusters, option=2,
                          local_steps=cfg.local_steps,
                          key=init_key(cfg.seed))),
      "hypcluster": Method(
          f"HypCluster ({cfg.local_steps} steps)",
          lambda lr, q: prfl.algorithms.hypcluster(
              LOSS, opt(lr), num_clusters=num_clusters,
              local_steps=cfg.local_steps, key=init_key(cfg.seed))),
      "cfl": Method("Clustered FL", lambda lr, q: prfl.algorithms.cfl(
          LOSS, opt(lr), eps1=cfg.cfl_eps[0], eps2=cfg.cfl_eps[1],
          max_clusters=2 * num_clusters, local_steps=cfg.local_steps)),
      "ditto": Method("Ditto (lambda=1)", lambda lr, q: prfl.algorithms.ditto(
          LOSS, opt(lr), lam=1.0, local_steps=cfg.local_steps)),
  }
  return table


def init_key(seed: int) -> jax.Array:
  """Key of IFCA's / HypCluster's random initial cluster models."""
  return jax.random.fold_in(jax.random.key(seed), 7)


def validate(cfg: Config):
  """Raises ValueError on a bad configuration, before anything runs.

  The command line checks each option alone (`experiments/cli.py`); this
  checks a `Config` built in code, and the rules that tie options together.
  """
  unknown = set(cfg.algorithms) - set(methods(None, cfg, 1))
  if not cfg.algorithms or unknown:
    raise ValueError(f"`algorithms` must name at least one of "
                     f"{sorted(methods(None, cfg, 1))}; got {cfg.algorithms}.")
  if not cfg.settings or any(k < 1 or n < 1 for k, n in cfg.settings):
    raise ValueError(f"`settings` must be (K, n_i) pairs >= 1, got "
                     f"{cfg.settings}.")
  if cfg.num_rounds < 1 or cfg.eval_every < 1:
    raise ValueError("`num_rounds` and `eval_every` must be >= 1.")
  finite = lambda xs: all(np.isfinite(x) for x in xs)
  if cfg.lrs is not None and (not cfg.lrs or not finite(cfg.lrs) or
                              any(lr <= 0 for lr in cfg.lrs)):
    raise ValueError(f"`lrs` must be finite and positive, got {cfg.lrs}.")
  if (not cfg.lr_fractions or not finite(cfg.lr_fractions) or
      any(f <= 0 for f in cfg.lr_fractions)):
    raise ValueError(
        f"`lr_fractions` must be finite and positive, got {cfg.lr_fractions}.")
  if not cfg.quantiles or any(not 0 < q <= 1 for q in cfg.quantiles):
    raise ValueError(f"`quantiles` must lie in (0, 1], got {cfg.quantiles}.")
  if cfg.batch_size is not None and not 1 <= cfg.batch_size <= cfg.num_samples:
    raise ValueError(f"`--batch-size` must be in [1, {cfg.num_samples}] (the "
                     f"samples per client), got {cfg.batch_size}.")
  if not 0 <= cfg.momentum < 1:
    raise ValueError(f"`momentum` must be in [0, 1), got {cfg.momentum}.")


def learning_rates(cfg: Config, num_clusters: int) -> tuple:
  """The learning-rate grid of a setting (rounded to 2 significant digits)."""
  if cfg.lrs is not None:
    return tuple(cfg.lrs)
  limit = 2 * (1 + cfg.momentum) / (cfg.dim * num_clusters ** 2 + 1)
  return tuple(float(f"{f * limit:.2g}") for f in cfg.lr_fractions)


def with_error(alg: prfl.algorithms.Algorithm, x_star: jax.Array):
  """`alg` whose step metrics also hold the mean error `||x_i - x*||`."""
  def step(state, batch, key):
    state, metrics = alg.step(state, batch, key)
    err = jnp.linalg.norm(state.params - x_star, axis=1)
    return state, {**metrics, "error": jnp.mean(err)}
  return alg._replace(step=step)


def run_grid(cfg: Config, log=print) -> list:
  """Every (setting, algorithm, lr, quantile) run; returns one dict per run.

  The grid of one (setting, algorithm) is one XLA program: `prfl.sweep` vmaps
  a `lax.scan` over rounds over the learning rates and quantiles.
  """
  groups = [(s, a) for s in cfg.settings for a in cfg.algorithms]
  runs, start = [], time.perf_counter()
  for idx, (setting, name) in enumerate(groups):
    data = prfl.data.synthetic_regression(
        jax.random.key(cfg.seed), num_clusters=setting[0],
        clients_per_cluster=setting[1], dim=cfg.dim,
        num_samples=cfg.num_samples)[0]
    n = setting[0] * setting[1]
    method = methods(data, cfg, setting[0])[name]
    points = list(itertools.product(
        learning_rates(cfg, setting[0]),
        cfg.quantiles if method.uses_quantile else (None,)))
    hparams = {"lr": jnp.array([lr for lr, _ in points]),
               "q": jnp.array([q if q is not None else 0.0 for _, q in points])}
    keys = jnp.stack([jax.random.key(cfg.seed + 1)] * len(points))
    x_star = data.test["x_star"]
    make = lambda hp: with_error(method.build(hp["lr"], hp["q"]), x_star)
    sampler = lambda k: prfl.data.sample_batch(k, data.train, cfg.batch_size)
    t0 = time.perf_counter()
    out = jax.jit(lambda h, k: prfl.sweep.sweep(
        make, h, jnp.zeros((n, cfg.dim)), sampler, cfg.num_rounds, keys=k))(
            hparams, keys)
    errors = np.asarray(out.metrics["error"])  # [G, T]
    with np.errstate(over="ignore", invalid="ignore"):  # Diverged runs.
      finals = np.linalg.norm(np.asarray(out.state.params) -
                              np.asarray(x_star)[None], axis=2)  # [G, N]
    seconds = time.perf_counter() - t0
    initial = float(np.mean(np.linalg.norm(np.asarray(x_star), axis=1)))
    eval_round = np.arange(0, cfg.num_rounds + 1, cfg.eval_every)
    clusters = np.asarray(data.clusters)
    for g, (lr, q) in enumerate(points):
      curve = np.concatenate([[initial], errors[g]])[eval_round]
      final = float(errors[g, -1]) if np.isfinite(errors[g, -1]) else np.inf
      client = np.where(np.isfinite(finals[g]), finals[g], np.inf)
      runs.append({
          "setting": f"{setting[0]}x{setting[1]}", "algorithm": name,
          "lr": lr, "quantile": q, "final_error": final,
          "final_client_errors": client,
          "final_error_per_cluster": np.array(
              [client[clusters == k].mean() for k in range(setting[0])]),
          "eval_round": eval_round, "error": curve,
          "seconds": seconds / len(points)})
    best = min(r["final_error"] for r in runs[-len(points):])
    elapsed = time.perf_counter() - start
    left = elapsed / (idx + 1) * (len(groups) - idx - 1)
    log(f"[{idx + 1}/{len(groups)}] {setting[0]}x{setting[1]} {name:7s} "
        f"{len(points)} grid points in one program: best final error "
        f"{best:.3g} ({seconds:.1f}s; {elapsed:.0f}s elapsed, ~{left:.0f}s "
        "left)")
  return runs


def best_runs(runs: list) -> dict:
  """(setting, algorithm) -> the run with the lowest final error."""
  best = {}
  for r in runs:
    key = (r["setting"], r["algorithm"])
    if key not in best or r["final_error"] < best[key]["final_error"]:
      best[key] = r
  return best


def assumption_trace(cfg: Config, setting: tuple, lr: float,
                     num_rounds: int) -> dict:
  """A^2 and Delta^2 estimates at every round of a ground-truth run (Fig. 2).

  One `lax.scan` over oracle rounds that also evaluates the diagnostics.
  """
  data = prfl.data.synthetic_regression(
      jax.random.key(cfg.seed), num_clusters=setting[0],
      clients_per_cluster=setting[1], dim=cfg.dim,
      num_samples=cfg.num_samples)[0]
  n = setting[0] * setting[1]
  alg = prfl.algorithms.oracle(
      LOSS, optax.sgd(lr, momentum=cfg.momentum or None),
      clusters=data.clusters)

  @jax.jit
  def run(state, key):
    def body(state, k):
      consts = prfl.diagnostics.assumption_constants(
          LOSS, state.params, data.train, data.clusters)
      state, _ = alg.step(state, data.train, k)
      return state, consts
    return lax.scan(body, state, jax.random.split(key, num_rounds))

  _, consts = run(alg.init(jnp.zeros((n, cfg.dim))), jax.random.key(cfg.seed))
  consts = {k: np.asarray(v) for k, v in consts.items()}
  # Once the cluster gradient is at float32 rounding level the ratio is noise.
  consts["intra_ratio"] = np.where(consts["cluster_grad_sq"] > GRAD_FLOOR,
                                   consts["intra_ratio"], np.nan)
  return consts


def plot_figure3(best: dict, cfg: Config, path: str):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  settings = [f"{k}x{n}" for k, n in cfg.settings]
  fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4),
                           squeeze=False)
  labels = {k: m.label for k, m in methods(None, cfg, 1).items()}
  for ax, s in zip(axes[0], settings):
    for name in cfg.algorithms:
      r = best.get((s, name))
      if r is None:
        continue
      q = f", q={r['quantile']}" if r["quantile"] is not None else ""
      ax.semilogy(r["eval_round"], np.maximum(r["error"], 1e-8),
                  label=f"{labels[name]} (lr={r['lr']}{q})")
    k, n = s.split("x")
    ax.set_title(f"K={k}, n_i={n}")
    ax.set_xlabel("round")
    ax.set_ylabel(r"mean $\|x_i - x^\star\|$ (benign clients)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("Synthetic linear regression (Werner et al. 2023, Fig. 3)")
  common.save_figure(fig, path)
  plt.close(fig)


def plot_figure2(consts: dict, clusters: np.ndarray, path: str):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  titles = {"intra_ratio": (r"intra-cluster ratio (bounded by $A^2$)" "\n"
                            r"(blank once $\|\nabla\bar f_i\|$ is at float "
                            "precision)", max),
            "inter_sq_dist": (r"inter-cluster $\|\nabla f_i - \nabla f_j\|^2$"
                              r" (bounded below by $\Delta^2$)", min)}
  for ax, (name, (title, bound)) in zip(axes, titles.items()):
    v = consts[name]  # [T, N]
    rounds = np.arange(v.shape[0])
    ax.semilogy(rounds, v, color="0.8", lw=0.5)
    for k in np.unique(clusters):
      ax.semilogy(rounds, v[:, clusters == k].mean(1), color="k", lw=1)
    b = np.nanmax(v) if bound is max else np.nanmin(v)
    ax.axhline(max(b, 1e-12), color="r", ls="--",
               label=f"empirical bound {b:.3g}")
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.legend()
  fig.suptitle("Assumptions 4 and 5 along a ground-truth run "
               "(Werner et al. 2023, Fig. 2)", y=1.06)
  common.save_figure(fig, path)
  plt.close(fig)


def _setting(text: str) -> tuple:
  """Option item type: `KxN` -> (K, N), both >= 1."""
  try:
    k, n = (int(v) for v in text.lower().split("x"))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"must look like 4x16 (K clusters x n_i clients), got {text!r}"
    ) from None
  if k < 1 or n < 1:
    raise argparse.ArgumentTypeError(f"sizes must be >= 1, got {text!r}")
  return k, n


def build_parser() -> argparse.ArgumentParser:
  """The command line; every option is checked before anything runs."""
  p = cli.parser(__doc__, out=Config.out, smoke={
      "settings": "2x3", "rounds": "20", "eval_every": "10", "lrs": "0.001",
      "quantiles": "0.3", "algorithms": "fc,oracle,local,global,ifca"})
  p.add_argument("--settings", type=cli.list_of(_setting),
                 default="4x4,4x16,16x4",
                 help="comma-separated KxN_I settings")
  p.add_argument("--algorithms", type=cli.choices(Config.algorithms),
                 default=",".join(Config.algorithms))
  p.add_argument("--rounds", type=cli.positive_int, default=Config.num_rounds)
  p.add_argument("--eval-every", type=cli.positive_int,
                 default=Config.eval_every)
  p.add_argument("--lrs", type=cli.list_of(cli.real(0, low_open=True)),
                 default=None,
                 help="absolute learning rates (default: fractions "
                 f"{Config.lr_fractions} of each setting's stability limit)")
  p.add_argument("--lr-fractions",
                 type=cli.list_of(cli.real(0, 2, low_open=True)),
                 default=",".join(map(str, Config.lr_fractions)))
  p.add_argument("--quantiles",
                 type=cli.list_of(cli.real(0, 1, low_open=True)),
                 default=",".join(map(str, Config.quantiles)))
  p.add_argument("--momentum", type=cli.real(0, 1, high_open=True),
                 default=Config.momentum)
  p.add_argument("--batch-size", type=cli.positive_int, default=None)
  p.add_argument("--no-plots", action="store_true")
  return p


def config_from(args: argparse.Namespace) -> Config:
  return Config(settings=args.settings, algorithms=args.algorithms,
                num_rounds=args.rounds, eval_every=args.eval_every,
                lrs=args.lrs, lr_fractions=args.lr_fractions,
                quantiles=args.quantiles, momentum=args.momentum,
                batch_size=args.batch_size, seed=args.seed, out=args.out)


def main(argv=None):
  args = cli.parse(build_parser(), argv,
                   check=lambda a: validate(config_from(a)))
  cfg = config_from(args)
  cli.write_config(cfg.out, cfg, extra={"smoke": args.smoke})

  log = lambda s: print(s, flush=True)
  log(f"Synthetic federation: settings {cfg.settings}, {cfg.num_rounds} rounds,"
      f" quantiles {cfg.quantiles}, momentum {cfg.momentum}; learning rates "
      + ", ".join(f"{k}x{n}: {learning_rates(cfg, k)}" for k, n in cfg.settings))
  runs = run_grid(cfg, log)
  best = best_runs(runs)

  first = cfg.settings[0]
  oracle_lr = best.get((f"{first[0]}x{first[1]}", "oracle"),
                       {"lr": learning_rates(cfg, first[0])[0]})
  consts = assumption_trace(cfg, first, oracle_lr["lr"],
                            min(cfg.num_rounds, 300))
  clusters = np.repeat(np.arange(first[0]), first[1])

  rows = []
  for (s, name), r in best.items():
    rows.append({"setting": s, "algorithm": name, "best_lr": r["lr"],
                 "quantile": "" if r["quantile"] is None else r["quantile"],
                 "final_error": f"{r['final_error']:.4g}",
                 "median_client_error":
                     f"{float(np.median(r['final_client_errors'])):.3g}",
                 "clients_solved": "{}/{}".format(
                     int(np.sum(r["final_client_errors"] < SOLVED)),
                     len(r["final_client_errors"])),
                 "worst_cluster_error":
                     f"{float(np.max(r['final_error_per_cluster'])):.4g}"})
  a2 = float(np.nanmax(consts["intra_ratio"]))
  d2 = float(np.nanmin(consts["inter_sq_dist"]))
  common.write_json(f"{cfg.out}/results.json", {
      "config": dataclasses.asdict(cfg), "runs": runs,
      "best": rows, "assumptions": {"setting": f"{first[0]}x{first[1]}",
                                    "A2_estimate": a2, "Delta2_estimate": d2,
                                    **consts}})
  common.write_csv(f"{cfg.out}/summary.csv", rows)
  if not args.no_plots:
    plot_figure3(best, cfg, f"{cfg.out}/figure3.png")
    plot_figure2(consts, clusters, f"{cfg.out}/figure2.png")
  log("\nFinal error ||x_i - x*|| at the best grid point (mean, worst cluster, "
      f"median client; solved: error < {SOLVED:g}):")
  log(common.format_table(list(rows[0]), [list(r.values()) for r in rows]))
  log(f"\nAssumptions 4-5 along the oracle run ({first[0]}x{first[1]}): "
      f"A^2 <= {a2:.3g}, Delta^2 >= {d2:.3g}")
  log(f"Wrote {cfg.out}/results.json, summary.csv"
      + ("" if args.no_plots else ", figure3.png, figure2.png"))
  return runs


if __name__ == "__main__":
  main(sys.argv[1:])
