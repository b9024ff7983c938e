"""FC with and without its defence (`cap_duplicates`) on the digits grid.

The setting of `experiments/results/byzantine/digits_grid` (private-label
digits, 4 clusters x 10 clients, the paper's MLP, lr 0.1, momentum 0.9,
batch 32, one group, radius at the 15th percentile, 10 clustering steps,
seed 0), one Byzantine fraction, FC alone; built from the helpers of
`experiments.byzantine` as they stand at this commit (the Byzantine
protocol of issue 20 moves into the experiment registry). Appends one JSON
line per run to `--out`.

  nice -n 5 python -m benchmarks.fc_defence_digits --defences none,cap \
      --attacks none,alie,ipm,mimic,edge,spread_edge --fraction 0.2
"""

import argparse
import dataclasses
import json
import os
import time

import prfl_jax as prfl
from experiments import byzantine as grid
from experiments import classification as cls

DEFENCES = {"none": None, "cap": prfl.aggregators.cap_duplicates}
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                   "fc_defence_digits.jsonl")


def make_attack(name: str, hp: cls.Hyper):
  """The grid's attacks, plus the adaptive `spread_edge`."""
  if name == "spread_edge":
    return prfl.attacks.spread_edge(prfl.quantile_radius(hp.quantile),
                                    num_iters=hp.num_iters)
  return grid.make_attack(name, hp)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--defences", default="none,cap")
  parser.add_argument("--attacks", default="none,alie,ipm")
  parser.add_argument("--fraction", type=float, default=0.2)
  parser.add_argument("--rounds", type=int, default=100)
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args(argv)
  defences, attacks = args.defences.split(","), args.attacks.split(",")
  bad = [d for d in defences if d not in DEFENCES]
  if bad:
    parser.error(f"--defences: unknown {bad}; choose from {list(DEFENCES)}")
  cfg = grid.resolve(grid.Config(
      part="grid", num_groups=1, num_rounds=args.rounds,
      fractions=(args.fraction,),
      hyper=dataclasses.replace(cls.Hyper(), quantile=0.15)))
  hp = dataclasses.replace(cfg.hyper, num_groups=1)
  attack_fns = {a: make_attack(a, hp) for a in attacks}
  ds = prfl.data.load_dataset("digits", split="train")
  model = cls.mlp(64, cfg.hidden, ds.num_classes)
  fed = grid.build_federation(ds, cfg, cfg.sizes["grid"], args.fraction)
  for defence in defences:
    for name in attacks:
      pre = DEFENCES[defence]
      alg = prfl.algorithms.federated_clustering(
          model.loss_fn, cls.optimizer(hp),
          radius=prfl.quantile_radius(hp.quantile), num_iters=hp.num_iters,
          num_groups=1, attack=attack_fns[name],
          plan=prfl.ExecutionPlan(kernel="gram"),
          pre_aggregator=None if pre is None else pre())
      start, load = time.perf_counter(), os.getloadavg()[0]
      r = grid.run_one(alg, fed, model, hp, cfg, log=lambda s: None)
      row = {"defence": defence, "attack": name, "fraction": args.fraction,
             "rounds": args.rounds, "accuracy": round(100 * r["accuracy"], 2),
             "byzantine_in_ball": r["byzantine_in_ball"],
             "seconds": round(time.perf_counter() - start),
             "load_average": [round(load, 1), round(os.getloadavg()[0], 1)]}
      print(json.dumps(row), flush=True)
      with open(args.out, "a") as fh:
        fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
