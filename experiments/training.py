"""Training algorithms on clustered federations of images, and summarising.

Table 1 (`experiments.mnist`), the Byzantine grid and the CIFAR figures all
size a federation from a data set, give every client the same initial model,
build each algorithm through `experiments.registry`, train it with
`prfl.train` (rounds, batch size and evaluation schedule from that
algorithm's settings) and summarise accuracy and loss over benign clients.
"""

import dataclasses
import time
from typing import Callable, NamedTuple, Optional

import jax
import numpy as np

import prfl_jax as prfl
from experiments import groups
from experiments import registry
from experiments.options import group, option

# Examples of each data set (split "train+test"; digits has one split).
SIZES = {"digits": 1797, "fashion_mnist": 70000, "mnist": 70000,
         "cifar10": 60000, "cifar100": 60000}
PAPER_GROUP_SIZE = 300 / 16  # The paper's 300 clients in 16 FC subgroups.


class Sizes(NamedTuple):
  """A federation's sizes."""
  clients_per_cluster: int
  num_clients: int
  train_per_client: int
  test_per_client: int
  groups: int  # FC's subgroups.


def federation_sizes(dataset: str, clusters: int, clients_per_cluster: int, *,
                     train: Optional[int] = None, test: Optional[int] = None,
                     batch_size: Optional[int] = None,
                     groups: Optional[int] = None) -> Sizes:
  """Examples per client and FC groups of a federation of `dataset`.

  A client's share is `SIZES[dataset] // clusters // clients_per_cluster`;
  by default 20% of it (at most 33) is its test set and the rest (at most
  200) its training set, and FC gets N / 18.75 groups (the paper's 16 at
  N = 300).

  Raises:
    ValueError: naming the options, if the data set is too small for the
      sizes, the batch exceeds a client's training set, or there are more
      groups than clients.
  """
  share = SIZES[dataset] // clusters // clients_per_cluster
  test = test or min(33, max(1, round(share / 5)))
  train = train or min(200, share - test)
  if train < 1 or train + test > share:
    raise ValueError(
        f"{clusters} clusters x {clients_per_cluster} clients get {share} "
        f"{dataset} examples each, fewer than --train-per-client + "
        f"--test-per-client = {train} + {test}: lower --clients-per-cluster "
        "or the per-client sizes.")
  if batch_size is not None and batch_size > train:
    raise ValueError(
        f"--batch-size {batch_size} exceeds the {train} training examples "
        "per client: lower it or --clients-per-cluster.")
  num_clients = clusters * clients_per_cluster
  groups = groups or max(1, round(num_clients / PAPER_GROUP_SIZE))
  if groups > num_clients:
    raise ValueError(f"--groups {groups} exceeds the {num_clients} clients.")
  return Sizes(clients_per_cluster, num_clients, train, test, groups)


@dataclasses.dataclass(frozen=True)
class Mlp:
  """The paper's MLP for MNIST-like images (§5.2)."""
  hidden: int = option(200, "hidden units of the MLP (the paper's 200)",
                       low=1)


@dataclasses.dataclass(frozen=True)
class ImageConfig:
  """The options every MLP-on-images experiment shares (Table 1, the
  Byzantine experiment, sweeps); an experiment adds its algorithms and own
  options."""
  run: groups.Run = group(groups.Run)
  data: groups.Data = group(groups.Data)
  federation: groups.Federation = group(groups.Federation)
  mlp: Mlp = group(Mlp)
  optim: groups.Optim = group(groups.Optim)
  schedule: groups.Schedule = group(groups.Schedule)
  clustering: groups.Clustering = group(groups.Clustering)


def load_images(cfg):
  """`(dataset, the paper's MLP for it)` of an `ImageConfig`.

  Raises:
    ValueError / OSError: a missing or malformed data set (the message says
      what to install or pass).
  """
  d = cfg.data
  ds = prfl.data.load_dataset(
      d.dataset, data_dir=d.data_dir, source=d.source,
      split="train" if d.dataset == "digits" else "train+test")
  return ds, mlp(int(np.prod(ds.images.shape[1:])), cfg.mlp.hidden,
                 ds.num_classes)


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
  layers the ghost kernel finds by itself. It does not mask padded labels,
  so `check_batches_are_valid` must hold. kNN-Per's features are the hidden
  layer's ReLU activations.
  """
  def logits_fn(params, x):
    return prfl.models.mlp_apply(params, x)

  def feature_fn(params, x):
    return jax.nn.relu(prfl.models.mlp_apply({"Dense_0": params["Dense_0"]},
                                             x))

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
  if batch_size is not None and counts.min() < batch_size:
    raise ValueError(
        f"--batch-size {batch_size} exceeds the smallest client's "
        f"{counts.min()} training examples: lower it or give clients more "
        "examples.")


def knn_eval_fn(model: Model, s: registry.Settings, num_classes: int,
                lam: float) -> Callable:
  """kNN-Per's personalized evaluation of one client.

  Its test pytree is `(test, store)` (`with_datastore`); the datastore is
  the client's training set and `lam` is fixed (a one-point grid), as in the
  paper.
  """
  if model.feature_fn is None:
    raise ValueError("kNN-Per needs a model with a `feature_fn`.")

  def eval_fn(params, test_and_store):
    test, store = test_and_store
    k = min(s.knn_k, np.shape(store[1])[0])
    return prfl.algorithms.knn_per_evaluate(
        model.logits_fn, model.feature_fn, params, train=store, val=store,
        test=test, k=k, num_classes=num_classes, lambdas=(lam,),
        temperature=s.knn_temperature)
  return eval_fn


def with_datastore(data: prfl.data.FederatedData) -> prfl.data.FederatedData:
  """`data` whose test pytree also carries each client's datastore."""
  return data._replace(test=(data.test, data.train))


