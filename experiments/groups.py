"""The option groups every experiment shares, each option declared once.

An experiment's configuration holds the groups it needs (`options.group`),
with its own defaults where they differ. `SETTINGS` are the groups whose
options an algorithm reads (`experiments.registry`); each of them can also be
set for one algorithm alone (`--per-algorithm fc.rounds=300`).
"""

import dataclasses
from typing import Optional, Union

from experiments.options import group, option  # pylint: disable=unused-import


@dataclasses.dataclass(frozen=True)
class Run:
  """Seed, output and how progress is shown."""
  seed: int = option(0, "seed of every random draw", low=0)
  out: Optional[str] = option(
      None, "output directory (auto: results/<experiment>/...); checked "
      "writable before anything runs")
  smoke: bool = option(False, "every code path on tiny sizes, most of the "
                       "time compiling (the experiment's "
                       "configs/<name>/smoke.toml; not a result)")
  plots: bool = option(True, "write the figures (PNG)")
  progress: str = option("auto", "progress display: a bar (tqdm), lines, or "
                         "off; auto: a bar on a terminal, else lines",
                         choices=("auto", "bar", "lines", "off"))
  tensorboard: bool = option(True, "write TensorBoard event files under "
                             "<out>/tensorboard")


@dataclasses.dataclass(frozen=True)
class Data:
  """Which data set, and where it comes from."""
  dataset: str = option("digits", "data set", choices=(
      "digits", "fashion_mnist", "mnist", "cifar10", "cifar100", "synthetic"))
  data_dir: Optional[str] = option(
      None, "directory of the data files (IDX, CIFAR binaries); auto: the "
      "loader's search (Debian package, tfds, bundled digits)")
  source: str = option("auto", "where the loader takes the data from",
                       choices=("auto", "tfds", "idx", "cifar_binary", "debian",
                                "sklearn"))


@dataclasses.dataclass(frozen=True)
class Clusters:
  """How many true clusters (`experiments.theorem2` needs no more of the
  federation)."""
  clusters: int = option(4, "true clusters K", low=1)


@dataclasses.dataclass(frozen=True)
class Federation(Clusters):
  """The clustered federation: K true clusters of clients."""
  clients_per_cluster: Optional[int] = option(
      None, "clients per cluster (auto: by data set)", low=1)
  train_per_client: Optional[int] = option(
      None, "training examples per client (auto: min(200, 80% of a "
      "client's share))", low=1)
  test_per_client: Optional[int] = option(
      None, "test examples per client (auto: min(33, 20% of a client's "
      "share))", low=1)


@dataclasses.dataclass(frozen=True)
class Sgd:
  """SGD with heavy-ball momentum (the paper's client optimizer), but for the
  learning rate (a grid in `experiments.synthetic`)."""
  momentum: float = option(0.9, "heavy-ball momentum (0: plain SGD)", low=0,
                           high=1, high_open=True)
  batch_size: Optional[int] = option(
      32, "examples per client per round (auto: all of them)", low=1)


@dataclasses.dataclass(frozen=True)
class Optim(Sgd):
  """The clients' optimizer: SGD with heavy-ball momentum (the paper's)."""
  lr: float = option(0.1, "learning rate", low=0, low_open=True)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How long an algorithm trains and how often it is evaluated."""
  rounds: Optional[int] = option(None, "rounds (auto: by data set)", low=1)
  eval_every: Optional[int] = option(
      None, "rounds between evaluations (auto: rounds / 20)", low=1)


@dataclasses.dataclass(frozen=True)
class Thresholding:
  """Threshold-Clustering steps, but for the radius (a grid in
  `experiments.synthetic`)."""
  num_iters: int = option(10, "Threshold-Clustering steps per round (the "
                          "paper's l)", low=1)
  clustering_method: str = option(
      "gram", "Myopic- and Momentum-Clustering: 'gram' reads every distance "
      "off one [N, N] Gram matrix, 'direct' computes them from the points "
      "(same result up to rounding)", choices=("gram", "direct"))


@dataclasses.dataclass(frozen=True)
class Radius:
  """The radius as a quantile (`experiments.theorem2` and
  `experiments.momentum_variants` need no more of the clustering)."""
  quantile: float = option(0.2, "radius: this quantile of the distances to "
                           "the centre (the paper's 20th percentile)", low=0,
                           high=1, low_open=True)


@dataclasses.dataclass(frozen=True)
class Clustering(Thresholding, Radius):
  """Threshold-Clustering inside FC, Myopic- and Momentum-Clustering."""
  groups: Optional[int] = option(
      None, "FC's random subgroups per round (auto: N / 18.75, the paper's "
      "16 at N = 300)", low=1)
  fc_local_steps: int = option(
      0, "FC's plain local steps between clustering rounds", low=0)
  aware_quantile: Optional[float] = option(
      None, "fc_aware: radius quantile once the groups are cluster-aware "
      "(from round 10; auto: quantile in every round)", low=0, high=1,
      low_open=True)
  aware_random_share: float = option(
      0.25, "fc_aware: share of every group's slots filled with uniformly "
      "random clients", low=0, high=1)


@dataclasses.dataclass(frozen=True)
class Plan:
  """FC's execution plan (`prfl.ExecutionPlan`; every plan, same numbers)."""
  chunk_size: Union[int, str] = option(
      "auto", "models per vmapped chunk: an integer, 'all' (one vmap) or "
      "'auto' (by backend)", low=1, keywords=("auto", "all"))
  kernel: str = option("auto", "all-pairs kernel",
                       choices=("auto", "gram", "direct", "ghost"))


