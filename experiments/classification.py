"""Shared plumbing of the real-data classification experiments.

Table 1 (`experiments/mnist.py`), the Byzantine and the CIFAR experiments all
do the same things: build a clustered federation from a real data set, give
every client the same initial model, build each algorithm from its name with
the paper's optimizer settings, run `prfl.train`, and summarise accuracy and
loss over benign clients, with learning curves. This module holds those steps;
the experiment modules only parse their options and write their tables.
"""

import dataclasses
import platform
import subprocess
import time
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

import prfl_jax as prfl
from experiments import common

# Every algorithm by name: its label in tables and plots, and the paper's Table
# 1 row it corresponds to (None: not in Table 1). The order is the paper's.
LABELS = {
    "local": "Local",
    "global": "Global (FedAvg)",
    "ditto": "Ditto",
    "ifca": "IFCA",
    "knn": "kNN-Per",
    "fc": "FC (ours)",
    "oracle": "Ground truth (oracle)",
    "cfl": "CFL",
    "hypcluster": "HypCluster",
    "myopic": "Myopic-Clustering",
    "mc": "Momentum-Clustering",
}
ALGORITHMS = tuple(LABELS)


@dataclasses.dataclass(frozen=True)
class Hyper:
  """Hyperparameters shared by the algorithms (Werner et al., 2023, §5.2)."""
  lr: float = 0.1
  momentum: float = 0.9
  batch_size: int = 32
  quantile: float = 0.2  # Radius of FC, Myopic- and Momentum-Clustering.
  num_iters: int = 10  # Threshold-Clustering steps per round.
  num_groups: int = 16  # FC's random subgroups per round.
  ditto_lam: float = 1.0
  knn_lam: float = 0.5  # kNN-Per's weight of the kNN distribution.
  knn_k: int = 10  # kNN-Per's neighbours.
  knn_temperature: float = 1.0
  cfl_eps: tuple = (0.05, 0.1)  # CFL's (eps1, eps2) on update norms.
  cfl_warmup: int = 20  # CFL splits nothing before this round.
  local_steps: int = 1  # Ditto, CFL, HypCluster steps per round.
  plan: prfl.ExecutionPlan = prfl.ExecutionPlan()  # Backend default.

  def validate(self, names: Optional[dict] = None):
    """Raises ValueError naming the bad field, before anything runs.

    Args:
      names: optional `{field: name to quote}` (e.g. a command-line option).
    """
    say = lambda field: (names or {}).get(field, f"`{field}`")
    for name in ("lr", "knn_temperature"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{say(name)} must be > 0, got {getattr(self, name)}.")
    for name in ("batch_size", "num_iters", "num_groups", "knn_k",
                 "local_steps", "cfl_warmup"):
      value = getattr(self, name)
      if (not isinstance(value, int) or isinstance(value, bool) or
          value < (0 if name == "cfl_warmup" else 1)):
        raise ValueError(f"{say(name)} must be an integer >= "
                         f"{0 if name == 'cfl_warmup' else 1}, got {value!r}.")
    if not 0 <= self.momentum < 1:
      raise ValueError(f"{say('momentum')} must be in [0, 1), got "
                       f"{self.momentum}.")
    if not 0 < self.quantile <= 1:
      raise ValueError(f"{say('quantile')} must be in (0, 1], got "
                       f"{self.quantile}.")
    if not self.ditto_lam >= 0:
      raise ValueError(f"{say('ditto_lam')} must be >= 0, got "
                       f"{self.ditto_lam}.")
    if not 0 <= self.knn_lam <= 1:
      raise ValueError(f"{say('knn_lam')} must be in [0, 1], got "
                       f"{self.knn_lam}.")
    if len(self.cfl_eps) != 2 or not min(self.cfl_eps) >= 0:
      raise ValueError(f"{say('cfl_eps')} must be two numbers >= 0, got "
                       f"{self.cfl_eps}.")


class Model(NamedTuple):
  """A classifier as pure functions of one client's params."""
  init: Callable  # init(key) -> one client's params.
  loss_fn: Callable  # loss_fn(params, (x [B, ...], y [B])) -> scalar.
  eval_fn: Callable  # eval_fn(params, (x, y)) -> {"accuracy", "loss"}.
  logits_fn: Callable  # logits_fn(params, x [B, ...]) -> [B, C].
  feature_fn: Optional[Callable]  # kNN-Per's features, [B, F]; or None.
  description: str


def mlp(input_dim: int, hidden: int, num_classes: int) -> Model:
  """The paper's MLP (input-hidden-classes, ReLU; §5.2) as a `Model`.

  The loss is `prfl.models.mlp_classifier_loss(2)`, a plain loss whose dense
  layers the ghost kernel finds by itself (`prfl_jax.kernels.trace`). It
  does not mask padded labels, so `check_batches_are_valid` must hold. The
  features of kNN-Per are the hidden layer's ReLU activations.
  """
  def logits_fn(params, x):
    return prfl.models.mlp_apply(params, x)

  def feature_fn(params, x):
    first = {"Dense_0": params["Dense_0"]}
    return jax.nn.relu(prfl.models.mlp_apply(first, x))

  return Model(
      init=lambda key: prfl.models.mlp_init(key, (input_dim, hidden,
                                                  num_classes)),
      loss_fn=prfl.models.mlp_classifier_loss(2),
      eval_fn=prfl.models.classifier_eval(logits_fn),
      logits_fn=logits_fn, feature_fn=feature_fn,
      description=f"MLP {input_dim}-{hidden}-{num_classes} (ReLU)")


def check_batches_are_valid(fed: prfl.data.Federation, batch_size: int):
  """Raises ValueError if some client has fewer real examples than a batch.

  `sample_batch` draws real examples first, so with at least `batch_size`
  real (label >= 0) examples per client no batch holds padding.
  """
  counts = np.sum(np.asarray(fed.data.train[1]) >= 0, axis=1)
  if counts.min() < batch_size:
    raise ValueError(
        f"`batch_size` {batch_size} exceeds the smallest client's "
        f"{counts.min()} training examples: lower `batch_size` or give "
        "clients more examples.")


def optimizer(hp: Hyper) -> optax.GradientTransformation:
  """The paper's client optimizer: SGD with heavy-ball momentum."""
  return optax.sgd(hp.lr, momentum=hp.momentum or None)


def build_algorithm(name: str, loss_fn, hp: Hyper, *, clusters: np.ndarray,
                    num_clusters: int, key: jax.Array,
                    attack=None) -> prfl.algorithms.Algorithm:
  """One algorithm of Table 1 by name, with the paper's settings.

  Args:
    name: one of `ALGORITHMS`.
    loss_fn: one client's loss.
    hp: hyperparameters.
    clusters: `[N]` true clusters (the oracle's only input).
    num_clusters: K, given to the algorithms that need it.
    key: PRNG key of IFCA's and HypCluster's random initial models.
    attack: what Byzantine clients send (`prfl.attacks`), or None.

  Notes:
    Momentum-Clustering's momentum `m = a g + (1 - a) m` with `a = 1 -
    momentum` and step `lr / a` is exactly heavy-ball SGD (lr, momentum) when
    every client is alone in its cluster, so it gets the same step size as
    the others. Ditto's FedAvg part and CFL re-initialise their local
    optimizer every round, so momentum has no effect there. Ditto's personal
    models take plain SGD steps (as in Li et al., 2021): with heavy-ball
    momentum 0.9 and lambda = 1 they diverge on Fashion-MNIST (personal loss
    1.7 -> 11 in 300 rounds, 4 x 5 clients), without momentum they do not.
  """
  opt = optimizer(hp)
  radius = prfl.quantile_radius(hp.quantile)
  if name == "fc":
    return prfl.algorithms.federated_clustering(
        loss_fn, opt, radius=radius, num_iters=hp.num_iters,
        num_groups=hp.num_groups, attack=attack, plan=hp.plan)
  if name == "oracle":
    return prfl.algorithms.oracle(loss_fn, opt, clusters=clusters)
  if name == "local":
    return prfl.algorithms.local(loss_fn, opt)
  if name == "global":
    return prfl.algorithms.fedavg(loss_fn, opt, attack=attack)
  if name == "knn":
    return prfl.algorithms.knn_per(loss_fn, opt, attack=attack)
  if name == "ditto":
    return prfl.algorithms.ditto(loss_fn, optax.sgd(hp.lr), lam=hp.ditto_lam,
                                 local_steps=hp.local_steps, attack=attack)
  if name == "ifca":
    return prfl.algorithms.ifca(
        loss_fn, opt, num_clusters=num_clusters, attack=attack, key=key)
  if name == "hypcluster":
    return prfl.algorithms.hypcluster(
        loss_fn, opt, num_clusters=num_clusters, local_steps=hp.local_steps,
        attack=attack, key=key)
  if name == "cfl":
    return prfl.algorithms.cfl(
        loss_fn, opt, eps1=hp.cfl_eps[0], eps2=hp.cfl_eps[1],
        max_clusters=2 * num_clusters, local_steps=hp.local_steps,
        warmup_rounds=hp.cfl_warmup, attack=attack)
  # Myopic- and Momentum-Clustering read all their distances off one [N, N]
  # Gram matrix per round (method="gram"): at N=300 on the MNIST MLP one
  # Myopic-Clustering round takes 0.72 s instead of 5.3 s with "direct" (one
  # core, benchmarks/bench_myopic.py); the result differs only by float
  # rounding of the distances.
  if name == "myopic":
    return prfl.algorithms.myopic_clustering(
        loss_fn, opt, num_clusters=num_clusters, radius=radius,
        num_iters=hp.num_iters, attack=attack, method="gram")
  if name == "mc":
    alpha = 1.0 - hp.momentum
    return prfl.algorithms.momentum_clustering(
        loss_fn, optax.sgd(hp.lr / alpha), num_clusters=num_clusters,
        radius=radius, num_iters=hp.num_iters, alpha=alpha, attack=attack,
        method="gram")
  raise ValueError(f"unknown algorithm {name!r}; known: {ALGORITHMS}.")


def check_algorithms(names) -> tuple:
  """Validates a list of algorithm names; returns it as a tuple."""
  names = tuple(names)
  unknown = [n for n in names if n not in LABELS]
  if unknown or not names:
    raise ValueError(f"`algorithms` has unknown names {unknown} (or is "
                     f"empty); known: {', '.join(ALGORITHMS)}.")
  if len(set(names)) != len(names):
    raise ValueError(f"`algorithms` repeats a name: {list(names)}.")
  return names


def knn_data(data: prfl.data.FederatedData) -> prfl.data.FederatedData:
  """`data` whose test pytree also carries each client's datastore."""
  return data._replace(test=(data.test, data.train))


def knn_eval_fn(model: Model, hp: Hyper, num_classes: int) -> Callable:
  """kNN-Per's personalized evaluation of one client (see `knn_data`).

  The datastore is the client's training set; `lam` is fixed to
  `hp.knn_lam` (a one-point grid), as in the paper.
  """
  if model.feature_fn is None:
    raise ValueError("kNN-Per needs a model with a `feature_fn`.")

  def eval_fn(params, test_and_store):
    test, store = test_and_store
    k = min(hp.knn_k, np.shape(store[1])[0])
    return prfl.algorithms.knn_per_evaluate(
        model.logits_fn, model.feature_fn, params, train=store, val=store,
        test=test, k=k, num_classes=num_classes, lambdas=(hp.knn_lam,),
        temperature=hp.knn_temperature)
  return eval_fn


def run_algorithm(name: str, fed: prfl.data.Federation, model: Model,
                  hp: Hyper, *, num_rounds: int, eval_every: int,
                  seed: int, attack=None, log=print) -> dict:
  """Trains one algorithm on `fed` and summarises it.

  Every algorithm starts from the same initial model (drawn from `seed`) and
  sees the same batches (the same `train` key).

  Returns:
    `{"algorithm", "accuracy", "loss", "accuracy_per_cluster",
    "loss_per_cluster", "eval_round", "curve_accuracy", "curve_loss",
    "final_train_metrics", "seconds", "rounds"}`: final and per-evaluation
    means over benign clients of each client's model on its own test data,
    and the step metrics of the last round (e.g. IFCA's `num_clusters`).
  """
  key = jax.random.key(seed)
  init_key, alg_key, train_key = jax.random.split(key, 3)
  data = jax.device_put(fed.data)
  n = data.clusters.shape[0]
  num_clusters = int(np.max(fed.data.clusters)) + 1
  params = prfl.tree.broadcast(model.init(init_key), n)
  alg = build_algorithm(name, model.loss_fn, hp,
                        clusters=np.asarray(fed.data.clusters),
                        num_clusters=num_clusters, key=alg_key, attack=attack)
  eval_fn = model.eval_fn
  if name == "knn":
    data = knn_data(data)
    eval_fn = knn_eval_fn(model, hp, fed.num_classes)
  start = time.perf_counter()
  result = prfl.train(alg, params, data, num_rounds=num_rounds, key=train_key,
                      batch_size=hp.batch_size, eval_fn=eval_fn,
                      eval_every=eval_every, byzantine=fed.byzantine,
                      log=lambda s: log(f"  {name}: {s}"))
  seconds = time.perf_counter() - start
  h = result.history
  return {
      "algorithm": name,
      "accuracy": float(h["eval/accuracy"][-1]),
      "loss": float(h["eval/loss"][-1]),
      "accuracy_per_cluster": h["eval/accuracy/per_cluster"][-1],
      "loss_per_cluster": h["eval/loss/per_cluster"][-1],
      "eval_round": h["eval_round"],
      "curve_accuracy": h["eval/accuracy"],
      "curve_loss": h["eval/loss"],
      "final_train_metrics": {k[len("train/"):]: float(v[-1])
                              for k, v in h.items()
                              if k.startswith("train/")},
      "seconds": seconds,
      "rounds": num_rounds,
  }


def write_text(path: str, text: str):
  """Writes `text` to `path` atomically (no half-written file)."""
  common._atomic_write(path, lambda f: f.write(text))  # pylint: disable=protected-access


def versions() -> dict:
  """Versions of what produced the numbers (recorded beside the results)."""
  import flax  # pylint: disable=import-outside-toplevel
  try:
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True,
        check=True, cwd=__file__.rsplit("/", 2)[0]).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    commit = None
  return {"prfl_jax": prfl.__version__, "git_commit": commit,
          "jax": jax.__version__, "jaxlib": jax.lib.__version__,
          "flax": flax.__version__, "optax": optax.__version__,
          "numpy": np.__version__, "python": platform.python_version(),
          "platform": platform.platform(), "backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()]}


# 13+ distinguishable styles: colour x line style x marker; FC gets its own.
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown",
           "tab:pink", "tab:gray", "tab:olive", "tab:cyan", "gold", "navy",
           "teal", "maroon")
