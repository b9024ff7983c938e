"""The Byzantine experiment's runs: Figure 6 and the attack grid."""

import os
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from experiments import files
from experiments import options
from experiments import registry
from experiments import training
from experiments.byzantine import cells
from experiments.byzantine import config
from experiments.byzantine import figures
from experiments.byzantine import report


class Prepared(NamedTuple):
  """The data of a run, loaded before anything is written."""
  source: str
  model: training.Model
  grid: dict  # Byzantine fraction -> federation.
  figure6: object  # The Figure 6 federation, or None.


def federation(ds, cfg, part: str, fraction: float) -> prfl.data.Federation:
  """The grid's federation has `cfg.heterogeneity`'s clients (Dirichlet:
  K pools of one task, each split by label skew); Figure 6's is always
  private-label."""
  sizes = config.part_sizes(cfg, part)
  alpha = config.HETEROGENEITY[cfg.heterogeneity] if part == "grid" else None
  split = ({"task": "private_label"} if alpha is None else
           {"task": "none", "partition": "dirichlet", "alpha": alpha})
  fed = prfl.data.federate(
      ds, num_clusters=cfg.federation.clusters,
      clients_per_cluster=sizes.clients_per_cluster,
      train_per_client=sizes.train_per_client,
      test_per_client=sizes.test_per_client, byzantine_fraction=fraction,
      seed=cfg.run.seed, **split)
  if alpha is None:
    # A Dirichlet client may hold fewer examples than a batch (at alpha
    # 0.1 on digits, one): its batches are padded and the padding masked.
    training.check_batches_are_valid(fed, cfg.optim.batch_size)
  return fed


def prepare(cfg) -> Prepared:
  """Loads the data and builds every federation the run needs."""
  ds, model = training.load_images(cfg)
  grid = {}
  if cfg.part in ("both", "grid"):
    grid = {f: federation(ds, cfg, "grid", f) for f in sorted(cfg.fractions)}
  fig6 = None
  if cfg.part in ("both", "figure6"):
    fig6 = federation(ds, cfg, "figure6", cfg.fig6_byzantine_fraction)
  return Prepared(f"{ds.source}, {len(ds.labels)} images", model, grid, fig6)


def flip_labels(fed: prfl.data.Federation) -> prfl.data.Federation:
  """Byzantine clients train on flipped labels y -> C - 1 - y."""
  x, y = fed.data.train
  y = np.asarray(prfl.attacks.flip_labels(jnp.asarray(y),
                                          jnp.asarray(fed.byzantine),
                                          fed.num_classes))
  return fed._replace(data=fed.data._replace(train=(x, y)))


def _settings(cfg, name: str, part: str) -> registry.Settings:
  s = registry.settings(cfg, name)
  if cfg.clustering.groups is None and "groups" not in (
      cfg.algorithms.per_algorithm.get(name, {})):
    s = registry.Settings({**s, "groups": config.part_sizes(cfg, part).groups})
  return s


def _context(cfg, prepared: Prepared, s, name: str, attack_name: str, fed):
  num_byzantine = int(np.sum(fed.byzantine))
  return training.context(
      fed, prepared.model.loss_fn,
      jax.random.fold_in(jax.random.key(cfg.run.seed), 1),
      attack=config.make_attack(attack_name, s, name, num_byzantine,
                                cfg.edge_clustering),
      num_byzantine=num_byzantine)


def _keys(cfg):
  """`(init_key, train_key)`: the same seed gives every method the same
  initial model and batches."""
  init_key, _, train_key = jax.random.split(jax.random.key(cfg.run.seed), 3)
  return init_key, train_key


def _ball_stats(r: dict) -> dict:
  """FC: shares of a client's group inside its ball, over the last 10%."""
  tail = r.pop("tail_train_metrics")
  r.pop("final_train_metrics")
  for stat in ("byzantine_in_ball", "ball_fraction"):
    r[stat] = tail.get(stat)
  return r


