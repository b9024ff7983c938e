"""Threshold-Clustering (Werner et al., 2023, Algorithm 2) and its radius rules.

Each centre `v_k` is moved, for `num_iters` steps, by eq. (t-c-update-rule):

  v_k <- (1/W) * sum_i w_i * ( z_i if ||z_i - v_k|| <= tau_k else v_k ),

with `w_i` the client weights (1 by default, 0 for absent or padding clients)
and `W = sum_i w_i`. A point whose distance is not finite (NaN/Inf from a broken
or malicious client) is outside every ball, so the output stays finite whenever
the initial centres are.

Two kernels compute the same thing:
* `"direct"`: distances from the points themselves, `O(K * N * P)` per step.
* `"gram"`: every centre stays `v_k = v0_k + sum_i a_ki (z_i - v0_k)`, so all
  distances follow from the `[N, N]` Gram matrix of `z_i - v0_k`; after one GEMM
  each step is `O(K * N^2)`, independent of the model size `P`.
  `threshold_clustering` computes one such Gram matrix per centre;
  `cluster_and_assign(..., method="gram")` needs only ONE Gram matrix of the
  points for the clustering and the assignment (and `farthest_first` can
  share it), which is what makes Myopic- and Momentum-Clustering cheap at
  large N * P.
"""

from prfl_jax.clustering.assignment import assign
from prfl_jax.clustering.assignment import check_balls
from prfl_jax.clustering.assignment import cluster_and_assign
from prfl_jax.clustering.assignment import cluster_and_assign_with_info
from prfl_jax.clustering.assignment import farthest_first
from prfl_jax.clustering.radius import check_radius
from prfl_jax.clustering.radius import masked_quantile
from prfl_jax.clustering.radius import quantile_radius
from prfl_jax.clustering.radius import RANK_QUANTILE_MAX_N
from prfl_jax.clustering.radius import QuantileRadius
from prfl_jax.clustering.radius import Radius
from prfl_jax.clustering.radius import RadiusRule
from prfl_jax.clustering.threshold import as_float
from prfl_jax.clustering.threshold import check_method
from prfl_jax.clustering.threshold import check_weights
from prfl_jax.clustering.threshold import ClusteringInfo
from prfl_jax.clustering.threshold import gram_clustering_coefs
from prfl_jax.clustering.threshold import threshold_clustering
from prfl_jax.clustering.threshold import threshold_clustering_with_info

__all__ = [
    "ClusteringInfo", "QuantileRadius", "RANK_QUANTILE_MAX_N", "Radius",
    "RadiusRule", "as_float", "assign", "check_balls", "check_method",
    "check_radius", "check_weights", "cluster_and_assign",
    "cluster_and_assign_with_info", "farthest_first", "gram_clustering_coefs",
    "masked_quantile", "quantile_radius", "threshold_clustering",
    "threshold_clustering_with_info",
]
