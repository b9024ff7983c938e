"""Partial participation: cohorts of clients per round, and dropouts."""

from prfl_jax.participation.cohorts import Cohort
from prfl_jax.participation.cohorts import cohort
from prfl_jax.participation.cohorts import CohortState
from prfl_jax.participation.cohorts import Replicated
from prfl_jax.participation.sampling import draw
from prfl_jax.participation.sampling import Members
