"""The Threshold-Clustering experiment's options (defaults: Figure 7)."""

import dataclasses
import os

from experiments import groups
from experiments import options
from experiments import tracking
from experiments.options import group, option

_POSITIVE = dict(low=0, low_open=True)
_FRACTION = dict(low=0, high=1, high_open=True)  # Byzantine share, [0, 1).
_UNIT = dict(low=0, high=1, low_open=True, high_open=True)  # (0, 1).


@dataclasses.dataclass(frozen=True)
class Config:
  """Every option of Figure 7 and of the Theorem 1 check."""
  run: groups.Run = group(groups.Run)
  fig7_sigmas: tuple[float, ...] = option(
      (0.5, 1.0, 2.0, 4.0), "Figure 7: make_blobs cluster_std values",
      **_POSITIVE)
  blob_points: int = option(90, "Figure 7: points in all", low=1)
  blob_clusters: int = option(10, "true clusters K (Figure 7 and Theorem 1)",
                              low=1)
  blob_dim: int = option(10, "dimension d (Figure 7 and Theorem 1)", low=1)
  blob_box: float = option(10.0, "Figure 7: make_blobs centres uniform in "
                           "[-box, box]^d", **_POSITIVE)
  fig7_quantile: float = option(0.1, "Figure 7: the radius quantile",
                                **_UNIT)
  repeats: int = option(10, "repeats of every condition", low=1)
  fig7_iters: int = option(100, "Figure 7: l = 0..FIG7_ITERS clipping "
                           "iterations", low=1)
  elbow_tol: float = option(0.05, "the elbow: the first l with at most this "
                            "share of the initial gap left", **_UNIT)
  theorem: bool = option(True, "run the Theorem 1 sweeps")
  base_n: int = option(10, "Theorem 1 base point: points per cluster n_i",
                       low=1)
  base_delta: float = option(20.0, "Theorem 1 base point: separation Delta",
                             **_POSITIVE)
  base_sigma: float = option(1.0, "Theorem 1 base point: total std sigma",
                             **_POSITIVE)
  n_values: tuple[int, ...] = option((2, 4, 8, 16, 32, 64),
                                     "Theorem 1: the n_i sweep", low=1)
  delta_values: tuple[float, ...] = option(
      (5.0, 10.0, 20.0, 40.0, 80.0, 160.0), "Theorem 1: the Delta sweep",
      **_POSITIVE)
  sigma_values: tuple[float, ...] = option(
      (0.25, 0.5, 1.0, 2.0, 4.0), "Theorem 1: the sigma sweep", **_POSITIVE)
  beta_values: tuple[float, ...] = option(
      (0.0, 0.01, 0.02, 0.05, 0.1), "Theorem 1: the Byzantine fraction sweep",
      **_FRACTION)
  attack_beta: float = option(0.05, "Theorem 1: the Byzantine fraction of the "
                              "Delta and sigma sweeps", **_FRACTION)
  theorem_quantiles: tuple[float, ...] = option(
      (0.1, 0.05), "Theorem 1: the quantile radius rules tried", **_UNIT)
  theorem_iters: int = option(100, "Theorem 1: Threshold-Clustering steps",
                              low=1)


def resolve(cfg: Config) -> Config:
  """Checks the options together; fills `--out`.

  Raises:
    ValueError: naming the options.
  """
  tracking.check(cfg.run.progress, cfg.run.tensorboard)
  if cfg.blob_points < cfg.blob_clusters:
    raise ValueError(f"--blob-points ({cfg.blob_points}) must be >= "
                     f"--blob-clusters ({cfg.blob_clusters}).")
  if cfg.theorem and cfg.blob_dim < cfg.blob_clusters:
    raise ValueError(
        f"Theorem 1 places the {cfg.blob_clusters} centres on orthogonal "
        f"axes: --blob-dim ({cfg.blob_dim}) must be >= --blob-clusters, or "
        "pass --no-theorem.")
  return options.replace(cfg, out=cfg.run.out or os.path.join(
      "results", "threshold_clustering",
      *(["smoke"] if cfg.run.smoke else [])))