def run_one(cfg, name: str, attack_name: str, fed, part: str,
            prepared: Prepared, tracker, tag: str) -> dict:
  """Trains algorithm `name` on `fed` under an attack; benign accuracy,
  curves, non-finite benign models and FC's ball statistics."""
  init_key, train_key = _keys(cfg)
  s = _settings(cfg, name, part)
  if attack_name == "label_flip":
    fed = flip_labels(fed)
  ctx = _context(cfg, prepared, s, name, attack_name, fed)
  params = prfl.tree.broadcast(prepared.model.init(init_key),
                               fed.byzantine.shape[0])
  return _ball_stats(training.train(
      name, s, ctx, fed, prepared.model, params, train_key=train_key,
      tracker=tracker, tag=tag))


def run_cells(cfg, name: str, attack_name: str, fractions, prepared: Prepared,
              tracker) -> list:
  """`run_one` for the grid federations of several Byzantine fractions at
  once, one vmapped program (`cells.train_cells`); one row per fraction,
  `seconds` the shared wall time of all `cells`."""
  s = _settings(cfg, name, "grid")
  feds = [prepared.grid[f] for f in fractions]
  if attack_name == "label_flip":
    feds = [flip_labels(f) for f in feds]
  ctx = _context(cfg, prepared, s, name, attack_name, feds[0])
  if any(not np.array_equal(f.data.clusters, ctx.clusters) for f in feds):
    raise ValueError("grid cells of one program need the same true clusters "
                     "(the algorithms read them).")
  init_key, train_key = _keys(cfg)
  data, byzantine = cells.stack(feds)
  start = time.perf_counter()
  results = cells.train_cells(
      registry.build(name, ctx, s),
      prfl.tree.broadcast(prepared.model.init(init_key), byzantine.shape[1]),
      data, byzantine, num_rounds=s.rounds,
      keys=jnp.stack([train_key] * len(feds)), batch_size=s.batch_size,
      eval_fn=prepared.model.eval_fn, num_clusters=ctx.num_clusters,
      eval_every=training.eval_every(s),
      log=tracker.train_log(f"grid/cells/{attack_name}/{name}", s.rounds))
  seconds = time.perf_counter() - start
  rows = []
  for f, fed, result in zip(fractions, feds, results):
    tracker.history(f"grid/{int(100 * f)}pct/{attack_name}/{name}",
                    result.history)
    r = training.summarise(result, fed.byzantine)
    r.update(algorithm=name, seconds=seconds, rounds=s.rounds,
             batch_size=s.batch_size, cells=len(feds))
    rows.append(_ball_stats(r))
  return rows


def _progress(tracker, index: int, total: int, what: str, r: dict,
              start: float):
  extra = (f", Byzantine in ball {r['byzantine_in_ball']:.3f}"
           if r["byzantine_in_ball"] is not None else "")
  tracker.log(training.progress_line(index, total, what + extra, r, start))


def run_grid(cfg, prepared: Prepared, tracker) -> list:
  """Every grid run, one at a time or (`--cells`) the fractions of each
  attack and method as one program; `rows_so_far.json` holds the finished
  ones (a long grid stopped early keeps its numbers). Rows in
  `config.grid_jobs` order."""
  jobs, rows, start = config.grid_jobs(cfg), [], time.perf_counter()
  for f, fed in prepared.grid.items():
    tracker.log(f"Federation (Byzantine fraction {f:g}): {fed.description}")
  batches = (config.cell_groups(cfg) if cfg.cells else
             [(a, m, (f,)) for f, a, m in jobs])
  for attack, method, fractions in batches:
    if cfg.cells:
      new = run_cells(cfg, method, attack, fractions, prepared, tracker)
    else:
      new = [run_one(cfg, method, attack, prepared.grid[fractions[0]],
                     "grid", prepared, tracker,
                     tag=f"grid/{int(100 * fractions[0])}pct/{attack}/"
                     f"{method}")]
    for fraction, r in zip(fractions, new):
      r.update(fraction=fraction, attack=attack, method=method,
               num_byzantine=int(np.sum(prepared.grid[fraction].byzantine)))
      rows.append(r)
      what = (f"{int(100 * fraction)}% {config.ATTACK_LABELS[attack]} "
              f"{registry.label(method)}")
      _progress(tracker, len(rows), len(jobs), what, r, start)
    rows.sort(key=lambda r: jobs.index((r["fraction"], r["attack"],
                                        r["method"])))
    files.write_json(os.path.join(cfg.run.out, "rows_so_far.json"),
                     {"config": options.to_dict(cfg), "rows": rows})
  return rows