_DASHES = ("--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p", "d")
FC_STYLE = {"color": "red", "linestyle": "-", "linewidth": 2.8, "marker": None,
            "zorder": 10}
ORACLE_STYLE = {"color": "black", "linestyle": "-", "linewidth": 1.6,
                "marker": None, "zorder": 9}


def series_style(index: int, name: str) -> dict:
  """Line style of series `index`; FC and the oracle have fixed styles."""
  if name == "fc":
    return FC_STYLE
  if name == "oracle":
    return ORACLE_STYLE
  return {"color": _COLORS[index % len(_COLORS)],
          "linestyle": _DASHES[index % len(_DASHES)],
          "marker": _MARKERS[index % len(_MARKERS)], "markersize": 4,
          "linewidth": 1.2, "zorder": 2}


def plot_curves(results: dict, path: str, title: str,
                metric: str = "accuracy"):
  """Learning curves, one panel per task, the legend outside on the right.

  Args:
    results: `{task: [run dicts of run_algorithm]}`.
    path: PNG path.
    title: figure title.
    metric: "accuracy" (plotted in %) or "loss".
  """
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  tasks = list(results)
  fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.2),
                           squeeze=False, sharey=True)
  handles = {}
  for ax, task in zip(axes[0], tasks):
    for i, run in enumerate(results[task]):
      y = np.asarray(run[f"curve_{metric}"], np.float64)
      y = 100 * y if metric == "accuracy" else y
      (line,) = ax.plot(run["eval_round"], y, label=LABELS[run["algorithm"]],
                        **series_style(i, run["algorithm"]))
      handles.setdefault(LABELS[run["algorithm"]], line)
    ax.set_title(task.replace("_", " "))
    ax.set_xlabel("round (one batch of 32 per client)")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("test accuracy over benign clients (%)"
                        if metric == "accuracy" else
                        "test cross-entropy over benign clients (nats)")
  fig.legend(list(handles.values()), list(handles), loc="center left",
             bbox_to_anchor=(1.0, 0.5), frameon=False)
  fig.suptitle(title)
  fig.tight_layout()
  common.save_figure(fig, path)
  plt.close(fig)


def summary_rows(results: dict) -> list:
  """Flat CSV rows: one per (task, algorithm), with the accuracy gained over
  the last quarter of the evaluations (is the curve still rising?)."""
  rows = []
  for task, runs in results.items():
    for run in runs:
      curve = np.asarray(run["curve_accuracy"])
      rows.append({
          "task": task, "algorithm": run["algorithm"],
          "accuracy_pct": round(100 * run["accuracy"], 2),
          "loss": round(run["loss"], 4),
          "worst_cluster_accuracy_pct": round(
              100 * float(np.min(run["accuracy_per_cluster"])), 2),
          # Still rising? Accuracy gained over the last quarter of the run.
          "gain_last_quarter_pts": round(
              100 * float(curve[-1] - curve[(3 * len(curve)) // 4]), 2),
          "rounds": run["rounds"], "seconds": round(run["seconds"], 1)})
  return rows
