"""What the CIFAR experiments share (`cifar10.py`: Figure 4, `cifar100.py`:
Figure 5 of Werner et al. 2023, §5.3): their model options, the data, the
models, one run, and the outputs.

The data are CIFAR binaries or tfds; Fashion-MNIST padded to 32x32 and tiled
to 3 channels (an offline stand-in); or synthetic class-template images
(`--smoke`). Every image is brought to `[image_size, image_size, 3]`.
"""

import dataclasses
import os
import time
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from experiments import files
from experiments import groups
from experiments import options
from experiments import plots
from experiments import registry
from experiments import tracking
from experiments import training
from experiments.options import group, option
from prfl_jax.data import cifar as cifar_files
from prfl_jax.data import datasets as datasets_lib

DATASETS = ("cifar10", "cifar100", "fashion_mnist", "synthetic")
IMAGE_SIZE = 32  # Every data set is brought to CIFAR's [32, 32, 3].
SYNTHETIC_NOTE = ("SYNTHETIC random class-template images (not CIFAR): a "
                  "plumbing check, not a result")
SYNTHETIC_CLASSES = {"cifar10": 10, "cifar100": 100}


@dataclasses.dataclass(frozen=True)
class Network:
  """The model of a CIFAR run."""
  model: str = option("vgg16", "vgg16, vgg8, or the cheap CPU stand-ins cnn "
                      "and mlp (one hidden layer of 200 / width divisor)",
                      choices=("vgg16", "vgg8", "cnn", "mlp"))
  width_divisor: int = option(1, "divide every conv and hidden width by this "
                              "(CPU runs)", low=1)
  image_size: int = option(32, "resize the 32x32 images to this size (CPU "
                           "runs)", low=4)


@dataclasses.dataclass(frozen=True)
class Config:
  """The options both CIFAR figures have (defaults: Figure 4, §5.3.1)."""
  run: groups.Run = group(groups.Run)
  data: groups.Data = group(groups.Data, dataset="cifar10")
  network: Network = group(Network)
  federation: groups.Federation = group(groups.Federation, clusters=4,
                                        clients_per_cluster=5)
  optim: groups.Optim = group(groups.Optim)
  schedule: groups.Schedule = group(groups.Schedule, rounds=1000,
                                    eval_every=50)
  # The whole federation in one FC group, as in the paper's CIFAR runs.
  clustering: groups.Clustering = group(groups.Clustering, groups=1)


def _num_pools(model: str) -> int:
  if model == "mlp":
    return 0
  if model == "cnn":
    return 2
  return sum(v == "M" for v in prfl.models.VGG_CONFIGS[model])


def resolve(cfg, *, experiment: str, task: str, allowed: tuple):
  """The checks both CIFAR experiments share; fills `--out`.

  Raises:
    ValueError: naming the options.
  """
  d, f, s = cfg.data, cfg.federation, cfg.schedule
  if d.dataset not in DATASETS:
    raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, got "
                     f"{d.dataset!r}.")
  bad = [a for a in cfg.algorithms.algorithms if a not in allowed]
  if bad:
    raise ValueError(f"--algorithms: {bad[0]} is not in this figure; choose "
                     f"from {', '.join(allowed)}.")
  registry.check(cfg, cfg.algorithms.algorithms)
  tracking.check(cfg.run.progress, cfg.run.tensorboard)
  if s.eval_every is not None and s.eval_every > s.rounds:
    raise ValueError(f"--eval-every ({s.eval_every}) must be <= --rounds "
                     f"({s.rounds}).")
  if d.dataset == "synthetic" and d.data_dir is not None:
    raise ValueError("--dataset synthetic is generated: do not pass "
                     "--data-dir.")
  if d.data_dir is not None and not os.path.isdir(d.data_dir):
    raise ValueError(f"--data-dir {d.data_dir} is not a directory.")
  if d.dataset in ("cifar10", "cifar100") and (
      d.data_dir is None or cifar_files.locate(d.data_dir, d.dataset) is None):
    if not datasets_lib.tfds_installed():
      where = ("no --data-dir given" if d.data_dir is None else
               f"--data-dir {d.data_dir} holds no {d.dataset} binary files")
      raise ValueError(
          f"--dataset {d.dataset}: {where} and tensorflow-datasets is not "
          f"installed; pass --data-dir with "
          f"{cifar_files.FORMATS[d.dataset].archive} (or its extracted "
          "directory), or use --dataset fashion_mnist / --smoke.")
  need = 2 ** _num_pools(cfg.network.model)
  if cfg.network.image_size < need:
    raise ValueError(f"--model {cfg.network.model} has "
                     f"{_num_pools(cfg.network.model)} 2x2 max-pools and "
                     f"needs --image-size >= {need}, got "
                     f"{cfg.network.image_size}.")
  if (f.test_per_client is None) != (f.train_per_client is None):
    raise ValueError("give both --train-per-client and --test-per-client or "
                     "neither.")
  if f.train_per_client is not None and (
      cfg.optim.batch_size or 0) > f.train_per_client:
    raise ValueError(f"--batch-size ({cfg.optim.batch_size}) must be <= "
                     f"--train-per-client ({f.train_per_client}).")
  classes = num_classes(cfg, experiment)
  if task == "label_blocks" and classes % f.clusters:
    raise ValueError(
        f"label blocks need the {classes} classes of --dataset {d.dataset} "
        f"to divide evenly among --clusters ({f.clusters}).")
  return options.replace(cfg, out=cfg.run.out or os.path.join(
      "results", experiment, *(["smoke"] if cfg.run.smoke else [])))


