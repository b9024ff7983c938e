"""The Byzantine experiment's options, attacks and checks of them."""

import dataclasses
import os
from typing import Optional

import numpy as np

import prfl_jax as prfl
from experiments import groups
from experiments import options
from experiments import registry
from experiments import tracking
from experiments import training
from experiments.options import group, option

ATTACKS = ("label_flip", "large", "bit_flip", "gaussian", "alie", "ipm",
           "mimic", "nan", "inf", "edge")
# Optimised and adaptive attacks (issue 20), run on request (`--attacks`).
STRONG_ATTACKS = ("alie_jitter", "ipm_jitter", "spread_edge", "opt_alie",
                  "opt_ipm", "min_max", "min_sum", "fang_tm", "fang_krum",
                  "alie_concentrated")
ATTACK_LABELS = {
    "none": "no attack", "label_flip": "label flip", "large": "large (x1e4)",
    "bit_flip": "bit flip", "gaussian": "Gaussian (sd 100)", "alie": "ALIE",
    "ipm": "IPM (eps 0.1)", "mimic": "mimic", "nan": "NaN", "inf": "Inf",
    "edge": "ball edge (worst case)", "alie_jitter": "ALIE, jittered 1%",
    "ipm_jitter": "IPM, jittered 1%", "spread_edge": "ball edge, spread",
    "opt_alie": "optimised ALIE", "opt_ipm": "optimised IPM",
    "min_max": "Min-Max", "min_sum": "Min-Sum",
    "fang_tm": "Fang (trimmed mean)", "fang_krum": "Fang (Krum)",
    "alie_concentrated": "ALIE, jittered, on one cluster"}


def method_label(method: str) -> str:
  """The registry's label of a grid method; a method the protocol split by
  radius quantile ("fc_ball_cap@0.3") gets its quantile."""
  base, _, q = method.partition("@")
  return registry.label(base) + (f", quantile {q}" if q else "")


# Line-search evaluations of the optimised ALIE / IPM (ByzFL: 20). Against
# FC every evaluation clusters at every model, so fewer.
OPT_EVALS = 8
METHODS = ("fc", "global", "global_median", "global_trimmed_mean",
           "global_krum", "global_gm", "global_cc", "ifca_median")
REFERENCES = ("oracle", "local")  # Attack-free runs only.
# Any registered algorithm but kNN-Per (its evaluation is Table 1's).
RUNNABLE = tuple(n for n in registry.names() if n != "knn")
PARTS = ("both", "figure6", "grid")
# How the grid's clients differ: the paper's private-label clusters (tasks
# differ), or ByzFL's Dirichlet(alpha) label skew over one shared task
# (smaller alpha, more skew).
HETEROGENEITY = {"private_label": None, "dirichlet_0.1": 0.1,
                 "dirichlet_1": 1.0, "dirichlet_10": 10.0}
DATASETS = ("digits", "fashion_mnist", "mnist")
# Per data set: (grid clients per cluster, Figure 6 clients per cluster,
# rounds). Figure 6 on MNIST-sized data is the paper's 50 + 50 per cluster.
# Digits: FC and the oracle plateau by round ~100 (Table 1's 600-round run).
DEFAULTS = {"digits": (10, 10, 200), "fashion_mnist": (20, 100, 300),
            "mnist": (20, 100, 300)}
# Werner et al. (2023) Table 1, MNIST private label: accuracy %.
PAPER_TABLE1 = {"fc": 77.0, "global": 22.2, "oracle": 85.1, "local": 75.2}


