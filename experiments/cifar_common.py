"""Plumbing shared by the CIFAR experiments (`cifar10.py`, `cifar100.py`).

Werner et al. (2023), §5.3: clustered federations of CIFAR images trained with
VGG models (batch 32, SGD lr 0.1, momentum 0.9). This module holds what both
figures need: the common command-line options, the data (CIFAR binaries or
tfds; Fashion-MNIST padded to 32x32 and tiled to 3 channels as an offline
stand-in; or synthetic class-template images for `--smoke`), the models, one
run of one algorithm through `prfl.train`, and the output files.
"""

import argparse
import textwrap
import time
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

import prfl_jax as prfl
from experiments import cli
from experiments import common
from prfl_jax.data import cifar as cifar_files
from prfl_jax.data import datasets as datasets_lib

DATASETS = ("cifar10", "cifar100", "fashion_mnist", "synthetic")
MODELS = ("vgg16", "vgg8", "cnn", "mlp")
IMAGE_SIZE = 32  # Every data set is brought to CIFAR's [32, 32, 3].
SYNTHETIC_NOTE = ("SYNTHETIC random class-template images (not CIFAR): a "
                  "plumbing check, not a result")


def add_options(p: argparse.ArgumentParser, *, dataset: str, model: str,
                num_clusters: int, clients_per_cluster: int,
                rounds: int, eval_every: int):
  """Options both CIFAR experiments have (defaults: the paper's §5.3)."""
  p.add_argument("--dataset", type=cli.choices(DATASETS, multiple=False),
                 default=dataset,
                 help="cifar10/cifar100 (binary files in --data-dir, or tfds),"
                 " fashion_mnist (offline stand-in, padded to 32x32x3) or "
                 "synthetic (random images, --smoke)")
  p.add_argument("--data-dir", "--dataset-dir", dest="data_dir",
                 type=cli.existing_dir, default=None,
                 help="directory with the CIFAR binary files / archive (or "
                 "Fashion-MNIST IDX files)")
  p.add_argument("--model", type=cli.choices(MODELS, multiple=False),
                 default=model, help="vgg16, vgg8, or the cheap CPU stand-ins cnn "
                 "and mlp (one hidden layer of 200 / --width-divisor)")
  p.add_argument("--width-divisor", type=cli.positive_int, default=1,
                 help="divide every conv and hidden width by this (CPU runs)")
  p.add_argument("--image-size", type=cli.integer(minimum=4), default=32,
                 help="resize the 32x32 images to this size (CPU runs)")
  p.add_argument("--num-clusters", type=cli.positive_int, default=num_clusters)
  p.add_argument("--clients-per-cluster", type=cli.positive_int,
                 default=clients_per_cluster)
  p.add_argument("--train-per-client", type=cli.positive_int, default=None,
                 help="default: 80%% of each client's share of train+test")
  p.add_argument("--test-per-client", type=cli.positive_int, default=None)
  p.add_argument("--rounds", type=cli.positive_int, default=rounds)
  p.add_argument("--eval-every", type=cli.positive_int, default=eval_every)
  p.add_argument("--batch-size", type=cli.positive_int, default=32)
  p.add_argument("--lr", type=cli.real(0, low_open=True), default=0.1)
  p.add_argument("--momentum", type=cli.real(0, 1, high_open=True),
                 default=0.9)
  p.add_argument("--quantile", type=cli.real(0, 1, low_open=True),
                 default=0.2, help="FC's radius: this quantile of the "
                 "distances to the centre (the paper's 20th percentile)")
  p.add_argument("--num-iters", type=cli.positive_int, default=10,
                 help="Threshold-Clustering steps per round (the paper's l)")
  p.add_argument("--no-plots", action="store_true")


def num_classes_of(args) -> int:
  """Classes of `args.dataset` (synthetic: `args.synthetic_classes`)."""
  if args.dataset == "synthetic":
    return args.synthetic_classes
  return datasets_lib.NUM_CLASSES[args.dataset]


