"""The synthetic experiment's runs: the grids of Figure 3, the trace of
Figure 2, and the outputs."""

import itertools
import os
import time

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import optax

import prfl_jax as prfl
from experiments import files
from experiments import options
from experiments import registry
from experiments.synthetic import config
from experiments.synthetic import figures

LOSS = prfl.data.regression_loss
SOLVED = 1e-2  # A client is "solved" when ||x_i - x*|| < SOLVED.
GRAD_FLOOR = 1e-6  # ||grad f_bar_i||^2 below which A^2 is not estimated.


def federation(cfg, setting: tuple):
  return prfl.data.synthetic_regression(
      jax.random.key(cfg.run.seed), num_clusters=setting[0],
      clients_per_cluster=setting[1], dim=cfg.dim,
      num_samples=cfg.num_samples)[0]


def with_error(alg: prfl.algorithms.Algorithm, x_star: jax.Array):
  """`alg` whose step metrics also hold the mean error `||x_i - x*||`."""
  def step(state, batch, key):
    state, metrics = alg.step(state, batch, key)
    err = jnp.linalg.norm(state.params - x_star, axis=1)
    return state, {**metrics, "error": jnp.mean(err)}
  return alg._replace(step=step)


def grid_points(cfg, setting: tuple, name: str) -> list:
  """(lr, quantile or None) of one (setting, algorithm) grid."""
  return list(itertools.product(
      config.learning_rates(cfg, setting[0]),
      cfg.quantiles if name in config.USES_QUANTILE else (None,)))


def run_grid(cfg, tracker) -> list:
  """Every (setting, algorithm, lr, quantile) run; returns one dict per run.

  The grid of one (setting, algorithm) is one XLA program: `prfl.sweep` vmaps
  a `lax.scan` over rounds over the learning rates and quantiles, each built
  through the registry from traced values.
  """
  settings = [config.parse_setting(s) for s in cfg.settings]
  jobs = [(s, a) for s in settings for a in cfg.algorithms.algorithms]
  runs, start = [], time.perf_counter()
  for idx, (setting, name) in enumerate(jobs):
    data = federation(cfg, setting)
    n = setting[0] * setting[1]
    points = grid_points(cfg, setting, name)
    hparams = {"lr": jnp.array([lr for lr, _ in points]),
               "q": jnp.array([q if q is not None else 0.0 for _, q in points])}
    keys = jnp.stack([jax.random.key(cfg.run.seed + 1)] * len(points))
    x_star = data.test["x_star"]
    ctx = registry.Context(
        LOSS, clusters=data.clusters, num_clusters=setting[0],
        key=jax.random.fold_in(jax.random.key(cfg.run.seed), 7))
    base = registry.settings(cfg, name)
    make = lambda hp: with_error(registry.build(name, ctx, registry.Settings(
        {**base, "lr": hp["lr"], "quantile": hp["q"]})), x_star)
    sampler = lambda k: prfl.data.sample_batch(k, data.train,
                                               cfg.sgd.batch_size)
    t0 = time.perf_counter()
    out = jax.block_until_ready(jax.jit(lambda h, k: prfl.sweep.sweep(
        make, h, jnp.zeros((n, cfg.dim)), sampler, cfg.schedule.rounds,
        keys=k))(hparams, keys))
    seconds = time.perf_counter() - t0
    runs += summarise(cfg, setting, name, points, out, data, seconds)
    for g, (lr, q) in enumerate(points):
      tracker.history(
          f"{setting[0]}x{setting[1]}/{name}/lr{lr:g}" + (
              f"_q{q:g}" if q is not None else ""),
          {"round": np.arange(1, cfg.schedule.rounds + 1),
           **{f"train/{k}": np.asarray(v)[g]
              for k, v in out.metrics.items() if np.ndim(v) == 2}})
    best = min(r["final_error"] for r in runs[-len(points):])
    elapsed = time.perf_counter() - start
    left = elapsed / (idx + 1) * (len(jobs) - idx - 1)
    tracker.log(f"[{idx + 1}/{len(jobs)}] {setting[0]}x{setting[1]} "
                f"{name:7s} {len(points)} grid points in one program: best "
                f"final error {best:.3g} ({seconds:.1f}s; {elapsed:.0f}s "
                f"elapsed, ~{left:.0f}s left)")
  return runs