def num_classes(cfg, experiment: str) -> int:
  if cfg.data.dataset == "synthetic":
    return SYNTHETIC_CLASSES[experiment]
  return datasets_lib.NUM_CLASSES[cfg.data.dataset]


def synthetic_dataset(classes: int, count: int,
                      seed: int) -> datasets_lib.ArrayDataset:
  """`count` random 32x32x3 images: one random template per class plus noise.

  Balanced labels (`i mod classes`), so that label blocks get equal pools.
  """
  rng = np.random.default_rng(seed)
  templates = rng.uniform(0, 1, (classes, IMAGE_SIZE, IMAGE_SIZE, 3))
  labels = np.arange(count) % classes
  noise = rng.normal(0, 0.2, (count, IMAGE_SIZE, IMAGE_SIZE, 3))
  images = np.clip(templates[labels] + noise, 0, 1).astype(np.float32)
  return datasets_lib.ArrayDataset(images, labels.astype(np.int32), classes,
                                   SYNTHETIC_NOTE)


def to_cifar_shape(x: np.ndarray, image_size: int) -> np.ndarray:
  """Images `[..., H, W, C]` -> `[..., image_size, image_size, 3]`.

  28x28 (Fashion-MNIST) is zero-padded by 2 pixels to 32x32 first; one
  channel is tiled to three; a size other than 32 is then resized
  (bilinear, antialiased, `jax.image.resize`).
  """
  h, w = x.shape[-3:-1]
  if (h, w) == (28, 28):
    pad = [(0, 0)] * (x.ndim - 3) + [(2, 2), (2, 2), (0, 0)]
    x = np.pad(x, pad)
  if x.shape[-1] == 1:
    x = np.repeat(x, 3, axis=-1)
  if x.shape[-3:-1] != (image_size, image_size):
    lead = x.shape[:-3]
    flat = x.reshape((-1,) + x.shape[-3:])
    flat = np.asarray(jax.image.resize(
        jnp.asarray(flat), (flat.shape[0], image_size, image_size, 3),
        "linear", antialias=True))
    x = flat.reshape(lead + flat.shape[1:])
  return x.astype(np.float32)