def _num_pools(model: str) -> int:
  if model == "mlp":
    return 0
  if model == "cnn":
    return 2
  return sum(v == "M" for v in prfl.models.VGG_CONFIGS[model])


def validate(args, *, task: str):
  """Cross-option checks; raises ValueError naming the options."""
  if args.eval_every > args.rounds:
    raise ValueError(f"`--eval-every` ({args.eval_every}) must be <= "
                     f"`--rounds` ({args.rounds}).")
  if args.dataset == "synthetic" and args.data_dir is not None:
    raise ValueError("`--dataset synthetic` is generated: do not pass "
                     "`--data-dir`.")
  if args.dataset in ("cifar10", "cifar100") and (
      args.data_dir is None or
      cifar_files.locate(args.data_dir, args.dataset) is None):
    if not datasets_lib.tfds_installed():
      where = ("no `--data-dir` given" if args.data_dir is None else
               f"`--data-dir` {args.data_dir} holds no {args.dataset} binary "
               "files")
      raise ValueError(
          f"`--dataset {args.dataset}`: {where} and tensorflow-datasets is "
          "not installed; pass `--data-dir` with "
          f"{cifar_files.FORMATS[args.dataset].archive} (or its extracted "
          "directory), or use `--dataset fashion_mnist` / `--smoke`.")
  need = 2 ** _num_pools(args.model)
  if args.image_size < need:
    raise ValueError(f"`--model {args.model}` has {_num_pools(args.model)} "
                     f"2x2 max-pools and needs `--image-size` >= {need}, got "
                     f"{args.image_size}.")
  if args.train_per_client is not None and (
      args.batch_size > args.train_per_client):
    raise ValueError(f"`--batch-size` ({args.batch_size}) must be <= "
                     f"`--train-per-client` ({args.train_per_client}).")
  if (args.test_per_client is None) != (args.train_per_client is None):
    raise ValueError("give both `--train-per-client` and `--test-per-client`"
                     " or neither.")
  classes = num_classes_of(args)
  if task == "label_blocks" and classes % args.num_clusters:
    raise ValueError(
        f"label blocks need the {classes} classes of `--dataset "
        f"{args.dataset}` to divide evenly among `--num-clusters` "
        f"({args.num_clusters}).")


def synthetic_dataset(num_classes: int, count: int,
                      seed: int) -> datasets_lib.ArrayDataset:
  """`count` random 32x32x3 images: one random template per class plus noise.

  Balanced labels (`i mod num_classes`), so that label blocks get equal pools.
  """
  rng = np.random.default_rng(seed)
  templates = rng.uniform(0, 1, (num_classes, IMAGE_SIZE, IMAGE_SIZE, 3))
  labels = np.arange(count) % num_classes
  noise = rng.normal(0, 0.2, (count, IMAGE_SIZE, IMAGE_SIZE, 3))
  images = np.clip(templates[labels] + noise, 0, 1).astype(np.float32)
  return datasets_lib.ArrayDataset(images, labels.astype(np.int32),
                                   num_classes, SYNTHETIC_NOTE)


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


def load_federation(args, *, task: str) -> prfl.data.Federation:
  """The federation of `args` (task "private_label" or "label_blocks").

  Images come out `[N, M, image_size, image_size, 3]`.
  """
  if args.dataset == "synthetic":
    per_client = ((args.train_per_client or 40) +
                  (args.test_per_client or 10))
    count = 2 * args.num_clusters * args.clients_per_cluster * per_client
    ds = synthetic_dataset(args.synthetic_classes, count, args.seed)
  else:
    ds = prfl.data.load_dataset(args.dataset, split="train+test",
                                data_dir=args.data_dir)
  fed = prfl.data.federate(
      ds, task=task, num_clusters=args.num_clusters,
      clients_per_cluster=args.clients_per_cluster,
      train_per_client=args.train_per_client,
      test_per_client=args.test_per_client, seed=args.seed)
  del ds
  (xtr, ytr), (xte, yte) = fed.data.train, fed.data.test
  data = fed.data._replace(
      train=(to_cifar_shape(xtr, args.image_size), ytr),
      test=(to_cifar_shape(xte, args.image_size), yte))
  note = ""
  if args.dataset == "fashion_mnist":
    note = "; Fashion-MNIST 28x28x1 zero-padded to 32x32 and tiled to 3 channels"
  if args.image_size != IMAGE_SIZE:
    note += f"; resized to {args.image_size}x{args.image_size}"
  return fed._replace(data=data, description=fed.description + note)


