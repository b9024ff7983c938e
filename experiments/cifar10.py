"""Figure 4 of Werner et al. (2023): CIFAR-10 with private labels (§5.3.1).

4 clusters x 5 clients; cluster k relabels y -> (y + k) mod 10, so the same
image has different labels in different clusters. VGG-16, batch 32, SGD with
learning rate 0.1 and momentum 0.9. Three panels of personalized test accuracy
against rounds: (left) FC against Local, Global (FedAvg), Ditto, IFCA and the
ground-truth clusters; (middle) FC's radius as a percentile of the distances
to the centre; (right) FC with local steps between clustering rounds.

  python -m experiments.cifar10 --data-dir ~/data/cifar10   # the paper's setup
  python -m experiments.cifar10 --dataset fashion_mnist --model cnn \\
      --width-divisor 4 --rounds 100                         # CPU stand-in
  python -m experiments.cifar10 --smoke                      # seconds

Writes `config.json` (first), `results.json`, `summary.csv`, `results.md` and
`figure4.png` to `--out`.
"""

import sys
import time


import prfl_jax as prfl
from experiments import cifar_common as cc
from experiments import cli

ALGORITHMS = ("fc", "local", "global", "ditto", "ifca", "oracle")
LABELS = {"fc": "FC (ours)", "local": "Local", "global": "Global (FedAvg)",
          "ditto": "Ditto (lambda=1)", "ifca": "IFCA", "oracle":
          "Ground truth (oracle)"}
# Figure 4 shows curves only; the text says what they show.
PAPER = {"fc": "above Local, close to ground truth",
         "local": "well above Ditto/IFCA/Global",
         "global": "poor (conflicting labels)",
         "ditto": "poor", "ifca": "poor", "oracle": "best (oracle)"}


def build_parser():
  p = cli.parser(__doc__, out="results/cifar10", smoke={
      "dataset": "synthetic", "model": "cnn", "width_divisor": "8",
      "image_size": "8", "rounds": "2", "eval_every": "1",
      "clients_per_cluster": "2", "train_per_client": "8",
      "test_per_client": "4", "batch_size": "4", "algorithms": "fc,local",
      "quantiles": "0.5", "local_steps": "1"})
  cc.add_options(p, dataset="cifar10", model="vgg16", num_clusters=4,
                 clients_per_cluster=5, rounds=1000, eval_every=50)
  p.add_argument("--algorithms", type=cli.choices(ALGORITHMS),
                 default=",".join(ALGORITHMS))
  p.add_argument("--quantiles", type=cli.list_of(cli.real(0, 1, low_open=True)),
                 default="0.1,0.2,0.5",
                 help="FC radius percentiles of the middle panel ('' is "
                 "rejected; use --no-sweeps to skip)")
  p.add_argument("--local-steps", type=cli.list_of(cli.integer(minimum=0)),
                 default="0,1,4",
                 help="FC local steps between clustering rounds (right panel)")
  p.add_argument("--ditto-lambda", type=cli.real(0), default=1.0)
  p.add_argument("--no-sweeps", action="store_true",
                 help="only the left panel")
  p.set_defaults(synthetic_classes=10)
  return p


def validate(args):
  """Cross-option checks of Figure 4 (on top of `cifar_common.validate`)."""
  cc.validate(args, task="private_label")
  for option, values in (("--quantiles", args.quantiles),
                         ("--local-steps", args.local_steps)):
    if len(set(values)) != len(values):
      raise ValueError(f"`{option}` repeats a value: {values}.")


def run(args) -> dict:
  fed = cc.load_federation(args, task="private_label")
  s = cc.setup(args, fed)
  k = args.num_clusters
  opt = s.opt(args.lr)
  fc = lambda q, steps: prfl.algorithms.federated_clustering(
      s.loss_fn, opt, radius=prfl.quantile_radius(q), num_iters=args.num_iters,
      local_steps=steps)
  build = {
      "fc": lambda: fc(args.quantile, 0),
      "local": lambda: prfl.algorithms.local(s.loss_fn, opt),
      "global": lambda: prfl.algorithms.fedavg(s.loss_fn, opt),
      "ditto": lambda: prfl.algorithms.ditto(s.loss_fn, opt,
                                             lam=args.ditto_lambda),
      "ifca": lambda: prfl.algorithms.ifca(
          s.loss_fn, opt, num_clusters=k,
          init_models=cc.ifca_init_models(s, k, args.seed)),
      "oracle": lambda: prfl.algorithms.oracle(s.loss_fn, opt,
                                               clusters=fed.data.clusters),
  }
  # (panel, name, label, factory); FC at (--quantile, 0 steps) is run once.
  jobs = [("algorithms", a, LABELS[a], build[a]) for a in args.algorithms]
  if not args.no_sweeps:
    jobs += [("radius", f"fc_q{q:g}", f"FC, {100 * q:g}th percentile",
              lambda q=q: fc(q, 0))
             for q in args.quantiles if not (q == args.quantile and
                                             "fc" in args.algorithms)]
    jobs += [("local_steps", f"fc_local{t}", f"FC, {t} local steps",
              lambda t=t: fc(args.quantile, t))
             for t in args.local_steps if not (t == 0 and
                                               "fc" in args.algorithms)]
  cc.log_line(f"CIFAR-10 private label: {fed.description}")
  if args.dataset == "synthetic":
    cc.log_line(f"*** {cc.SYNTHETIC_NOTE} ***")
  cc.log_line(f"Model {args.model} (width / {args.width_divisor}, "
              f"{cc.num_params(s.params) // fed.data.clusters.shape[0]} "
              f"params), {args.rounds} rounds, batch {args.batch_size}, lr "
              f"{args.lr}, momentum {args.momentum}; {len(jobs)} runs")
  runs, start = {}, time.perf_counter()
  for i, (panel, name, label, make) in enumerate(jobs, 1):
    r = cc.run_one(s, make(), args, index=i, total=len(jobs), label=label,
                   log=cc.log_line)
    runs[name] = {**r, "panel": panel, "name": name}
    cc.progress(i, len(jobs), label, r, start)
  return {"fed": fed, "runs": runs}


def panels(args, runs: dict) -> list:
  left = [runs[a] for a in args.algorithms]
  fc_main = runs.get("fc")
  out = [("Algorithms (private labels)", left, LABELS["fc"])]
  if not args.no_sweeps:
    radius = [runs[f"fc_q{q:g}"] if f"fc_q{q:g}" in runs else
              {**fc_main, "label": f"FC, {100 * q:g}th percentile"}
              for q in args.quantiles]
    steps = [runs[f"fc_local{t}"] if f"fc_local{t}" in runs else
             {**fc_main, "label": "FC, 0 local steps"}
             for t in args.local_steps]
    out += [("FC: radius percentile", radius,
             f"FC, {100 * args.quantile:g}th percentile"),
            ("FC: local steps between clustering rounds", steps,
             "FC, 0 local steps")]
  return out


def main(argv=None):
  args = cc.parse(build_parser(), argv, check=validate)
  result = run(args)
  fed, runs = result["fed"], result["runs"]
  header = ["panel", "run"] + cc.RESULT_COLUMNS + ["paper (Fig. 4)"]
  rows = [[r["panel"], r["label"]] + cc.result_cells(r)
          + [PAPER.get(name, "curves only")] for name, r in runs.items()]
  cc.finish(args, fed, runs, header, rows, title=(
      "Figure 4 (CIFAR-10, private labels): personalized test accuracy "
      f"after {args.rounds} rounds"), figure="figure4.png",
            panels=panels(args, runs))
  return runs


if __name__ == "__main__":
  main(sys.argv[1:])
