"""Table 1's runs: load the data, train every (task, algorithm), write."""

import os
import time
from typing import NamedTuple

import jax

import prfl_jax as prfl
from experiments import files
from experiments import options
from experiments import plots
from experiments import registry
from experiments import training
from experiments.mnist import report


class Prepared(NamedTuple):
  """The data of a run, loaded before anything is written."""
  source: str  # Where the images came from.
  images: str  # How many, of what shape.
  model: training.Model
  federations: dict  # task -> prfl.data.Federation.


def prepare(cfg) -> Prepared:
  """Loads the data set and builds every task's federation.

  Raises:
    ValueError / OSError: a missing or malformed data set (the message says
      what to install or pass).
  """
  f = cfg.federation
  ds, model = training.load_images(cfg)
  feds = {}
  for task in cfg.tasks:
    feds[task] = prfl.data.federate(
        ds, task=task, num_clusters=f.clusters,
        clients_per_cluster=f.clients_per_cluster,
        train_per_client=f.train_per_client,
        test_per_client=f.test_per_client, seed=cfg.run.seed)
    for name in cfg.algorithms.algorithms:
      training.check_batches_are_valid(
          feds[task], registry.settings(cfg, name).batch_size)
  images = (f"{len(ds.labels)} images of "
            f"{'x'.join(map(str, ds.images.shape[1:]))}")
  return Prepared(ds.source, images, model, feds)


def train_one(cfg, name: str, task: str, prepared: Prepared, tracker) -> dict:
  """One (task, algorithm) run.

  Every algorithm starts from the same initial model (drawn from the seed)
  and sees the same batches (the same `train` key).
  """
  fed, model = prepared.federations[task], prepared.model
  init_key, alg_key, train_key = jax.random.split(
      jax.random.key(cfg.run.seed), 3)
  s = registry.settings(cfg, name)
  lam = s.knn_lambda if s.knn_lambda is not None else (
      report.config.KNN_LAMBDA[task])
  s = registry.Settings({**s, "knn_lambda": lam})
  extra = {}
  if name == "knn":
    extra = dict(data=training.with_datastore(fed.data),
                 eval_fn=training.knn_eval_fn(model, s, fed.num_classes, lam))
  params = prfl.tree.broadcast(model.init(init_key),
                               fed.data.clusters.shape[0])
  r = training.train(name, s, training.context(fed, model.loss_fn, alg_key),
                     fed, model, params, train_key=train_key,
                     tracker=tracker, tag=f"{task}/{name}", **extra)
  if name == "knn":
    r["knn_lambda"] = lam
  return r


def run(cfg, prepared: Prepared, tracker, command: str = "") -> dict:
  """Runs every (task, algorithm) of `cfg` and writes the outputs."""
  start, load_start = time.perf_counter(), os.getloadavg()
  tracker.log(f"Data: {prepared.source}, {prepared.images}")
  names = cfg.algorithms.algorithms
  total, done = len(cfg.tasks) * len(names), 0
  results = {}
  for task in cfg.tasks:
    tracker.log(f"Federation ({task}): "
                f"{prepared.federations[task].description}")
    results[task] = []
    for name in names:
      tracker.log(f"[{done + 1}/{total}] {task} {registry.label(name)}: "
                  f"{registry.settings(cfg, name).rounds} rounds")
      r = train_one(cfg, name, task, prepared, tracker)
      results[task].append(r)
      done += 1
      tracker.log(training.progress_line(
          done, total, f"{task} {registry.label(name)}", r, start))
  return write(cfg, prepared, results, tracker, command=command,
               seconds=time.perf_counter() - start, load_start=load_start)


def write(cfg, prepared: Prepared, results: dict, tracker, *, command: str,
          seconds: float, load_start: tuple) -> dict:
  """results.json, summary.csv, table.md and the curves."""
  out = cfg.run.out
  checks = report.ordering_checks(results)
  descriptions = {t: f.description for t, f in prepared.federations.items()}
  load_end = os.getloadavg()
  header = {
      "command": f"`{command}`" if command else "-",
      "data": prepared.source,
      **{f"federation ({t})": d for t, d in descriptions.items()},
      "model": prepared.model.description,
      "settings": report.settings_line(cfg),
      "paper": "Werner et al. (2023) Table 1, MNIST, their round count",
      "wall time": f"{seconds:.0f}s in all",
      "load average (1/5/15 min)": (
          f"{' '.join(f'{v:.1f}' for v in load_start)} at the start, "
          f"{' '.join(f'{v:.1f}' for v in load_end)} at the end "
          f"({os.cpu_count()} CPUs)"),
      **{f"checks ({t})": c for t, c in checks.items()},
  }
  table = report.markdown_table(cfg, results, header)
  files.write_json(os.path.join(out, "results.json"), {
      "config": options.to_dict(cfg), "versions": files.versions(),
      "data_source": prepared.source, "federations": descriptions,
      "seconds": seconds,
      "load_average": {"start": load_start, "end": load_end},
      "checks": checks, "results": results})
  files.write_csv(os.path.join(out, "summary.csv"),
                  training.summary_rows(results))
  files.write_text(os.path.join(out, "table.md"), table)
  written = ["table.md", "results.json", "summary.csv"]
  if cfg.run.plots:
    f = cfg.federation
    title = (f"Table 1 learning curves: {cfg.data.dataset}, {f.clusters} "
             f"clusters x {f.clients_per_cluster} clients")
    plots.plot_curves(results, os.path.join(out, "curves.png"), title)
    plots.plot_curves(results, os.path.join(out, "curves_loss.png"), title,
                      "loss")
    written += ["curves.png", "curves_loss.png"]
    if plots.has_diagnostics(results):
      plots.plot_diagnostics(results, os.path.join(out, "diagnostics.png"),
                             f"Clustering diagnostics: {cfg.data.dataset}, "
                             f"{f.clusters} clusters x "
                             f"{f.clients_per_cluster} clients")
      written.append("diagnostics.png")
  tracker.log("\n" + table)
  tracker.log(f"Wrote {', '.join(written)} to {out}")
  return {"config": cfg, "results": results, "checks": checks}