def build_model(name: str, num_classes: int, width_divisor: int = 1):
  """A Flax model: the paper's VGG-16 / VGG-8 or the small CNN, narrowed."""
  div = lambda w: max(1, w // width_divisor)
  if name == "mlp":
    return prfl.models.MLP(features=(div(200), num_classes))
  if name == "cnn":
    return prfl.models.CNN(num_classes=num_classes, channels=(div(32), div(64)),
                           hidden=div(128))
  config = tuple(v if v == "M" else div(v)
                 for v in prfl.models.VGG_CONFIGS[name])
  return prfl.models.VGG(config=config, num_classes=num_classes,
                         hidden=(div(512), div(512)))


def num_params(variables) -> int:
  return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(variables)))


class Setup(NamedTuple):
  """What every run of one experiment shares."""
  fed: prfl.data.Federation
  model: object
  loss_fn: Callable
  eval_fn: Callable
  params: object  # leaves [N, ...], every client the same initial model.
  opt: Callable  # lr -> optax optimizer.


def setup(args, fed: prfl.data.Federation) -> Setup:
  model = build_model(args.model, fed.num_classes, args.width_divisor)
  x = fed.data.train[0]
  n = x.shape[0]
  params = prfl.models.init_stacked(model, jax.random.key(args.seed), x[0], n)
  return Setup(fed, model, prfl.models.classifier_loss(model.apply),
               prfl.models.classifier_eval(model.apply), params,
               lambda lr: optax.sgd(lr, momentum=args.momentum or None))


def ifca_init_models(s: Setup, num_clusters: int, seed: int):
  """IFCA's K cluster models: K independent initialisations of the model.

  (IFCA's default, the first client's model plus N(0, 0.1^2) noise on every
  weight, swamps VGG's He-scaled conv kernels.)
  """
  x = s.fed.data.train[0][0, :1]
  keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), 7),
                          num_clusters)
  return jax.vmap(lambda k: s.model.init(k, x))(keys)


def run_one(s: Setup, algorithm, args, *, index: int, total: int,
            label: str, log=print) -> dict:
  """Trains one algorithm with `prfl.train`; returns its curves."""
  t0 = time.perf_counter()
  res = prfl.train(
      algorithm, s.params, s.fed.data, num_rounds=args.rounds,
      key=jax.random.key(args.seed + 1), batch_size=args.batch_size,
      eval_fn=s.eval_fn, eval_every=args.eval_every,
      byzantine=s.fed.byzantine,
      log=lambda line: log(f"  [{index}/{total}] {label}: {line}"))
  h = res.history
  seconds = time.perf_counter() - t0
  acc = np.asarray(h["eval/accuracy"])
  return {"label": label, "eval_round": h["eval_round"], "accuracy": acc,
          "loss": h["eval/loss"],
          "accuracy_per_cluster": h["eval/accuracy/per_cluster"],
          "final_accuracy": float(acc[-1]), "best_accuracy": float(acc.max()),
          "final_loss": float(np.asarray(h["eval/loss"])[-1]),
          "seconds": seconds}


def log_line(text: str):
  print(text, flush=True)


def progress(index: int, total: int, label: str, run: dict, start: float):
  elapsed = time.perf_counter() - start
  left = elapsed / index * (total - index)
  log_line(f"[{index}/{total}] {label}: final accuracy "
           f"{100 * run['final_accuracy']:.1f}% (best "
           f"{100 * run['best_accuracy']:.1f}%) in {run['seconds']:.0f}s; "
           f"{elapsed:.0f}s elapsed, ~{left:.0f}s left")


def markdown_table(header: list, rows: list) -> str:
  lines = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def write_text(path: str, text: str):
  common._atomic_write(path, lambda f: f.write(text))  # pylint: disable=protected-access


