"""Momentum-Clustering's open choices, one at a time, with the diagnostics.

Trains Momentum-Clustering variants (and Myopic-Clustering and the oracle
beside them) on one federation and writes every round's clustering
diagnostics (`prfl_jax.diagnostics`: active clusters, distinct centres, ARI,
purity, effective count, ...) and the evaluation curves:

  python -m experiments.momentum_variants \\
      --config experiments/configs/momentum_variants/fashion_rotation.toml \\
      --out experiments/results/momentum_clustering/fashion_rotation
  python -m experiments.momentum_variants --smoke    # seconds

Writes `config.json` (first, with versions and backend), `results.json`
(config, per-variant curves and final values), `summary.csv` (one row per
variant) and `curves.png` (accuracy or error, active clusters,
ARI, purity over the rounds). The Fashion-MNIST federation, MLP, batch 32,
lr 0.1 and momentum 0.9 are Table 1's (`experiments/configs/mnist/`);
Momentum-Clustering steps lr / alpha with alpha = 1 - momentum, as the
registry's `mc`. The synthetic federation is Figure 3's linear regression
(K = 4, d = 10, full-batch gradients).
"""

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import prfl_jax as prfl
from prfl_jax.algorithms.momentum_clustering import PAPER_LITERAL
from experiments import cli
from experiments import files
from experiments import groups
from experiments import options
from experiments import training
from experiments.options import group, option

FREEZE = "--freeze-after"  # Stand for the options' values.
STABLE = "--stable-rounds"
WARMUP = "--warmup-rounds"
ROUNDS = "--rounds"
START = "start"  # The driver's key, not the library's: see `initial_state`.
# Every variant spells out all of the open choices, so that a committed run
# keeps its meaning when the library's default changes. "paper" is
# Algorithm 3 as written; "default" is the library's default before 27
# November (own-client balls, sticky), kept under its old name for the
# committed runs; "assigned_stable_warm" is the library's default from then
# to session 11 (its warm-up: 10 rounds until session 8, 5 since;
# --warmup-rounds); "assigned_stable_warm_loss_reseed_split" is the
# library's default since session 12.
_PAPER = PAPER_LITERAL
_ASSIGNED = {**_PAPER, "balls": "assigned"}
_STICKY = {**_ASSIGNED, "sticky": True}
VARIANTS = {
    "paper": _PAPER,
    "paper_warmup": {**_PAPER, "warmup_rounds": WARMUP},
    "paper_reseed": {**_PAPER, "reseed": True},
    "paper_bias": {**_PAPER, "bias_correction": True},
    "assigned": _ASSIGNED,
    "default": _STICKY,
    "default_reseed": {**_STICKY, "reseed": True},
    "default_bias": {**_STICKY, "bias_correction": True},
    # From round --freeze-after on no client changes centre.
    "default_freeze": {**_STICKY, "freeze_after": FREEZE},
    "assigned_freeze": {**_ASSIGNED, "freeze_after": FREEZE},
    # No client changes centre once none has for --stable-rounds rounds.
    "assigned_stable": {**_ASSIGNED, "freeze_when_stable": STABLE},
    "default_stable": {**_STICKY, "freeze_when_stable": STABLE},
    # ... after --warmup-rounds rounds of own steps, the clients of a centre
    # then taking its mean model.
    "assigned_stable_warm": {**_ASSIGNED, "freeze_when_stable": STABLE,
                             "warmup_rounds": WARMUP, "seed_average": True},
    # ... each client then going to the centre whose mean model gives it
    # the lowest loss (IFCA's signal), not the nearest to its momentum.
    "assigned_stable_warm_loss": {**_ASSIGNED, "freeze_when_stable": STABLE,
                                  "warmup_rounds": WARMUP,
                                  "seed_average": True, "assign": "loss"},
    # ... and an emptied centre re-seeded: its model one own step of a
    # random client of the largest cluster (session 11).
    "assigned_stable_warm_loss_reseed": {
        **_ASSIGNED, "freeze_when_stable": STABLE, "warmup_rounds": WARMUP,
        "seed_average": True, "assign": "loss", "reseed": True},
    # ... the emptied centre re-seeded at the worst-fit client of the
    # largest cluster (highest loss at its centre's model), or at the half
    # of the largest cluster that 2-means on the momenta splits off, its
    # model that half's mean own step (session 12).
    "assigned_stable_warm_loss_reseed_worst": {
        **_ASSIGNED, "freeze_when_stable": STABLE, "warmup_rounds": WARMUP,
        "seed_average": True, "assign": "loss", "reseed": True,
        "reseed_pick": "worst"},
    "assigned_stable_warm_loss_reseed_split": {
        **_ASSIGNED, "freeze_when_stable": STABLE, "warmup_rounds": WARMUP,
        "seed_average": True, "assign": "loss", "reseed": True,
        "reseed_pick": "split"},
    # Diagnostics, not methods (session 9, issue 19; README "Why the
    # assignment never settles"). Every client steps with its own momentum
    # in every round, never clustered: the momenta's geometry along the
    # warm-up's trajectory, read off the sep_* curves.
    "own": {**_ASSIGNED, "warmup_rounds": ROUNDS, "seed_average": False,
            "freeze_when_stable": None},
    # Started at the true assignment (round 1, frozen: no client ever
    # changes centre), with distinct carried centres; the equal-centres
    # form starts every centre at 0, which Threshold-Clustering merges.
    "truth_frozen": {**_ASSIGNED, "warmup_rounds": 0, "seed_average": False,
                     "freeze_when_stable": 1, START: "truth"},
    "truth_frozen_equal_centres": {
        **_ASSIGNED, "warmup_rounds": 0, "seed_average": False,
        "freeze_when_stable": 1, START: "truth_equal_centres"},
}
BASELINES = ("myopic", "oracle")
CURVES = ("num_active_clusters", "distinct_centers", "ari", "nmi", "purity",
          "byzantine_weight", "effective_count", "own_weight",
          "center_dist_min", "carried_weight", "reseeded", "moved",
          "frozen", "sep_spread", "sep_delta", "sep_ari",
          "sep_spread_per_cluster", "loss",
          "grad_norm", "error")




