"""Figure 5 of Werner et al. (2023): CIFAR-100 with label blocks (§5.3.2).

10 clusters x 10 clients; cluster k owns the 10 labels [10k, 10k + 10) and its
clients split them IID. VGG-8 with the CIFAR-10 hyperparameters (batch 32, SGD
lr 0.1, momentum 0.9). Personalized test accuracy against rounds for
Federated-Clustering (FC) and Global (FedAvg): Global plateaus low, FC keeps
improving.

  python -m experiments.cifar100 --data-dir ~/data/cifar100   # the paper's setup
  python -m experiments.cifar100 --config experiments/configs/cifar100/fashion_mlp.toml
  python -m experiments.cifar100 --smoke                      # seconds

Writes `config.json` (first), `results.json`, `summary.csv`, `results.md`,
`figure5.png` and `tensorboard/` to `--out` (default `results/cifar100`).
"""

import dataclasses

from experiments import cifar
from experiments import cli
from experiments import groups
from experiments import registry
from experiments.options import group

ALGORITHMS = ("fc", "global")
# Figure 5 shows curves only; the text says what they show.
PAPER = {"fc": "keeps improving", "global": "plateaus at a very low level"}


@dataclasses.dataclass(frozen=True)
class Config(cifar.Config):
  """Every option of Figure 5 (defaults: the paper's §5.3.2): 10 x 10
  clients, VGG-8."""
  data: groups.Data = group(groups.Data, dataset="cifar100")
  network: cifar.Network = group(cifar.Network, model="vgg8")
  federation: groups.Federation = group(groups.Federation, clusters=10,
                                        clients_per_cluster=10)
  algorithms: registry.Algorithms = group(registry.Algorithms,
                                          algorithms=ALGORITHMS)


def resolve(cfg: Config) -> Config:
  return cifar.resolve(cfg, experiment="cifar100", task="label_blocks",
                       allowed=ALGORITHMS)


def prepare(cfg: Config) -> cifar.Prepared:
  return cifar.prepare(cfg, experiment="cifar100", task="label_blocks")


def run(cfg: Config, prepared: cifar.Prepared, tracker, command: str = ""):
  del command  # Recorded in config.json.
  tracker.log("CIFAR-100 label blocks:")
  jobs = [(a, a, registry.label(a), registry.settings(cfg, a))
          for a in cfg.algorithms.algorithms]
  runs = cifar.run_jobs(cfg, prepared, jobs, tracker)
  header = ["run"] + cifar.RESULT_COLUMNS + ["paper (Fig. 5)"]
  rows = [[r["label"]] + cifar.result_cells(r) + [PAPER[key]]
          for key, r in runs.items()]
  cifar.finish(cfg, prepared, runs, header, rows, tracker, title=(
      "Figure 5 (CIFAR-100, label blocks): personalized test accuracy after "
      f"{cfg.schedule.rounds} rounds"), figure="figure5.png",
               panels=[("FC vs Global (label blocks)", list(runs.values()),
                        registry.label("fc"))])
  return runs


EXPERIMENT = cli.Experiment("cifar100", __doc__, Config, resolve, prepare,
                            run)

main = EXPERIMENT.main


if __name__ == "__main__":
  main()
