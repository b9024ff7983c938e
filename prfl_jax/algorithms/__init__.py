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
from prfl_jax.algorithms.cfl import cfl
from prfl_jax.algorithms.cfl import CflState
from prfl_jax.algorithms.ditto import ditto
from prfl_jax.algorithms.ditto import DittoState
from prfl_jax.algorithms.hypcluster import hypcluster
from prfl_jax.algorithms.hypcluster import HypClusterState
from prfl_jax.algorithms.ifca import ifca
from prfl_jax.algorithms.ifca import IfcaState
from prfl_jax.algorithms.knn_per import knn_per
from prfl_jax.algorithms.knn_per import knn_per_evaluate
from prfl_jax.algorithms.knn_per import knn_per_predict
from prfl_jax.algorithms.myopic_clustering import myopic_clustering
from prfl_jax.algorithms.myopic_clustering import MyopicClusteringState
