"""Federated algorithms, each a factory returning `Algorithm(init, step)`."""

from prfl_jax.algorithms.base import Algorithm
from prfl_jax.algorithms.federated_clustering import federated_clustering
from prfl_jax.algorithms.federated_clustering import FederatedClusteringState
from prfl_jax.algorithms.fedavg import fedavg
from prfl_jax.algorithms.fedavg import FedAvgState
from prfl_jax.algorithms.local import local
from prfl_jax.algorithms.local import LocalState
from prfl_jax.algorithms.momentum_clustering import momentum_clustering
from prfl_jax.algorithms.momentum_clustering import MomentumClusteringState
from prfl_jax.algorithms.oracle import oracle
from prfl_jax.algorithms.oracle import OracleState