def build_model(name: str, classes: int, width_divisor: int = 1):
  """A Flax model: the paper's VGG-16 / VGG-8 or the small CNN, narrowed."""
  div = lambda w: max(1, w // width_divisor)
  if name == "mlp":
    return prfl.models.MLP(features=(div(200), classes))
  if name == "cnn":
    return prfl.models.CNN(num_classes=classes, channels=(div(32), div(64)),
                           hidden=div(128))
  config = tuple(v if v == "M" else div(v)
                 for v in prfl.models.VGG_CONFIGS[name])
  return prfl.models.VGG(config=config, num_classes=classes,
                         hidden=(div(512), div(512)))


class Prepared(NamedTuple):
  """The data and model of a run, built before anything is written."""
  fed: prfl.data.Federation
  flax_model: object
  model: training.Model
  params: object  # Leaves [N, ...]: every client the same initial model.
  ifca_models: object  # IFCA's K initial cluster models.


def prepare(cfg, *, experiment: str, task: str) -> Prepared:
  """The federation (images `[N, M, size, size, 3]`), model and params."""
  d, f = cfg.data, cfg.federation
  if d.dataset == "synthetic":
    per_client = (f.train_per_client or 40) + (f.test_per_client or 10)
    count = 2 * f.clusters * f.clients_per_cluster * per_client
    ds = synthetic_dataset(num_classes(cfg, experiment), count, cfg.run.seed)
  else:
    ds = prfl.data.load_dataset(d.dataset, split="train+test",
                                data_dir=d.data_dir, source=d.source)
  fed = prfl.data.federate(
      ds, task=task, num_clusters=f.clusters,
      clients_per_cluster=f.clients_per_cluster,
      train_per_client=f.train_per_client,
      test_per_client=f.test_per_client, seed=cfg.run.seed)
  size = cfg.network.image_size
  (xtr, ytr), (xte, yte) = fed.data.train, fed.data.test
  fed = fed._replace(data=fed.data._replace(
      train=(to_cifar_shape(xtr, size), ytr),
      test=(to_cifar_shape(xte, size), yte)), description=fed.description + (
          "; Fashion-MNIST 28x28x1 zero-padded to 32x32 and tiled to 3 "
          "channels" if d.dataset == "fashion_mnist" else "") + (
              f"; resized to {size}x{size}" if size != IMAGE_SIZE else ""))
  net = build_model(cfg.network.model, fed.num_classes,
                    cfg.network.width_divisor)
  x = fed.data.train[0]
  params = prfl.models.init_stacked(net, jax.random.key(cfg.run.seed), x[0],
                                    x.shape[0])
  # IFCA's K cluster models: K independent initialisations (its default, the
  # first client's model plus N(0, 0.1^2) noise on every weight, swamps
  # VGG's He-scaled conv kernels).
  keys = jax.random.split(jax.random.fold_in(jax.random.key(cfg.run.seed), 7),
                          f.clusters)
  ifca = jax.vmap(lambda k: net.init(k, x[0, :1]))(keys)
  model = training.Model(
      init=None, loss_fn=prfl.models.classifier_loss(net.apply),
      eval_fn=prfl.models.classifier_eval(net.apply), logits_fn=net.apply,
      feature_fn=None, description=f"{cfg.network.model} (width / "
      f"{cfg.network.width_divisor})")
  return Prepared(fed, net, model, params, ifca)


def run_one(cfg, prepared: Prepared, name: str, s: registry.Settings,
            tracker, label: str) -> dict:
  """Trains registry algorithm `name` with settings `s`."""
  ctx = training.context(prepared.fed, prepared.model.loss_fn,
                         jax.random.key(cfg.run.seed),
                         init_models=prepared.ifca_models)
  r = training.train(name, s, ctx, prepared.fed, prepared.model,
                     prepared.params,
                     train_key=jax.random.key(cfg.run.seed + 1),
                     tracker=tracker, tag=label)
  r["label"] = label
  return r


def run_jobs(cfg, prepared: Prepared, jobs: list, tracker) -> dict:
  """Runs `(key, registry name, label, settings)` jobs; key -> result."""
  params = sum(np.prod(np.shape(x)) for x in jax.tree.leaves(prepared.params))
  n = prepared.fed.data.clusters.shape[0]
  s = registry.settings(cfg)
  tracker.log(f"{prepared.fed.description}")
  if cfg.data.dataset == "synthetic":
    tracker.log(f"*** {SYNTHETIC_NOTE} ***")
  tracker.log(f"Model {prepared.model.description}, {int(params) // n} "
              f"params, {s.rounds} rounds, batch {s.batch_size}, lr {s.lr}, "
              f"momentum {s.momentum}; {len(jobs)} runs")
  runs, start = {}, time.perf_counter()
  for i, (key, name, label, settings) in enumerate(jobs, 1):
    runs[key] = run_one(cfg, prepared, name, settings, tracker, label)
    r = runs[key]
    tracker.log(training.progress_line(
        i, len(jobs), f"{label} (best {100 * r['best_accuracy']:.1f}%)", r,
        start))
  return runs


# Columns of a run's result, after the experiment's own leading columns.
RESULT_COLUMNS = ["final acc. (%)", "best acc. (%)", "final loss",
                  "worst cluster acc. (%)", "seconds"]


def result_cells(r: dict) -> list:
  """`RESULT_COLUMNS` of one run as table cells."""
  return [f"{100 * r['accuracy']:.1f}", f"{100 * r['best_accuracy']:.1f}",
          f"{r['loss']:.3f}",
          f"{100 * np.nanmin(r['accuracy_per_cluster']):.1f}",
          f"{r['seconds']:.0f}"]


def finish(cfg, prepared: Prepared, runs: dict, header: list, rows: list,
           tracker, *, title: str, figure: str, panels: Optional[list]):
  """results.json, summary.csv, results.md and (with plots) the figure."""
  fed, out = prepared.fed, cfg.run.out
  synthetic = cfg.data.dataset == "synthetic"
  files.write_json(os.path.join(out, "results.json"), {
      "config": options.to_dict(cfg), "federation": fed.description,
      "num_classes": fed.num_classes, "synthetic_data": synthetic,
      "runs": list(runs.values())})
  files.write_csv(os.path.join(out, "summary.csv"),
                  [dict(zip(header, r)) for r in rows])
  table = files.markdown_table(header, rows)
  warn = f"\n**{SYNTHETIC_NOTE}.**\n" if synthetic else ""
  files.write_text(os.path.join(out, "results.md"),
                   f"## {title}\n{warn}\nData: {fed.description}\n\n{table}")
  if cfg.run.plots:
    s = registry.settings(cfg)
    figure_title = (f"{fed.description}\nmodel {prepared.model.description},"
                    f" {s.rounds} rounds")
    plots.plot_panels(panels, os.path.join(out, figure),
                      f"{SYNTHETIC_NOTE}\n{figure_title}" if synthetic
                      else figure_title)
  tracker.log("\n" + table)
  tracker.log(f"Wrote results.json, summary.csv, results.md"
              + (f", {figure}" if cfg.run.plots else "") + f" to {out}")