@dataclasses.dataclass(frozen=True)
class Baselines:
  """The baselines' own settings."""
  local_steps: int = option(
      1, "local steps per round of Ditto, CFL, HypCluster and IFCA (II)",
      low=1)
  ditto_lambda: float = option(1.0, "Ditto's regularisation lambda", low=0)
  ditto_momentum: float = option(
      0.0, "momentum of Ditto's optimizer (0: plain SGD, as in Li et al. "
      "2021; 0.9 with lambda 1 diverged on Fashion-MNIST)", low=0, high=1,
      high_open=True)
  knn_lambda: Optional[float] = option(
      None, "kNN-Per's weight of the kNN distribution (auto: the paper's, "
      "0.5 on rotation, 0.9 on private labels)", low=0, high=1)
  knn_k: int = option(10, "kNN-Per's neighbours", low=1)
  knn_temperature: float = option(1.0, "kNN-Per's distance temperature",
                                  low=0, low_open=True)
  cfl_eps: tuple[float, ...] = option(
      (0.05, 0.1), "CFL's (eps1, eps2) on update norms", low=0)
  cfl_warmup: int = option(20, "CFL splits nothing before this round", low=0)
  mc_alpha: Optional[float] = option(
      None, "Momentum-Clustering's alpha (auto: 1 - momentum)", low=0,
      high=1, low_open=True)
  mc_lr_over_alpha: bool = option(
      True, "Momentum-Clustering steps lr / alpha, heavy-ball SGD's step "
      "when a client is alone in its cluster (else lr)")
  mc_balls: str = option(
      "assigned", "Momentum-Clustering's balls: 'assigned' (each centre "
      "over its own clients) or 'all' (Algorithm 2 as written; Algorithm 3 "
      "as written: --mc-balls all --mc-warmup 0 --no-mc-seed-average)",
      choices=("assigned", "all"))
  mc_quantile: Optional[float] = option(
      None, "Momentum-Clustering's radius quantile (auto: 0.95 with "
      "mc_balls='assigned', over each centre's own clients; else quantile)",
      low=0, high=1, low_open=True)
  mc_sticky: bool = option(
      False, "Momentum-Clustering with mc_balls='assigned': clients stay "
      "with their centre while inside its ball")
  mc_warmup: int = option(
      5, "Momentum-Clustering: rounds of own-momentum steps before the "
      "centres are seeded", low=0)
  mc_seed_average: bool = option(
      True, "Momentum-Clustering: at seeding, clients take their centre's "
      "mean model")
  mc_reseed: bool = option(
      True, "Momentum-Clustering: move empty or coinciding centres "
      "(--no-mc-reseed before session 12)")
  mc_reseed_pick: str = option(
      "split", "Momentum-Clustering with mc_reseed: where a dead centre "
      "moves in the largest cluster (split: the mean of the half that "
      "2-means splits off; random: a random client, the pick before "
      "session 12; worst: the client with the highest loss at its centre's "
      "model, needs mc_assign=loss)", choices=("split", "random", "worst"))
  mc_bias_correction: bool = option(
      False, "Momentum-Clustering: cluster bias-corrected momenta")
  mc_freeze: Optional[int] = option(
      None, "Momentum-Clustering with mc_balls='assigned': no client "
      "changes centre from this round on (None: never frozen)", low=1)
  mc_freeze_stable: Optional[int] = option(
      5, "Momentum-Clustering with mc_balls='assigned': no client "
      "changes centre once none has for this many consecutive rounds "
      "(auto: never)", low=1)
  mc_stable_share: float = option(
      0.0, "Momentum-Clustering with mc_freeze_stable: a round counts as "
      "still when at most this share of the clients changed centre (0: "
      "none)", low=0, high=1, high_open=True)
  mc_assign: str = option(
      "loss", "Momentum-Clustering: how a client picks its centre "
      "after seeding (loss: lowest loss at a centre's carried model, "
      "IFCA's signal, the default since session 12; momentum: nearest to "
      "its momentum, Algorithm 3, the default before; mc_sticky needs it)",
      choices=("loss", "momentum"))


@dataclasses.dataclass(frozen=True)
class Robust:
  """Robust aggregation (Global + aggregator, IFCA + aggregator)."""
  aggregator: str = option("mean", "how the server combines messages",
                           choices=("mean", "median", "trimmed_mean", "krum",
                                    "geometric_median", "centered_clipping"))
  trim_fraction: float = option(0.3, "trimmed mean: share dropped at each "
                                "end", low=0, high=0.5, high_open=True)
  gm_iters: int = option(5, "Weiszfeld iterations of the geometric median",
                         low=1)
  cc_radius: float = option(1.0, "centered clipping radius", low=0,
                            low_open=True)
  cc_iters: int = option(3, "centered clipping iterations", low=1)


SETTINGS = (Sgd, Optim, Schedule, Thresholding, Clustering, Plan, Baselines,
            Robust)