@dataclasses.dataclass(frozen=True)
class Config(training.ImageConfig):
  """Every option of the Byzantine experiment (defaults: digits)."""
  algorithms: registry.Algorithms = group(registry.Algorithms,
                                          algorithms=METHODS)
  robust: groups.Robust = group(groups.Robust)
  part: str = option("both", "what to run", choices=PARTS)
  attacks: tuple[str, ...] = option(ATTACKS, "attacks of the grid",
                                    choices=ATTACKS + STRONG_ATTACKS)
  fractions: tuple[float, ...] = option(
      (0.0, 0.1, 0.2, 0.3), "Byzantine share of every cluster's clients",
      low=0, high=0.5, high_open=True)
  heterogeneity: str = option(
      "private_label", "how the grid's clients differ",
      choices=tuple(HETEROGENEITY))
  references: tuple[str, ...] = option(
      REFERENCES, "attack-free reference runs (may be empty)",
      choices=RUNNABLE, allow_empty=True)
  edge_clustering: str = option(
      "direct", "how the ball-edge attacks (edge, spread_edge) cluster to "
      "find the defender's estimates: 'direct' (the committed runs) or "
      "'gram' (one Gram matrix per round, ~4x faster on Fashion-MNIST's MLP; "
      "the same up to float rounding)", choices=("direct", "gram"))
  cells: bool = option(
      False, "train the grid's fractions of each attack and method as one "
      "vmapped program (compiled once; results equal up to float rounding)")
  fig6_clients_per_cluster: Optional[int] = option(
      None, "Figure 6's clients per cluster (auto: digits 10, else 100)",
      low=1)
  fig6_byzantine_fraction: float = option(
      0.5, "Figure 6's Byzantine share of every cluster", low=0, high=1,
      low_open=True, high_open=True)


def resolve(cfg: Config) -> Config:
  """Checks the options together and fills the automatic values.

  Raises:
    ValueError: naming the option, before any data is loaded.
  """
  d, f = cfg.data, cfg.federation
  if d.dataset not in DATASETS:
    raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, got "
                     f"{d.dataset!r}.")
  if d.data_dir is not None and not os.path.isdir(d.data_dir):
    raise ValueError(f"--data-dir {d.data_dir} is not a directory.")
  bad = [n for n in cfg.algorithms.algorithms if n not in RUNNABLE]
  if bad:
    raise ValueError(f"--algorithms: {bad[0]} does not run here; choose from "
                     f"{', '.join(RUNNABLE)}.")
  registry.check(cfg, cfg.algorithms.algorithms + cfg.references)
  tracking.check(cfg.run.progress, cfg.run.tensorboard)
  for option_, build in (
      ("--trim-fraction", lambda: prfl.aggregators.trimmed_mean(
          cfg.robust.trim_fraction)),
      ("--cc-radius / --cc-iters", lambda: prfl.aggregators.centered_clipping(
          cfg.robust.cc_radius, cfg.robust.cc_iters))):
    try:
      build()
    except ValueError as e:
      raise ValueError(f"{option_}: {e}") from None
  grid_n, fig6_n, rounds = DEFAULTS[d.dataset]
  grid_n = f.clients_per_cluster or grid_n
  fig6_n = cfg.fig6_clients_per_cluster or fig6_n
  batch = cfg.optim.batch_size
  if cfg.part in ("both", "grid"):
    sizes = training.federation_sizes(d.dataset, f.clusters, grid_n,
                                      batch_size=batch,
                                      groups=cfg.clustering.groups)
    for fraction in cfg.fractions:
      byz = int(np.floor(fraction * grid_n))
      if fraction > 0 and byz == 0:
        raise ValueError(
            f"--fractions {fraction:g} marks no client Byzantine with "
            f"{grid_n} clients per cluster: use more clients per cluster.")
      if "global_krum" in cfg.algorithms.algorithms:
        try:
          prfl.aggregators.check_krum(byz * f.clusters, sizes.num_clients)
        except ValueError as e:
          raise ValueError(f"--fractions {fraction:g} with --algorithms "
                           f"global_krum: {e}") from None
  if cfg.part in ("both", "figure6"):
    training.federation_sizes(d.dataset, f.clusters, fig6_n, batch_size=batch,
                              groups=cfg.clustering.groups)
    if int(np.floor(cfg.fig6_byzantine_fraction * fig6_n)) == 0:
      raise ValueError("--fig6-byzantine-fraction marks no client Byzantine "
                       f"with {fig6_n} clients per cluster.")
  return options.replace(
      cfg, clients_per_cluster=grid_n, fig6_clients_per_cluster=fig6_n,
      rounds=cfg.schedule.rounds or rounds,
      out=cfg.run.out or os.path.join(
          "results", "byzantine", "smoke" if cfg.run.smoke else d.dataset))


