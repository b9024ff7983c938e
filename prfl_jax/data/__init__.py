"""Data sets, federated partitions and in-jit batch sampling."""

from prfl_jax.data.datasets import ArrayDataset
from prfl_jax.data.datasets import load_dataset
from prfl_jax.data.federated import FederatedData
from prfl_jax.data.federated import check_data
from prfl_jax.data.federated import sample_batch
from prfl_jax.data.natural import load_femnist
from prfl_jax.data.natural import natural_federation
from prfl_jax.data.natural import natural_id_partition
from prfl_jax.data.padded import Padded
from prfl_jax.data.padded import masked_mean
from prfl_jax.data.padded import unpad
from prfl_jax.data.partition import Federation
from prfl_jax.data.ragged import HostData
from prfl_jax.data.ragged import Ragged
from prfl_jax.data.partition import dirichlet_partition
from prfl_jax.data.partition import federate
from prfl_jax.data.partition import iid_partition
from prfl_jax.data.partition import label_block
from prfl_jax.data.partition import private_label
from prfl_jax.data.partition import rotate
from prfl_jax.data.partition import shard_partition
from prfl_jax.data.synthetic import synthetic_regression
from prfl_jax.data.synthetic import regression_loss
from prfl_jax.data.synthetic import regression_eval
