"""Exact subset rules: minimum-diameter averaging (MDA) and SMEA.

Both average the subset S of n - f present rows that minimises a spread:
its diameter (MDA) or the largest eigenvalue of its covariance (SMEA). The
exact rules look at every subset, C(N, f) of them for N rows: this module
enumerates them all (the same order as `itertools.combinations(range(N),
N - f)`, so ties go to the first such subset) and is exact, and practical
while C(N, f) stays in the tens of thousands: N = 20 with f = 4 is 4,845
subsets, N = 30 with f = 6 already 593,775, N = 40 with f = 8 is 7.7e7.
Past `max_subsets` the rules refuse to trace rather than run for hours.

Absent rows (weight 0 or non-finite) are never in S: a subset is valid iff
it keeps every absent row out of the f removed ones, i.e. S is the present
rows less f of them.
"""

import itertools
import math
from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.aggregators import base
from prfl_jax.aggregators import spectral

PyTree = base.PyTree
Aggregator = base.Aggregator
MAX_SUBSETS = 100_000


def _subsets(n: int, num_byzantine: int, max_subsets: int, rule: str):
  """`[C, N]` bool: every subset of N - f rows, in combinations order."""
  base.check_num_byzantine(num_byzantine, n, rule)
  count = math.comb(n, num_byzantine)
  if count > max_subsets:
    raise ValueError(
        f"{rule} with N={n} and num_byzantine={num_byzantine} would enumerate "
        f"C({n}, {num_byzantine}) = {count} subsets, more than "
        f"`max_subsets`={max_subsets}; the exact rule is exponential in f: "
        "use fewer rows or raise `max_subsets`.")
  keep = np.zeros((count, n), bool)
  for row, subset in enumerate(itertools.combinations(range(n),
                                                      n - num_byzantine)):
    keep[row, list(subset)] = True
  return jnp.asarray(keep)


def _best_subset(messages, weights, num_byzantine, max_subsets, rule,
                 spread, exponent):
  """Mean of the valid subset of least `spread(keep [N], gram, weights)`,
  the Gram matrix taken on the rows times 2^exponent(rows)."""
  n = tree_lib.num_leading(messages, "messages")
  keep = _subsets(n, num_byzantine, max_subsets, rule)
  n, weights, present, zeroed = base.prepare(messages, weights)
  # The rows times one power of two: every spread is scaled alike, exactly,
  # and the rows' squares neither overflow nor underflow unless they are
  # ~1e19 times apart; a spread that overflows (NaN) counts as inf.
  g = tree_lib.gram(base.times_power_of_two(zeroed, exponent(zeroed)))
  valid = jnp.all(keep | present[None, :], axis=1)
  cost = lax.map(lambda k: spread(k & present, g, weights), keep,
                 batch_size=256)
  cost = jnp.where(jnp.isnan(cost), jnp.inf, cost)
  best = jnp.argmin(jnp.where(valid, cost, jnp.inf))
  return base.selected_mean(zeroed, weights, keep[best] & present)


def _subset_rule(num_byzantine, max_subsets, rule, spread,
                 exponent) -> Aggregator:
  """The aggregator that averages the valid subset of least `spread`."""
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)
  validation.check_positive_int(max_subsets, "max_subsets")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    return _best_subset(messages, weights, num_byzantine, max_subsets, rule,
                        spread, exponent)
  return agg


def _diameter(keep, g, weights):
  del weights  # Unused.
  sq = jnp.diagonal(g)
  d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0)
  return jnp.max(jnp.where(keep[:, None] & keep[None, :], d2, 0.0))


def _top_eigenvalue(keep, g, weights):
  """Largest eigenvalue of the weighted covariance of the `keep` rows."""
  w = jnp.where(keep, weights, 0.0)
  total = jnp.sum(w)
  return spectral.top_direction(g, w / jnp.where(total > 0, total, 1.0))[0]


def mda(num_byzantine: int, *, max_subsets: int = MAX_SUBSETS) -> Aggregator:
  """Minimum-diameter averaging, MDA (El Mhamdi et al., 2020).

    MDA_f(x_1..x_n) = 1/(n - f) * sum_{i in S*} x_i,
    S* in argmin_{S subset of [n], |S| = n - f} max_{i, j in S} ||x_i - x_j||,

  exact, over all C(N, f) subsets (see the module docstring for where that
  stops being practical). Weights: S* is averaged with its rows' weights.

  Args:
    num_byzantine: f, with 2 f < N.
    max_subsets: the most subsets the rule may enumerate.

  Raises:
    ValueError: on a negative `num_byzantine` or `max_subsets < 1`; when
      `agg` is traced, if `2 f >= N` or C(N, f) > `max_subsets`.

  References:
    El Mhamdi, Guerraoui, Guirguis, Hoang and Rouault, 2020, "Genuinely
    Distributed Byzantine Machine Learning", PODC (MDA); ByzFL's `MDA`.
  """
  # Scaled from the median row: a huge row does not flush the others'
  # distances (`base.median_peak_exponent`).
  return _subset_rule(num_byzantine, max_subsets, "MDA", _diameter,
                      base.median_peak_exponent)


def smea(num_byzantine: int, *, max_subsets: int = MAX_SUBSETS) -> Aggregator:
  """Smallest maximum eigenvalue averaging, SMEA (Allouah et al., 2023).

    SMEA_f(x_1..x_n) = 1/(n - f) * sum_{i in S*} x_i,
    S* in argmin_{|S| = n - f} lambda_max( 1/|S| sum_{i in S}
                                         (x_i - mu_S)(x_i - mu_S)^T ),

  exact: every subset's largest eigenvalue is computed exactly from the
  Gram matrix (`spectral.top_direction`, one `[N, N]` eigendecomposition
  per subset). ByzFL's `SMEA` estimates it by one power-method step from a
  random vector, so the two pick the same subset only where that estimate
  ranks the subsets as the exact one does. Weights: weighted covariance and
  mean (the subset size counts rows).

  Args:
    num_byzantine: f, with 2 f < N.
    max_subsets: the most subsets the rule may enumerate.

  Raises:
    ValueError: as `mda`.

  References:
    Allouah, Guerraoui, Gupta, Pinot and Stephan, 2023, "On the
    Privacy-Robustness-Utility Trilemma in Distributed Learning", ICML
    (SMEA).
  """
  # Scaled from the largest entry: a Gram matrix with inf entries makes
  # every subset's eigendecomposition NaN (`base.max_peak_exponent`).
  return _subset_rule(num_byzantine, max_subsets, "SMEA", _top_eigenvalue,
                      base.max_peak_exponent)