def part_sizes(cfg: Config, part: str) -> training.Sizes:
  """The federation sizes of `part` ("grid" or "figure6")."""
  n = (cfg.federation.clients_per_cluster if part == "grid" else
       cfg.fig6_clients_per_cluster)
  return training.federation_sizes(
      cfg.data.dataset, cfg.federation.clusters, n,
      batch_size=cfg.optim.batch_size, groups=cfg.clustering.groups)


def make_attack(name: str, s: registry.Settings, method: str = "fc",
                num_byzantine: int = 0, edge_clustering: str = "direct"):
  """What Byzantine clients send; None for honest messages (or label flip).

  The adaptive attacks know the defender: the radius rule and clustering
  steps of FC (`s`), or the aggregator `method` uses; the optimised ALIE /
  IPM maximise FC's estimate shift or the aggregate's distance to the
  benign mean. `edge_clustering` is the ball-edge attacks' `method`.
  """
  if name in ("none", "label_flip"):
    return None
  radius = prfl.quantile_radius(s.quantile)

  def objective():
    if method.startswith("fc"):
      return prfl.attacks.threshold_objective(radius, s.num_iters)
    return prfl.attacks.aggregator_objective(
        registry.aggregator(s, num_byzantine) or prfl.aggregators.mean())

  # FC's objective reads distances alone: searched in the span of the rows
  # (N + 2 coordinates; the same scores up to float32 rounding).
  searched = {"evals": OPT_EVALS, "in_span": method.startswith("fc")}

  return {
      "large": lambda: prfl.attacks.large(1e4),
      "bit_flip": prfl.attacks.bit_flip,
      "gaussian": lambda: prfl.attacks.gaussian(100.0),
      "alie": prfl.attacks.alie,
      "ipm": lambda: prfl.attacks.ipm(0.1),
      "mimic": prfl.attacks.mimic,
      "nan": lambda: prfl.attacks.non_finite(float("nan")),
      "inf": lambda: prfl.attacks.non_finite(float("inf")),
      # The defender's own radius rule and clustering steps (FC's).
      "edge": lambda: prfl.attacks.threshold_edge(
          radius, num_iters=s.num_iters, method=edge_clustering),
      "alie_jitter": lambda: prfl.attacks.jittered(prfl.attacks.alie()),
      "ipm_jitter": lambda: prfl.attacks.jittered(prfl.attacks.ipm(0.1)),
      "spread_edge": lambda: prfl.attacks.spread_edge(
          radius, num_iters=s.num_iters, method=edge_clustering),
      "opt_alie": lambda: prfl.attacks.optimised_alie(objective(),
                                                      **searched),
      "opt_ipm": lambda: prfl.attacks.optimised_ipm(objective(), **searched),
      "min_max": prfl.attacks.min_max,
      "min_sum": prfl.attacks.min_sum,
      "fang_tm": prfl.attacks.fang_trimmed_mean,
      # Krum told the attack's own Byzantine count (its best guess).
      "fang_krum": lambda: prfl.attacks.fang_krum(num_byzantine),
      # Against the ball cap: every Byzantine ball on one cluster's models.
      "alie_concentrated": lambda: prfl.attacks.concentrated(
          prfl.attacks.jittered(prfl.attacks.alie())),
  }[name]()


def grid_attacks(fraction: float, cfg) -> tuple:
  """Attacks run at a fraction: "none" (Byzantine clients honest, the
  baseline on the same federation) first."""
  return ("none",) if fraction == 0 else ("none",) + cfg.attacks


def grid_jobs(cfg) -> list:
  """(fraction, attack, method) of every grid run."""
  jobs = []
  for f in sorted(cfg.fractions):
    methods = cfg.algorithms.algorithms + (cfg.references if f == 0 else ())
    jobs += [(f, a, m) for a in grid_attacks(f, cfg) for m in methods]
  return jobs


def cell_groups(cfg) -> list:
  """(attack, method, fractions) of the grid runs that share one program
  (`--cells`): the same attack and method; a fraction alone where Krum (the
  defender's or Fang's attack) is told the Byzantine count, a constant of
  the program."""
  found = {}
  for f, a, m in grid_jobs(cfg):
    krum = (a == "fang_krum" or
            registry.settings(cfg, m).get("aggregator") == "krum")
    found.setdefault((a, m, f if krum else None), []).append(f)
  return [(a, m, tuple(fs)) for (a, m, _), fs in found.items()]