def run_figure6(cfg, prepared: Prepared, tracker) -> list:
  fed = prepared.figure6
  tracker.log(f"Figure 6 federation: {fed.description}")
  jobs = [(a, m) for a in ("large", "bit_flip", "none")
          for m in ("fc", "global")]
  runs, start = [], time.perf_counter()
  for i, (attack, method) in enumerate(jobs, 1):
    what = (f"Figure 6 {config.ATTACK_LABELS[attack]} "
            f"{registry.label(method)}")
    r = run_one(cfg, method, attack, fed, "figure6", prepared, tracker,
                tag=f"figure6/{attack}/{method}")
    r.update(attack=attack, method=method)
    runs.append(r)
    _progress(tracker, i, len(jobs), what, r, start)
  return runs


def run(cfg, prepared: Prepared, tracker, command: str = "") -> dict:
  """Runs the requested parts of `cfg` and writes the outputs."""
  start, load_start = time.perf_counter(), os.getloadavg()
  tracker.log(f"Data: {prepared.source}")
  out = cfg.run.out
  header = lambda: report.header(cfg, prepared, command, start, load_start)
  result = {"config": options.to_dict(cfg)}
  if cfg.part in ("both", "figure6"):
    runs = run_figure6(cfg, prepared, tracker)
    files.write_json(os.path.join(out, "figure6.json"),
                     {"header": header(), "runs": runs})
    files.write_text(os.path.join(out, "figure6.md"),
                     report.figure6_markdown(runs, header()))
    if cfg.run.plots:
      figures.plot_figure6(cfg, runs, os.path.join(out, "figure6.png"))
    result["figure6"] = runs
  if cfg.part in ("both", "grid"):
    rows = run_grid(cfg, prepared, tracker)
    checks = report.grid_checks(cfg, rows)
    h = {**header(), "checks": checks}
    files.write_json(os.path.join(out, "grid.json"),
                     {"header": h, "checks": checks, "rows": rows})
    files.write_csv(os.path.join(out, "grid.csv"), [
        {k: (round(v, 4) if isinstance(v, float) else v)
         for k, v in r.items() if k not in (
             "eval_round", "curve_accuracy", "curve_loss",
             "accuracy_per_cluster", "loss_per_cluster")}
        for r in rows])
    files.write_text(os.path.join(out, "grid.md"),
                     report.grid_markdown(cfg, rows, h))
    worst = report.worst_case(cfg, rows)
    files.write_json(os.path.join(out, "worst_case.json"),
                     {"header": h, "worst_case": worst})
    files.write_text(os.path.join(out, "worst_case.md"),
                     report.worst_case_markdown(cfg, worst, h))
    if cfg.run.plots:
      figures.plot_heatmap(cfg, rows, os.path.join(out, "heatmap.png"))
      figures.plot_worst_case(cfg, worst, os.path.join(out,
                                                       "worst_case.png"))
    tracker.log(f"Checks: {checks}")
    result.update(grid=rows, checks=checks)
  tracker.log(f"Done in {time.perf_counter() - start:.0f}s; results in {out}")
  return result