def summarise(cfg, setting, name, points, out, data, seconds) -> list:
  """One dict per grid point: final errors, per client and cluster, curve."""
  rounds, every = cfg.schedule.rounds, cfg.schedule.eval_every
  x_star = np.asarray(data.test["x_star"])
  errors = np.asarray(out.metrics["error"])  # [G, T]
  with np.errstate(over="ignore", invalid="ignore"):  # Diverged runs.
    finals = np.linalg.norm(np.asarray(out.state.params) - x_star[None],
                            axis=2)  # [G, N]
  initial = float(np.mean(np.linalg.norm(x_star, axis=1)))
  eval_round = np.arange(0, rounds + 1, every)
  clusters = np.asarray(data.clusters)
  runs = []
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
  return runs


def best_runs(runs: list) -> dict:
  """(setting, algorithm) -> the run with the lowest final error."""
  best = {}
  for r in runs:
    key = (r["setting"], r["algorithm"])
    if key not in best or r["final_error"] < best[key]["final_error"]:
      best[key] = r
  return best


def assumption_trace(cfg, setting: tuple, lr: float, num_rounds: int) -> dict:
  """A^2 and Delta^2 estimates at every round of a ground-truth run (Fig. 2).

  One `lax.scan` over oracle rounds that also evaluates the diagnostics.
  """
  data = federation(cfg, setting)
  n = setting[0] * setting[1]
  alg = prfl.algorithms.oracle(
      LOSS, optax.sgd(lr, momentum=cfg.sgd.momentum or None),
      clusters=data.clusters)

  @jax.jit
  def run(state, key):
    def body(state, k):
      consts = prfl.diagnostics.assumption_constants(
          LOSS, state.params, data.train, data.clusters)
      state, _ = alg.step(state, data.train, k)
      return state, consts
    return lax.scan(body, state, jax.random.split(key, num_rounds))

  _, consts = run(alg.init(jnp.zeros((n, cfg.dim))),
                  jax.random.key(cfg.run.seed))
  consts = {k: np.asarray(v) for k, v in consts.items()}
  # Once the cluster gradient is at float32 rounding level the ratio is noise.
  consts["intra_ratio"] = np.where(consts["cluster_grad_sq"] > GRAD_FLOOR,
                                   consts["intra_ratio"], np.nan)
  return consts


def summary_rows(best: dict) -> list:
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
  return rows


def run(cfg, prepared, tracker, command: str = "") -> list:
  """Figures 3 and 2; writes results.json, summary.csv and the figures."""
  del prepared, command  # Nothing to load; the command is in config.json.
  out = cfg.run.out
  tracker.log(
      f"Synthetic federation: settings {cfg.settings}, {cfg.schedule.rounds}"
      f" rounds, quantiles {cfg.quantiles}, momentum {cfg.sgd.momentum}; "
      "learning rates " + ", ".join(
          f"{s}: {config.learning_rates(cfg, config.parse_setting(s)[0])}"
          for s in cfg.settings))
  runs = run_grid(cfg, tracker)
  best = best_runs(runs)
  first = config.parse_setting(cfg.settings[0])
  oracle = best.get((cfg.settings[0], "oracle"),
                    {"lr": config.learning_rates(cfg, first[0])[0]})
  consts = assumption_trace(cfg, first, oracle["lr"],
                            min(cfg.schedule.rounds, 300))
  rows = summary_rows(best)
  a2 = float(np.nanmax(consts["intra_ratio"]))
  d2 = float(np.nanmin(consts["inter_sq_dist"]))
  files.write_json(os.path.join(out, "results.json"), {
      "config": options.to_dict(cfg), "runs": runs, "best": rows,
      "assumptions": {"setting": cfg.settings[0], "A2_estimate": a2,
                      "Delta2_estimate": d2, **consts}})
  files.write_csv(os.path.join(out, "summary.csv"), rows)
  if cfg.run.plots:
    figures.plot_figure3(best, cfg, os.path.join(out, "figure3.png"))
    figures.plot_figure2(consts, np.repeat(np.arange(first[0]), first[1]),
                         os.path.join(out, "figure2.png"))
  tracker.log("\nFinal error ||x_i - x*|| at the best grid point (mean, worst "
              f"cluster, median client; solved: error < {SOLVED:g}):")
  tracker.log(files.text_table(list(rows[0]),
                               [list(r.values()) for r in rows]))
  tracker.log(f"\nAssumptions 4-5 along the oracle run ({cfg.settings[0]}): "
              f"A^2 <= {a2:.3g}, Delta^2 >= {d2:.3g}")
  tracker.log(f"Wrote results.json, summary.csv"
              + (", figure3.png, figure2.png" if cfg.run.plots else "")
              + f" to {out}")
  return runs