def plot_panels(panels: list, path: str, title: str):
  """One accuracy-vs-round panel per `(title, [run, ...], prominent_label)`."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4),
                           squeeze=False)
  styles = ["-", "--", "-.", ":"]
  for ax, (panel_title, runs, prominent) in zip(axes[0], panels):
    for i, r in enumerate(runs):
      main = r["label"] == prominent
      ax.plot(r["eval_round"], 100 * np.asarray(r["accuracy"]),
              ls="-" if main else styles[(i + 1) % len(styles)],
              lw=2.8 if main else 1.3, color="C3" if main else f"C{i % 10}"
              if i % 10 != 3 else "C9", zorder=3 if main else 2,
              marker="o" if main else None, ms=3, label=r["label"])
    ax.set_title(panel_title)
    ax.set_xlabel("round")
    ax.set_ylabel("personalized test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.16),
              ncol=2, frameon=False)
  lines = [textwrap.fill(line, width=60 * len(panels))
           for line in title.splitlines()]
  fig.suptitle("\n".join(lines), fontsize=8, y=1.0 + 0.045 * len(
      "\n".join(lines).splitlines()))
  common.save_figure(fig, path)
  plt.close(fig)


def write_outputs(args, out: str, fed, runs: list, rows: list, header: list,
                  table_title: str, extra: Optional[dict] = None):
  """results.json, summary.csv and results.md in `out`."""
  common.write_json(f"{out}/results.json", {
      "config": {k: v for k, v in vars(args).items()},
      "federation": fed.description, "num_classes": fed.num_classes,
      "synthetic_data": args.dataset == "synthetic", "runs": runs,
      **(extra or {})})
  common.write_csv(f"{out}/summary.csv",
                   [dict(zip(header, r)) for r in rows])
  warn = (f"\n**{SYNTHETIC_NOTE}.**\n" if args.dataset == "synthetic" else "")
  write_text(f"{out}/results.md", f"## {table_title}\n{warn}\n"
             f"Data: {fed.description}\n\n" + markdown_table(header, rows))


def parse(p: argparse.ArgumentParser, argv, check) -> argparse.Namespace:
  """`cli.parse`, then `config.json` (with `smoke` and `synthetic_data`)."""
  args = cli.parse(p, argv, check=check)
  cli.write_config(args.out, args, extra={
      "smoke": args.smoke, "synthetic_data": args.dataset == "synthetic"})
  return args


# Columns of a run's result, after the experiment's own leading columns.
RESULT_COLUMNS = ["final acc. (%)", "best acc. (%)", "final loss",
                  "worst cluster acc. (%)", "seconds"]


def result_cells(r: dict) -> list:
  """`RESULT_COLUMNS` of one run (`run_one`'s dict) as table cells."""
  per_cluster = np.asarray(r["accuracy_per_cluster"])[-1]
  return [f"{100 * r['final_accuracy']:.1f}",
          f"{100 * r['best_accuracy']:.1f}", f"{r['final_loss']:.3f}",
          f"{100 * np.nanmin(per_cluster):.1f}", f"{r['seconds']:.0f}"]


def finish(args, fed, runs: dict, header: list, rows: list, *, title: str,
           figure: str, panels: list):
  """Writes results.json / summary.csv / results.md and, unless
  `--no-plots`, the figure `figure` of `panels` (`plot_panels`); prints the
  table."""
  write_outputs(args, args.out, fed, list(runs.values()), rows, header, title)
  if not args.no_plots:
    figure_title = (f"{fed.description}\nmodel {args.model} (width / "
                    f"{args.width_divisor}), {args.rounds} rounds")
    if args.dataset == "synthetic":
      figure_title = f"{SYNTHETIC_NOTE}\n{figure_title}"
    plot_panels(panels, f"{args.out}/{figure}", figure_title)
  log_line("\n" + markdown_table(header, rows))
  log_line(f"Wrote {args.out}/results.json, summary.csv, results.md"
           + ("" if args.no_plots else f", {figure}"))
