"""Table 1's options, defaults and the paper's numbers (`experiments.mnist`)."""

import dataclasses
import os

from experiments import groups
from experiments import options
from experiments import registry
from experiments import tracking
from experiments import training
from experiments.options import group, option

TASKS = ("rotation", "private_label")
DATASETS = ("digits", "fashion_mnist", "mnist")
# The columns of Table 1, then the other algorithms of the paper.
ALGORITHMS = ("local", "global", "ditto", "ifca", "knn", "fc", "oracle",
              "cfl", "hypcluster", "myopic", "mc")
# Per data set: (clients per cluster, rounds). 8x8 digits has 1797 images,
# so 10 clients per cluster (35 train + 9 test images each).
DEFAULTS = {"digits": (10, 600), "fashion_mnist": (75, 300),
            "mnist": (75, 300)}
# kNN-Per's weight of the kNN distribution per task (the paper's §5.2).
KNN_LAMBDA = {"rotation": 0.5, "private_label": 0.9}
# Werner et al. (2023), Table 1 (MNIST): (accuracy %, loss).
PAPER = {
    "rotation": {"local": (71.3, 0.517), "global": (46.6, 0.631),
                 "ditto": (62.0, 0.576), "ifca": (54.6, 0.588),
                 "knn": (52.1, 2.395), "fc": (75.4, 0.475),
                 "oracle": (84.7, 0.432)},
    "private_label": {"local": (75.2, 0.489), "global": (22.2, 0.803),
                      "ditto": (61.7, 0.578), "ifca": (65.4, 0.531),
                      "knn": (63.2, 1.411), "fc": (77.0, 0.468),
                      "oracle": (85.1, 0.430)},
}
# Clusters each task can make: 4 rotations; one label shift per class.
MAX_CLUSTERS = {"rotation": 4, "private_label": 10}


@dataclasses.dataclass(frozen=True)
class Config(training.ImageConfig):
  """Every option of Table 1 (defaults: the bundled digits, the main job)."""
  algorithms: registry.Algorithms = group(registry.Algorithms,
                                          algorithms=ALGORITHMS)
  plan: groups.Plan = group(groups.Plan)
  baselines: groups.Baselines = group(groups.Baselines)
  tasks: tuple[str, ...] = option(TASKS, "tasks", choices=TASKS)


def resolve(cfg: Config) -> Config:
  """Checks the options together and fills the automatic values.

  Every task and every algorithm's settings are checked here, before any
  data is loaded (a bad `--clusters` for the second task used to surface
  only when that task started).

  Raises:
    ValueError: naming the option.
  """
  d, f = cfg.data, cfg.federation
  if d.dataset not in DATASETS:
    raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, got "
                     f"{d.dataset!r}.")
  if d.data_dir is not None:
    if d.dataset == "digits":
      raise ValueError("--data-dir is not used by --dataset digits (it is "
                       "bundled with scikit-learn).")
    if not os.path.isdir(d.data_dir):
      raise ValueError(f"--data-dir {d.data_dir} is not a directory.")
  for task in cfg.tasks:
    if f.clusters > MAX_CLUSTERS[task]:
      raise ValueError(f"--clusters {f.clusters}: task {task} makes at most "
                       f"{MAX_CLUSTERS[task]} distinct clusters.")
  names = cfg.algorithms.algorithms
  registry.check(cfg, names)
  tracking.check(cfg.run.progress, cfg.run.tensorboard)
  n_default, rounds_default = DEFAULTS[d.dataset]
  sizes = training.federation_sizes(
      d.dataset, f.clusters, f.clients_per_cluster or n_default,
      train=f.train_per_client, test=f.test_per_client,
      batch_size=cfg.optim.batch_size, groups=cfg.clustering.groups)
  cfg = options.replace(
      cfg, clients_per_cluster=sizes.clients_per_cluster,
      train_per_client=sizes.train_per_client,
      test_per_client=sizes.test_per_client, groups=sizes.groups,
      rounds=cfg.schedule.rounds or rounds_default,
      out=cfg.run.out or os.path.join(
          "results", "mnist", "smoke" if cfg.run.smoke else d.dataset))
  for name in names:
    s = registry.settings(cfg, name)
    try:
      training.federation_sizes(
          d.dataset, f.clusters, sizes.clients_per_cluster,
          train=sizes.train_per_client, test=sizes.test_per_client,
          batch_size=s.batch_size, groups=s.groups)
    except ValueError as e:
      raise ValueError(f"{name} (with its --per-algorithm settings): {e}"
                       ) from None
  return cfg
