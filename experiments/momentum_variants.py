"""Momentum-Clustering's open choices, one at a time, with the diagnostics.

Trains Momentum-Clustering variants (and Myopic-Clustering and the oracle
beside them) on one federation and writes every round's clustering
diagnostics (`prfl_jax.diagnostics`: active clusters, distinct centres, ARI,
purity, effective count, ...) and the evaluation curves:

  python -m experiments.momentum_variants --data fashion_mnist \\
      --task rotation --clients-per-cluster 25 --rounds 100 \\
      --out experiments/results/momentum_clustering/fashion_rotation

`results.json` (config, per-variant curves and final values), `summary.csv`
(one row per variant) and `curves.png` (accuracy or error, active clusters,
ARI, purity over the rounds). The Fashion-MNIST federation, MLP, batch 32,
lr 0.1 and momentum 0.9 are Table 1's (`experiments/configs/mnist/`);
Momentum-Clustering steps lr / alpha with alpha = 1 - momentum, as the
registry's `mc`. The synthetic federation is Figure 3's linear regression
(K = 4, d = 10, full-batch gradients).
"""

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import prfl_jax as prfl
from experiments import files
from experiments import training

# name -> momentum_clustering keyword arguments (beyond the paper: all but
# "paper"; "default" is the library's default).
VARIANTS = {
    "paper": dict(balls="all"),
    "paper_warmup": dict(balls="all", warmup_rounds=10),
    "paper_reseed": dict(balls="all", reseed=True),
    "paper_bias": dict(balls="all", bias_correction=True),
    "assigned": dict(balls="assigned", sticky=False),
    "default": dict(),
    "default_reseed": dict(reseed=True),
    "default_bias": dict(bias_correction=True),
}
BASELINES = ("myopic", "oracle")
CURVES = ("num_active_clusters", "distinct_centers", "ari", "nmi", "purity",
          "byzantine_weight", "effective_count", "own_weight",
          "center_dist_min", "carried_weight", "reseeded", "loss",
          "grad_norm", "error")


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--data", default="fashion_mnist",
                 choices=("fashion_mnist", "digits", "synthetic"))
  p.add_argument("--task", default="rotation",
                 choices=("rotation", "private_label"))
  p.add_argument("--clients-per-cluster", type=int, default=25)
  p.add_argument("--rounds", type=int, default=100)
  p.add_argument("--variants", default="paper,default,myopic,oracle",
                 help="comma-separated: " + ", ".join(
                     tuple(VARIANTS) + BASELINES))
  p.add_argument("--quantile", type=float, default=0.2,
                 help="radius quantile of the paper-literal variants and "
                 "Myopic-Clustering (the paper's 20th percentile)")
  p.add_argument("--assigned-quantile", type=float, default=0.95,
                 help="radius quantile of the 'assigned' variants: over a "
                 "centre's own clients")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  names = args.variants.split(",")
  unknown = [v for v in names if v not in VARIANTS and v not in BASELINES]
  if unknown:
    p.error(f"--variants: unknown {unknown}; known: "
            f"{', '.join(tuple(VARIANTS) + BASELINES)}")
  for name in ("quantile", "assigned_quantile"):
    if not 0.0 < getattr(args, name) <= 1.0:
      p.error(f"--{name.replace('_', '-')} must be in (0, 1]")
  if args.rounds < 1 or args.clients_per_cluster < 2:
    p.error("--rounds must be >= 1 and --clients-per-cluster >= 2")
  return args, names


