"""A grid over Table 1's options, from a file, as few programs as possible.

Every option of `experiments.mnist` is an option here too, plus `grid`: a
table of options to sweep, each with its values. The grid is the product of
the values; for every (task, algorithm), the grid points that differ only in
values JAX can trace (`TRACED`: the learning rate and the radius quantile)
run as ONE XLA program (`prfl.sweep`: a vmap of a `lax.scan` over rounds);
the other options (batch size, rounds, groups, ...) split the grid into one
program per value. One table across the grid: final accuracy and loss of
each client's own model on its own test data, over benign clients.

  python -m experiments.sweep --config experiments/configs/sweep/digits_fc_lr_quantile.toml

In a sweep every grid point sees the same initial model and batches, but the
random streams are `prfl.sweep`'s (not `prfl.train`'s): a grid point's
numbers are not those of the same settings in `experiments.mnist`.

Writes `config.json` (first), `table.md`, `results.json` and `tensorboard/`
(the step metrics of every grid point) to `--out` (default
`results/sweep`).
"""

import dataclasses
import itertools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from experiments import cli
from experiments import files
from experiments import groups
from experiments import options
from experiments import registry
from experiments import training
from experiments.mnist import config as table1
from experiments.mnist import report as table1_report
from experiments.mnist import run as table1_run
from experiments.options import group, option
from prfl_jax.train import personalized_eval

TRACED = ("lr", "quantile")  # Settings built into the program as arrays.


@dataclasses.dataclass(frozen=True)
class Config(table1.Config):
  """Table 1's options and the grid (default: FC alone)."""
  algorithms: registry.Algorithms = group(registry.Algorithms,
                                          algorithms=("fc",))
  grid: dict = option({}, "settings to sweep and their values ([grid] in "
                      "files: lr = [0.05, 0.1]; repeatable)",
                      groups=groups.SETTINGS, grid=True)


def resolve(cfg: Config) -> Config:
  """Table 1's checks, then the grid's.

  Raises:
    ValueError: naming the option.
  """
  if not cfg.grid:
    raise ValueError("--grid: nothing to sweep; give [grid] in a --config "
                     "file, e.g. lr = [0.05, 0.1].")
  if "knn" in cfg.algorithms.algorithms:
    raise ValueError("--algorithms: kNN-Per's evaluation does not run in a "
                     "sweep.")
  out = cfg.run.out or os.path.join("results", "sweep")
  cfg = table1.resolve(options.replace(cfg, out=out))
  for point in points(cfg):
    for name in cfg.algorithms.algorithms:
      s = settings(cfg, name, point)
      training.federation_sizes(
          cfg.data.dataset, cfg.federation.clusters,
          cfg.federation.clients_per_cluster,
          train=cfg.federation.train_per_client,
          test=cfg.federation.test_per_client, batch_size=s.batch_size,
          groups=s.groups)
  return cfg


def points(cfg) -> list:
  """Every grid point, `{option: value}`, the last option varying fastest."""
  names = list(cfg.grid)
  return [dict(zip(names, values)) for values in itertools.product(
      *(_values(cfg.grid[n]) for n in names))]


def _values(entry) -> list:
  return list(entry) if isinstance(entry, (list, tuple)) else [entry]


def settings(cfg, name: str, point: dict) -> registry.Settings:
  return registry.Settings({**registry.settings(cfg, name), **point})


def prepare(cfg):
  return table1_run.prepare(cfg)


