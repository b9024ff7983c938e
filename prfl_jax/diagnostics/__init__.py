"""Diagnostics: why a clustering method wins or loses.

* `assumptions`: empirical constants of Assumptions 4 and 5 (Werner et al.,
  2023, §3.2, Figure 2) along a run.
* `weights`: whose messages each update averages (effective count, own
  weight, purity, Byzantine weight).
* `partition`: agreement of an assignment with the truth (adjusted Rand
  index, normalised mutual information) and centre distances, jit-safe.
* `rounds`: the per-round step metrics the clustering algorithms report
  (their factories take an optional `true_clusters`).
"""

from prfl_jax.diagnostics import partition
from prfl_jax.diagnostics import rounds
from prfl_jax.diagnostics import weights
from prfl_jax.diagnostics.assumptions import assumption_constants
from prfl_jax.diagnostics.partition import adjusted_rand_index
from prfl_jax.diagnostics.partition import contingency
from prfl_jax.diagnostics.partition import normalized_mutual_info
from prfl_jax.diagnostics.rounds import check_true_clusters
from prfl_jax.diagnostics.rounds import Truth
from prfl_jax.diagnostics.weights import combination_stats

__all__ = [
    "Truth", "adjusted_rand_index", "assumption_constants",
    "check_true_clusters", "combination_stats", "contingency",
    "normalized_mutual_info", "partition", "rounds", "weights",
]
