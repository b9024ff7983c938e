"""The synthetic experiment's options (`experiments.synthetic`)."""

import dataclasses
import os
from typing import Optional

from experiments import groups
from experiments import options
from experiments import registry
from experiments.options import group, option

ALGORITHMS = ("fc", "mc", "myopic", "ifca", "ifca2", "hypcluster", "cfl",
              "ditto", "oracle", "local", "global")
# kNN-Per's personalization is a kNN over a classifier's features, which this
# regression task does not have; the Byzantine variants need attacks.
RUNNABLE = ALGORITHMS
# Algorithms whose grid also spans the radius quantiles.
USES_QUANTILE = ("fc", "mc", "myopic")


@dataclasses.dataclass(frozen=True)
class Config:
  """Every option of Figures 2 and 3 (defaults: the committed run)."""
  run: groups.Run = group(groups.Run)
  algorithms: registry.Algorithms = group(registry.Algorithms,
                                          algorithms=ALGORITHMS)
  # Every client optimizer: heavy-ball momentum 0.9, full local data.
  sgd: groups.Sgd = group(groups.Sgd, batch_size=None)
  schedule: groups.Schedule = group(groups.Schedule, rounds=2000,
                                    eval_every=100)
  thresholding: groups.Thresholding = group(groups.Thresholding,
                                            clustering_method="direct")
  # 9 samples per client = 3 local steps of 3; Momentum-Clustering as the
  # paper reads (Figure 3): plain SGD on its own momentum (alpha 0.1),
  # Algorithm 2's balls over all clients (the grid's quantiles are over all
  # N), seeded at round 0, no seed average; Ditto with the others' momentum.
  baselines: groups.Baselines = group(
      groups.Baselines, local_steps=3, cfl_eps=(1.0, 2.0), cfl_warmup=0,
      ditto_momentum=0.9, mc_alpha=0.1, mc_lr_over_alpha=False,
      mc_balls="all", mc_warmup=0, mc_seed_average=False)
  settings: tuple[str, ...] = option(
      ("4x4", "4x16", "16x4"), "federations KxN_I: K clusters of N_I clients")
  lrs: Optional[tuple[float, ...]] = option(
      None, "absolute learning rates (auto: --lr-fractions of each setting's "
      "stability limit)", low=0, low_open=True)
  lr_fractions: tuple[float, ...] = option(
      (0.1, 0.4, 0.8), "learning rates as fractions of the heavy-ball "
      "stability limit 2 (1 + momentum) / (d K^2 + 1) of the stiffest cluster",
      low=0, high=2, low_open=True)
  quantiles: tuple[float, ...] = option(
      (0.05, 0.1), "radius quantiles tried for FC, MC and Myopic", low=0,
      high=1, low_open=True)
  dim: int = option(10, "model dimension d", low=1)
  num_samples: int = option(9, "samples per client (< d: underdetermined)",
                            low=1)


def parse_setting(text: str) -> tuple:
  """`KxN` -> (K, N)."""
  k, n = (int(v) for v in text.lower().split("x"))
  return k, n


def resolve(cfg: Config) -> Config:
  """Checks the options together.

  Raises:
    ValueError: naming the option.
  """
  for text in cfg.settings:
    try:
      k, n = parse_setting(text)
    except ValueError:
      raise ValueError(f"--settings: {text!r} must look like 4x16 (K "
                       "clusters x N_I clients).") from None
    if k < 1 or n < 1:
      raise ValueError(f"--settings: sizes must be >= 1, got {text!r}.")
  bad = [a for a in cfg.algorithms.algorithms if a not in RUNNABLE]
  if bad:
    raise ValueError(f"--algorithms: {bad[0]} does not run on this "
                     f"regression task; choose from {', '.join(RUNNABLE)}.")
  registry.check(cfg, cfg.algorithms.algorithms)
  b = cfg.sgd.batch_size
  if b is not None and b > cfg.num_samples:
    raise ValueError(f"--batch-size must be at most --num-samples "
                     f"({cfg.num_samples}), got {b}.")
  return options.replace(cfg, out=cfg.run.out or os.path.join(
      "results", "synthetic", *(["smoke"] if cfg.run.smoke else [])))


def learning_rates(cfg: Config, num_clusters: int) -> tuple:
  """The learning-rate grid of a setting (rounded to 2 significant digits)."""
  if cfg.lrs is not None:
    return tuple(cfg.lrs)
  limit = 2 * (1 + cfg.sgd.momentum) / (cfg.dim * num_clusters ** 2 + 1)
  return tuple(float(f"{f * limit:.2g}") for f in cfg.lr_fractions)
