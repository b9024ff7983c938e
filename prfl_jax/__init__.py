"""prfl_jax: personalized and Byzantine-robust federated learning in JAX.

Implements Werner, He, Jordan, Jaggi and Karimireddy, "Provably Personalized
and Robust Federated Learning" (2023): Threshold-Clustering (Algorithm 2),
Federated-Clustering (Algorithm 1), Momentum-Clustering (Algorithm 3) and the
baselines the paper compares against, on federations stored as stacked pytrees.
"""

from prfl_jax import aggregators
from prfl_jax import algorithms
from prfl_jax import attacks
from prfl_jax import checkpoint
from prfl_jax import clustering
from prfl_jax import data
from prfl_jax import diagnostics
from prfl_jax import kernels
from prfl_jax import models
from prfl_jax import participation
from prfl_jax import sharding
from prfl_jax import sweep
from prfl_jax import tree
from prfl_jax.clustering import assign
from prfl_jax.clustering import cluster_and_assign
from prfl_jax.clustering import farthest_first
from prfl_jax.clustering import masked_quantile
from prfl_jax.clustering import quantile_radius
from prfl_jax.clustering import QuantileRadius
from prfl_jax.clustering import threshold_clustering
from prfl_jax.clustering import threshold_clustering_with_info
from prfl_jax.kernels import ExecutionPlan
from prfl_jax.train import train
from prfl_jax.train import TrainResult

__version__ = "0.1.0"