@dataclasses.dataclass(frozen=True)
class Config:
  """Every option of the comparison (defaults: the Fashion-MNIST run's)."""
  run: groups.Run = group(groups.Run)
  federation: groups.Federation = group(groups.Federation,
                                        clients_per_cluster=25)
  schedule: groups.Schedule = group(groups.Schedule, rounds=100)
  clustering: groups.Radius = group(groups.Radius)
  data: str = option("fashion_mnist", "the federation's data (synthetic: "
                     "Figure 3's linear regression, d = 10, full batches)",
                     choices=("fashion_mnist", "digits", "synthetic"))
  task: str = option("rotation", "how the clusters differ (image data)",
                     choices=("rotation", "private_label"))
  variants: tuple[str, ...] = option(
      ("paper", "assigned_stable_warm", "myopic", "oracle"),
      "comma-separated variants and baselines "
      "('assigned_stable_warm_loss_reseed_split': the library's default "
      "since session 12; 'assigned_stable_warm': its default from 27 "
      "November to session 11; 'default': its default before)",
      choices=tuple(VARIANTS) + BASELINES)
  assigned_quantile: float = option(
      0.95, "radius quantile of the 'assigned' variants: over a centre's "
      "own clients", low=0, high=1, low_open=True)
  freeze_after: int = option(
      20, "the '_freeze' variants: no client changes centre from this round "
      "on", low=1)
  stable_rounds: int = option(
      5, "the '_stable' variants: no client changes centre once none has "
      "for this many consecutive rounds", low=1)
  warmup_rounds: int = option(
      5, "the '_warm' and '_warmup' variants: rounds of own-momentum steps "
      "before the centres are seeded (the library's default; the committed "
      "runs' presets before session 8 set 10)", low=1)
  cluster_spreads: bool = option(
      False, "log every true cluster's momentum spread in every round "
      "(curve sep_spread_per_cluster, [rounds, K]; the Momentum-Clustering "
      "variants)")