def run_programs(cfg, name: str, fed, model, tracker, tag: str) -> list:
  """Every grid point of one (task, algorithm); one program per value of
  the options that are not traced."""
  grid = points(cfg)
  static = lambda p: tuple((k, v) for k, v in p.items() if k not in TRACED)
  by_static = {}
  for i, p in enumerate(grid):
    by_static.setdefault(static(p), []).append(i)
  init_key, alg_key, train_key = jax.random.split(
      jax.random.key(cfg.run.seed), 3)
  ctx = training.context(fed, model.loss_fn, alg_key)
  n = fed.data.clusters.shape[0]
  params = prfl.tree.broadcast(model.init(init_key), n)
  clusters = jnp.asarray(fed.data.clusters)
  data = jax.device_put(fed.data)
  rows = [None] * len(grid)
  for fixed, idx in by_static.items():
    base = settings(cfg, name, dict(fixed))
    hparams = {k: jnp.array([float(settings(cfg, name, grid[i])[k])
                             for i in idx]) for k in TRACED}
    make = lambda hp, base=base: registry.build(name, ctx, registry.Settings(
        {**base, **hp}))
    evaluate = lambda state: personalized_eval(
        model.eval_fn, state.params, data.test, clusters, state.byzantine,
        ctx.num_clusters)
    sampler = lambda k, b=base.batch_size: prfl.data.sample_batch(
        k, data.train, b)
    start = time.perf_counter()
    out = jax.block_until_ready(jax.jit(lambda h, k, base=base: (
        prfl.sweep.sweep(make, h, params, sampler, base.rounds, keys=k,
                         evaluate=evaluate,
                         init_kwargs={"byzantine": fed.byzantine})))(
                             hparams, jnp.stack([train_key] * len(idx))))
    seconds = time.perf_counter() - start
    every = training.eval_every(base)
    for j, i in enumerate(idx):
      history = {"round": np.arange(1, base.rounds + 1),
                 "eval_round": np.unique(np.r_[0:base.rounds:every,
                                               base.rounds]),
                 **{f"train/{k}": np.asarray(v)[j]
                    for k, v in out.metrics.items() if np.ndim(v) == 2}}
      rows[i] = {"point": grid[i], "accuracy": float(out.final["accuracy"][j]),
                 "loss": float(out.final["loss"][j]),
                 "seconds": seconds / len(idx), "program_points": len(idx),
                 # The step metrics (e.g. the clustering diagnostics) over
                 # every `eval_every` rounds, ending at these rounds.
                 "train_round": history["eval_round"][1:].tolist(),
                 "train_curves": training.interval_means(history)}
      label = ",".join(f"{k}={v}" for k, v in grid[i].items())
      tracker.history(f"{tag}/{label}", history)
    tracker.log(f"  {tag}: {len(idx)} grid points in one program "
                f"({seconds:.1f}s)")
  return rows


def table(cfg, results: dict) -> str:
  """Rows: grid points; columns: accuracy and loss per (task, algorithm)."""
  grid = points(cfg)
  header = list(cfg.grid)
  for task in cfg.tasks:
    for name in cfg.algorithms.algorithms:
      label = f"{task.replace('_', ' ')} {registry.label(name)}"
      header += [f"{label} acc. %", f"{label} loss"]
  rows = []
  for i, point in enumerate(grid):
    row = [f"{v:g}" if isinstance(v, float) else v for v in point.values()]
    for task in cfg.tasks:
      for name in cfg.algorithms.algorithms:
        r = results[task][name][i]
        row += [f"{100 * r['accuracy']:.1f}", f"{r['loss']:.3f}"]
    rows.append(row)
  return files.markdown_table(header, rows)


def run(cfg, prepared, tracker, command: str = "") -> dict:
  start = time.perf_counter()
  tracker.log(f"Sweep over {dict(cfg.grid)}: {len(points(cfg))} grid points"
              f" x {len(cfg.tasks)} tasks x {len(cfg.algorithms.algorithms)}"
              " algorithms")
  results = {}
  for task in cfg.tasks:
    fed = prepared.federations[task]
    results[task] = {name: run_programs(cfg, name, fed, prepared.model,
                                        tracker, f"{task}/{name}")
                     for name in cfg.algorithms.algorithms}
  seconds = time.perf_counter() - start
  text = (table(cfg, results) + f"\n- command: `{command}`\n- data: "
          f"{prepared.source}\n- settings: "
          f"{table1_report.settings_line(cfg)} (grid values replace these)\n"
          f"- wall time: {seconds:.0f}s\n")
  files.write_text(os.path.join(cfg.run.out, "table.md"), text)
  files.write_json(os.path.join(cfg.run.out, "results.json"), {
      "config": options.to_dict(cfg), "versions": files.versions(),
      "seconds": seconds, "results": results})
  tracker.log("\n" + text)
  return results


EXPERIMENT = cli.Experiment("sweep", __doc__, Config, resolve, prepare, run)

main = EXPERIMENT.main


if __name__ == "__main__":
  main()