def federation(args):
  """`(data, params, loss_fn, eval_fn, byzantine, lr, momentum, batch)`."""
  key = jax.random.key(args.seed)
  if args.data == "synthetic":
    data, _ = prfl.data.synthetic_regression(
        key, num_clusters=4, clients_per_cluster=args.clients_per_cluster)
    n = data.clusters.shape[0]
    return (data, jnp.zeros((n, 10)), prfl.data.regression_loss,
            prfl.data.regression_eval, None, 0.004, 0.9, None)
  ds = prfl.data.load_dataset(
      args.data, split="train" if args.data == "digits" else "train+test")
  fed = prfl.data.federate(ds, task=args.task, num_clusters=4,
                           clients_per_cluster=args.clients_per_cluster,
                           seed=args.seed)
  model = training.mlp(int(np.prod(ds.images.shape[1:])), 200,
                       ds.num_classes)
  init_key, _ = jax.random.split(key)
  n = fed.data.clusters.shape[0]
  params = prfl.tree.broadcast(model.init(init_key), n)
  return (jax.device_put(fed.data), params, model.loss_fn, model.eval_fn,
          fed.byzantine, 0.1, 0.9, 32)


def build(name, args, loss_fn, truth, lr, momentum):
  alpha = 1.0 - momentum
  if name == "oracle":
    return prfl.algorithms.oracle(loss_fn, optax.sgd(lr, momentum=momentum),
                                  clusters=truth)
  if name == "myopic":
    return prfl.algorithms.myopic_clustering(
        loss_fn, optax.sgd(lr, momentum=momentum), num_clusters=4,
        radius=prfl.quantile_radius(args.quantile), method="gram",
        true_clusters=truth)
  kw = VARIANTS[name]
  q = (args.quantile if kw.get("balls") == "all" else args.assigned_quantile)
  return prfl.algorithms.momentum_clustering(
      loss_fn, optax.sgd(lr / alpha), num_clusters=4,
      radius=prfl.quantile_radius(q), alpha=alpha, method="gram",
      true_clusters=truth, **kw)


def main(argv=None):
  args, names = parse(argv)
  data, params, loss_fn, eval_fn, byz, lr, momentum, batch = federation(args)
  truth = np.asarray(data.clusters)
  metric = "error" if args.data == "synthetic" else "accuracy"
  runs, rows = {}, []
  start = time.perf_counter()
  for i, name in enumerate(names):
    t0 = time.perf_counter()
    r = prfl.train(build(name, args, loss_fn, truth, lr, momentum), params,
                   data, num_rounds=args.rounds,
                   key=jax.random.key(args.seed + 1), batch_size=batch,
                   eval_fn=eval_fn, eval_every=max(1, args.rounds // 20),
                   byzantine=byz, verbose=False)
    h = r.history
    curves = {k: np.asarray(h[f"train/{k}"]).tolist() for k in CURVES
              if f"train/{k}" in h}
    runs[name] = {"curves": curves, "eval_round": h["eval_round"],
                  f"eval_{metric}": np.asarray(h[f"eval/{metric}"]).tolist(),
                  "seconds": time.perf_counter() - t0}
    tail = max(1, args.rounds // 10)
    row = {"variant": name, metric: round(float(h[f"eval/{metric}"][-1]), 4)}
    for k in ("num_active_clusters", "distinct_centers", "ari", "purity",
              "effective_count"):
      if k in curves:
        row[f"{k}_tail"] = round(float(np.mean(curves[k][-tail:])), 3)
    row["seconds"] = round(runs[name]["seconds"], 1)
    rows.append(row)
    print(f"[{i + 1}/{len(names)}] {name}: {row} "
          f"(load {os.getloadavg()[0]:.1f})", flush=True)
  files.write_json(os.path.join(args.out, "results.json"), {
      "config": vars(args), "variants": {n: VARIANTS.get(n, {}) for n in
                                         names},
      "seconds": time.perf_counter() - start, "load_end": os.getloadavg(),
      "runs": runs})
  files.write_csv(os.path.join(args.out, "summary.csv"), rows)
  plot(runs, metric, os.path.join(args.out, "curves.png"),
       f"Momentum-Clustering variants: {args.data} {args.task if batch else ''}"
       f" N={4 * args.clients_per_cluster}")


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


if __name__ == "__main__":
  main()