def resolve(cfg: Config) -> Config:
  """Checks the options together and fills in the output directory.

  Raises:
    ValueError: naming the option.
  """
  if (cfg.federation.clients_per_cluster or 0) < 2:
    raise ValueError("--clients-per-cluster must be at least 2 (a cluster "
                     f"of one has no distances), got "
                     f"{cfg.federation.clients_per_cluster}.")
  if cfg.data == "synthetic":
    for name in ("train_per_client", "test_per_client"):
      if getattr(cfg.federation, name) is not None:
        raise ValueError(f"--{name.replace('_', '-')} sets image "
                         "federations; the synthetic one has 9 samples per "
                         "client.")
  return options.replace(cfg, out=cfg.run.out or os.path.join(
      "results", "momentum_variants", *(["smoke"] if cfg.run.smoke else [])))


def federation(cfg: Config):
  """`(data, params, loss_fn, eval_fn, byzantine, lr, momentum, batch)`."""
  key = jax.random.key(cfg.run.seed)
  k = cfg.federation.clusters
  if cfg.data == "synthetic":
    data, _ = prfl.data.synthetic_regression(
        key, num_clusters=k,
        clients_per_cluster=cfg.federation.clients_per_cluster)
    n = data.clusters.shape[0]
    return (data, jnp.zeros((n, 10)), prfl.data.regression_loss,
            prfl.data.regression_eval, None, 0.004, 0.9, None)
  ds = prfl.data.load_dataset(
      cfg.data, split="train" if cfg.data == "digits" else "train+test")
  fed = prfl.data.federate(
      ds, task=cfg.task, num_clusters=k,
      clients_per_cluster=cfg.federation.clients_per_cluster,
      train_per_client=cfg.federation.train_per_client,
      test_per_client=cfg.federation.test_per_client, seed=cfg.run.seed)
  model = training.mlp(int(np.prod(ds.images.shape[1:])), 200,
                       ds.num_classes)
  init_key, _ = jax.random.split(key)
  n = fed.data.clusters.shape[0]
  params = prfl.tree.broadcast(model.init(init_key), n)
  return (jax.device_put(fed.data), params, model.loss_fn, model.eval_fn,
          fed.byzantine, 0.1, 0.9, 32)


def build(name, cfg: Config, loss_fn, truth, lr, momentum):
  alpha = 1.0 - momentum
  if name == "oracle":
    return prfl.algorithms.oracle(loss_fn, optax.sgd(lr, momentum=momentum),
                                  clusters=truth)
  if name == "myopic":
    return prfl.algorithms.myopic_clustering(
        loss_fn, optax.sgd(lr, momentum=momentum),
        num_clusters=cfg.federation.clusters,
        radius=prfl.quantile_radius(cfg.clustering.quantile), method="gram",
        true_clusters=truth)
  values = {FREEZE: cfg.freeze_after, STABLE: cfg.stable_rounds,
            WARMUP: cfg.warmup_rounds, ROUNDS: cfg.schedule.rounds}
  kw = {k: values.get(v, v) if isinstance(v, str) else v
        for k, v in VARIANTS[name].items() if k != START}
  q = (cfg.clustering.quantile if kw.get("balls") == "all" else
       cfg.assigned_quantile)
  alg = prfl.algorithms.momentum_clustering(
      loss_fn, optax.sgd(lr / alpha), num_clusters=cfg.federation.clusters,
      radius=prfl.quantile_radius(q), alpha=alpha, method="gram",
      true_clusters=truth, **kw)
  return with_cluster_spreads(alg, truth) if cfg.cluster_spreads else alg


def with_cluster_spreads(alg, truth):
  """`alg` (Momentum-Clustering) whose step also reports
  `sep_spread_per_cluster`, `[K_true]`: every true cluster's root-mean-square
  distance of its benign clients' momenta (the state's, not bias-corrected)
  to their mean, of which the step's `sep_spread` is the maximum
  (`prfl.diagnostics.rounds.cluster_spreads`)."""
  t = prfl.diagnostics.check_true_clusters(truth)

  def step(state, batch, key):
    state, metrics = alg.step(state, batch, key)
    metrics["sep_spread_per_cluster"] = (
        prfl.diagnostics.rounds.cluster_spreads(state.momentum, t,
                                                ~state.byzantine))
    return state, metrics

  return alg._replace(step=step)


