"""Figure 5 of Werner et al. (2023): CIFAR-100 with label blocks (§5.3.2).

10 clusters x 10 clients; cluster k owns the 10 labels [10k, 10k + 10) and its
clients split them IID. VGG-8 with the CIFAR-10 hyperparameters (batch 32, SGD
lr 0.1, momentum 0.9). Personalized test accuracy against rounds for
Federated-Clustering (FC) and Global (FedAvg): Global plateaus low, FC keeps
improving.

  python -m experiments.cifar100 --data-dir ~/data/cifar100   # the paper's setup
  python -m experiments.cifar100 --dataset fashion_mnist --num-clusters 5 \\
      --model cnn --width-divisor 4 --rounds 100              # CPU stand-in
  python -m experiments.cifar100 --smoke                      # seconds

Writes `config.json` (first), `results.json`, `summary.csv`, `results.md` and
`figure5.png` to `--out`.
"""

import sys
import time


import prfl_jax as prfl
from experiments import cifar_common as cc
from experiments import cli

ALGORITHMS = ("fc", "global")
LABELS = {"fc": "FC (ours)", "global": "Global (FedAvg)"}
# Figure 5 shows curves only; the text says what they show.
PAPER = {"fc": "keeps improving", "global": "plateaus at a very low level"}


def build_parser():
  p = cli.parser(__doc__, out="results/cifar100", smoke={
      "dataset": "synthetic", "model": "cnn", "width_divisor": "8",
      "image_size": "8", "rounds": "2", "eval_every": "1",
      "num_clusters": "2", "clients_per_cluster": "2",
      "train_per_client": "8", "test_per_client": "4", "batch_size": "4"})
  cc.add_options(p, dataset="cifar100", model="vgg8", num_clusters=10,
                 clients_per_cluster=10, rounds=1000, eval_every=50)
  p.add_argument("--algorithms", type=cli.choices(ALGORITHMS),
                 default=",".join(ALGORITHMS))
  p.set_defaults(synthetic_classes=100)
  return p


def run(args) -> dict:
  fed = cc.load_federation(args, task="label_blocks")
  s = cc.setup(args, fed)
  opt = s.opt(args.lr)
  build = {
      "fc": lambda: prfl.algorithms.federated_clustering(
          s.loss_fn, opt, radius=prfl.quantile_radius(args.quantile),
          num_iters=args.num_iters),
      "global": lambda: prfl.algorithms.fedavg(s.loss_fn, opt),
  }
  cc.log_line(f"CIFAR-100 label blocks: {fed.description}")
  if args.dataset == "synthetic":
    cc.log_line(f"*** {cc.SYNTHETIC_NOTE} ***")
  cc.log_line(f"Model {args.model} (width / {args.width_divisor}, "
              f"{cc.num_params(s.params) // fed.data.clusters.shape[0]} "
              f"params), {args.rounds} rounds, batch {args.batch_size}, lr "
              f"{args.lr}, momentum {args.momentum}")
  runs, start = {}, time.perf_counter()
  for i, name in enumerate(args.algorithms, 1):
    r = cc.run_one(s, build[name](), args, index=i,
                   total=len(args.algorithms), label=LABELS[name],
                   log=cc.log_line)
    runs[name] = {**r, "name": name}
    cc.progress(i, len(args.algorithms), LABELS[name], r, start)
  return {"fed": fed, "runs": runs}


def main(argv=None):
  args = cc.parse(build_parser(), argv,
                  check=lambda a: cc.validate(a, task="label_blocks"))
  result = run(args)
  fed, runs = result["fed"], result["runs"]
  header = ["run"] + cc.RESULT_COLUMNS + ["paper (Fig. 5)"]
  rows = [[r["label"]] + cc.result_cells(r) + [PAPER[name]]
          for name, r in runs.items()]
  cc.finish(args, fed, runs, header, rows, title=(
      "Figure 5 (CIFAR-100, label blocks): personalized test accuracy "
      f"after {args.rounds} rounds"), figure="figure5.png",
            panels=[("FC vs Global (label blocks)", list(runs.values()),
                     LABELS["fc"])])
  return runs


if __name__ == "__main__":
  main(sys.argv[1:])
