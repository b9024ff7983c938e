"""The failure-mode examples' options (defaults: the paper's settings)."""

import dataclasses
import os

from experiments import groups
from experiments import options
from experiments import tracking
from experiments.options import group, option

_POSITIVE = dict(low=0, low_open=True)


@dataclasses.dataclass(frozen=True)
class Config:
  """Settings of the three examples."""
  run: groups.Run = group(groups.Run)
  example_rounds: int = option(200, "rounds of Examples 1 and 2", low=1)
  eta_myopic: float = option(0.5, "Example 1: Myopic-Clustering's learning "
                             "rate (the paper's Fig. 1a)", **_POSITIVE)
  eta_fc: float = option(0.1, "Example 1: FC's learning rate (radius 0.5 / "
                         "eta)", **_POSITIVE)
  myopic_radius: float = option(0.01, "Example 1: Threshold-Clustering "
                                "radius (gradient units)", low=0)
  eta_ifca: float = option(0.1, "Example 2: learning rate", **_POSITIVE)
  example2_local_steps: int = option(
      5, "Example 2: local steps of IFCA Option II and HypCluster", low=1)
  fc_radius_ex2: float = option(0.5, "Example 2: FC's radius", low=0)
  example3_seeds: int = option(200, "Example 3: independent runs (one vmap)",
                               low=1)
  example3_rounds: int = option(100, "Example 3: rounds", low=1)
  eta_cfl: float = option(0.1, "Example 3: learning rate", **_POSITIVE)
  cfl_eps1: float = option(0.04, "Example 3: Clustered FL's eps1",
                           **_POSITIVE)
  cfl_eps2: float = option(0.01, "Example 3: Clustered FL's eps2",
                           **_POSITIVE)
  example3_cfl_warmup: int = option(
      20, "Example 3: Clustered FL splits nothing before this round", low=0)
  fc_radius_ex3: float = option(0.25, "Example 3: FC's radius", low=0)


def resolve(cfg: Config) -> Config:
  """Checks the options together; fills `--out`.

  Raises:
    ValueError: naming the options.
  """
  tracking.check(cfg.run.progress, cfg.run.tensorboard)
  if cfg.example3_cfl_warmup >= cfg.example3_rounds:
    raise ValueError(
        f"--example3-cfl-warmup ({cfg.example3_cfl_warmup}) must be < "
        f"--example3-rounds ({cfg.example3_rounds}): Clustered FL never "
        "splits during warm-up.")
  return options.replace(cfg, out=cfg.run.out or os.path.join(
      "results", "failure_modes", *(["smoke"] if cfg.run.smoke else [])))