def context(fed: prfl.data.Federation, loss_fn: Callable, key: jax.Array,
            **kwargs) -> registry.Context:
  """The registry's context on `fed`: its true clusters (the oracle's input)
  and their number K."""
  clusters = np.asarray(fed.data.clusters)
  return registry.Context(loss_fn, clusters=clusters,
                          num_clusters=int(clusters.max()) + 1, key=key,
                          **kwargs)


def eval_every(s: registry.Settings) -> int:
  """Rounds between evaluations: the setting, or about 20 per run."""
  return min(s.eval_every or max(1, s.rounds // 20), s.rounds)


def train(name: str, s: registry.Settings, ctx: registry.Context,
          fed: prfl.data.Federation, model: Model, params, *,
          train_key: jax.Array, tracker, tag: str,
          eval_fn: Optional[Callable] = None, data=None) -> dict:
  """Trains algorithm `name` with settings `s` and summarises it.

  Args:
    name, s, ctx: the algorithm (`experiments.registry`).
    fed: the federation.
    model: the classifier.
    params: initial params, leaves `[N, ...]`.
    train_key: `prfl.train`'s key (batches and step randomness).
    tracker: `experiments.tracking.Tracker` (progress and TensorBoard).
    tag: the run's name in progress lines and TensorBoard.
    eval_fn, data: override `model.eval_fn` / `fed.data` (kNN-Per).

  Returns:
    `summarise`'s dict.
  """
  alg = registry.build(name, ctx, s)
  start = time.perf_counter()
  result = prfl.train(
      alg, params, jax.device_put(fed.data if data is None else data),
      num_rounds=s.rounds, key=train_key, batch_size=s.batch_size,
      eval_fn=eval_fn or model.eval_fn, eval_every=eval_every(s),
      byzantine=fed.byzantine, log=tracker.train_log(tag, s.rounds))
  seconds = time.perf_counter() - start
  tracker.history(tag, result.history)
  out = summarise(result, fed.byzantine)
  out.update(algorithm=name, seconds=seconds, rounds=s.rounds,
             batch_size=s.batch_size)
  return out


def summarise(result: prfl.TrainResult, byzantine) -> dict:
  """Final and per-evaluation means over benign clients of each client's
  model on its own test data; the step metrics of the last round (e.g.
  IFCA's `num_clusters`) and their means over the last 10% of the rounds;
  benign models holding NaN/Inf."""
  h = result.history
  n = np.shape(byzantine)[0]
  finite = np.ones(n, bool)
  for leaf in jax.tree.leaves(result.state.params):
    finite &= np.all(np.isfinite(np.asarray(leaf).reshape(n, -1)), axis=1)
  accuracy = np.asarray(h["eval/accuracy"])
  tail = max(1, len(h["round"]) // 10)
  return {
      "accuracy": float(accuracy[-1]),
      "loss": float(h["eval/loss"][-1]),
      "best_accuracy": float(np.nanmax(accuracy)),
      "accuracy_per_cluster": h["eval/accuracy/per_cluster"][-1],
      "loss_per_cluster": h["eval/loss/per_cluster"][-1],
      "eval_round": h["eval_round"],
      "curve_accuracy": accuracy,
      "curve_loss": h["eval/loss"],
      "final_train_metrics": {k[len("train/"):]: float(v[-1])
                              for k, v in h.items()
                              if k.startswith("train/")},
      # Step metrics over the last 10% of the rounds (e.g. FC's share of
      # Byzantine clients inside its balls).
      "tail_train_metrics": {k[len("train/"):]: float(np.mean(v[-tail:]))
                             for k, v in h.items()
                             if k.startswith("train/")},
      "nonfinite_benign_models": int(np.sum(~np.asarray(byzantine) &
                                            ~finite)),
      "train_curves": interval_means(h),
  }


def interval_means(history: dict) -> dict:
  """Every step metric (`train/<name>`, one value a round) averaged over
  each evaluation interval: `{name: [E - 1]}`, entry e over the rounds
  `(eval_round[e], eval_round[e + 1]]`, so it lines up with
  `eval_round[1:]` (the clustering diagnostics over the rounds, small
  enough for results.json)."""
  edges = np.asarray(history["eval_round"]) - history["round"][0] + 1
  return {k[len("train/"):]: [float(np.mean(np.asarray(v)[a:b]))
                              for a, b in zip(edges[:-1], edges[1:])]
          for k, v in history.items()
          if k.startswith("train/") and np.ndim(v) == 1}


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
          "gain_last_quarter_pts": round(
              100 * float(curve[-1] - curve[(3 * len(curve)) // 4]), 2),
          "rounds": run["rounds"], "seconds": round(run["seconds"], 1)})
  return rows


def progress_line(index: int, total: int, what: str, r: dict,
                  start: float) -> str:
  """`[i/n] what: accuracy ..% (..s; ..s elapsed, ~..s left)`."""
  elapsed = time.perf_counter() - start
  left = elapsed / index * (total - index)
  bad = (f", {r['nonfinite_benign_models']} benign models non-finite"
         if r.get("nonfinite_benign_models") else "")
  return (f"[{index}/{total}] {what}: accuracy {100 * r['accuracy']:.2f}%, "
          f"loss {r['loss']:.4f}{bad} ({r['seconds']:.1f}s; {elapsed:.0f}s "
          f"elapsed, ~{left:.0f}s left)")