def initial_state(name, alg, params, truth, byzantine=None):
  """The state variant `name` starts from: None (`alg.init`'s) except for
  the 'truth_frozen' variants: seeded (round 1) at the true assignment,
  already frozen, with carried centres `1e-3 * (k + 1)` in every coordinate
  (distinct) or all 0 (`truth_equal_centres`)."""
  how = VARIANTS.get(name, {}).get(START)
  if how is None:
    return None
  state = alg.init(params, byzantine=byzantine)
  k = prfl.tree.num_leading(state.centers)
  scale = jnp.arange(1.0, k + 1) * (1e-3 if how == "truth" else 0.0)
  centers = jax.tree.map(
      lambda c: (scale.reshape((k,) + (1,) * (c.ndim - 1)) *
                 jnp.ones_like(c)).astype(c.dtype), state.centers)
  return state._replace(assignment=jnp.asarray(truth, jnp.int32),
                        round=jnp.ones((), jnp.int32),
                        still=jnp.ones((), jnp.int32), centers=centers)


def run(cfg: Config, prepared, tracker, command: str = ""):
  """Every variant on the federation `prepared` (`federation(cfg)`); writes
  results.json, summary.csv and curves.png."""
  del command  # In config.json.
  data, params, loss_fn, eval_fn, byz, lr, momentum, batch = prepared
  names, rounds = cfg.variants, cfg.schedule.rounds
  truth = np.asarray(data.clusters)
  metric = "error" if cfg.data == "synthetic" else "accuracy"
  runs, rows = {}, []
  start = time.perf_counter()
  for i, name in enumerate(names):
    t0 = time.perf_counter()
    alg = build(name, cfg, loss_fn, truth, lr, momentum)
    state0 = initial_state(name, alg, params, truth, byz)
    r = prfl.train(alg, params, data, num_rounds=rounds,
                   key=jax.random.key(cfg.run.seed + 1), batch_size=batch,
                   eval_fn=eval_fn, eval_every=cfg.schedule.eval_every or
                   max(1, rounds // 20),
                   byzantine=byz if state0 is None else None,
                   initial_state=state0,
                   verbose=False)
    h = r.history
    curves = {k: np.asarray(h[f"train/{k}"]).tolist() for k in CURVES
              if f"train/{k}" in h}
    runs[name] = {"curves": curves, "eval_round": h["eval_round"],
                  f"eval_{metric}": np.asarray(h[f"eval/{metric}"]).tolist(),
                  "seconds": time.perf_counter() - t0}
    tail = max(1, rounds // 10)
    row = {"variant": name, metric: round(float(h[f"eval/{metric}"][-1]), 4)}
    for k in ("num_active_clusters", "distinct_centers", "ari", "purity",
              "effective_count", "moved", "sep_ari"):
      if k in curves:
        row[f"{k}_tail"] = round(float(np.mean(curves[k][-tail:])), 3)
    row["seconds"] = round(runs[name]["seconds"], 1)
    rows.append(row)
    tracker.log(f"[{i + 1}/{len(names)}] {name}: {row} "
                f"(load {os.getloadavg()[0]:.1f})")
  out = cfg.run.out
  files.write_json(os.path.join(out, "results.json"), {
      "config": options.to_dict(cfg),
      "variants": {n: VARIANTS.get(n, {}) for n in names},
      "seconds": time.perf_counter() - start, "load_end": os.getloadavg(),
      "runs": runs})
  files.write_csv(os.path.join(out, "summary.csv"), rows)
  if cfg.run.plots:
    plot(runs, metric, os.path.join(out, "curves.png"),
         f"Momentum-Clustering variants: {cfg.data} "
         f"{cfg.task if batch else ''} N={len(truth)}")
  return rows


def plot(runs, metric, path, title):
  plt = files.pyplot()
  fig, axes = plt.subplots(1, 4, figsize=(18, 4))
  for name, run in runs.items():
    axes[0].plot(run["eval_round"], run[f"eval_{metric}"], label=name)
    for ax, k in zip(axes[1:], ("num_active_clusters", "ari", "purity")):
      if k in run["curves"]:
        ax.plot(run["curves"][k], label=name, lw=1)
  for ax, k in zip(axes, (metric, "active clusters", "ARI", "purity")):
    ax.set_title(k)
    ax.set_xlabel("round")
  axes[0].legend(fontsize=7)
  fig.suptitle(title)
  files.save_figure(fig, path)


EXPERIMENT = cli.Experiment("momentum_variants", __doc__, Config, resolve,
                            federation, run)

main = EXPERIMENT.main


if __name__ == "__main__":
  main()
