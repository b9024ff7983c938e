"""Federated algorithms, each a factory returning `Algorithm(init, step)`."""

from prfl_jax.algorithms.base import Algorithm
from prfl_jax.algorithms.federated_clustering import federated_clustering
from prfl_jax.algorithms.federated_clustering import FederatedClusteringState
