"""Stacked federated datasets and in-jit batch sampling."""

from prfl_jax.data.federated import FederatedData
from prfl_jax.data.federated import check_data
from prfl_jax.data.federated import sample_batch
from prfl_jax.data.synthetic import synthetic_regression
from prfl_jax.data.synthetic import regression_loss
from prfl_jax.data.synthetic import regression_eval
