"""Edges of the robust rules that every test passed through when changed
(issue 21's mutation audit): the number of Weiszfeld iterations, Krum's
one-neighbour floor, and the sampled mutants that survived them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax import aggregators
from prfl_jax.aggregators import signs
from tests.test_aggregators import np_geometric_median


def test_geometric_median_runs_exactly_num_iters_weiszfeld_steps():
  """One and two iterations from the weighted mean, against NumPy (with 20
  the iteration has converged, so a step fewer goes unseen). Seen to fail
  when `fori_loop` starts at 1 (one iteration fewer)."""
  x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [10.0, 10.0]])
  w = np.array([1.0, 2.0, 1.0, 1.0])
  for iters in (1, 2):
    got = aggregators.geometric_median(iters)(jnp.asarray(x), jnp.asarray(w))
    np.testing.assert_allclose(got, np_geometric_median(x, w, iters, 1e-8),
                               rtol=1e-5)


def test_krum_scores_at_least_one_neighbour_with_absent_rows():
  """N = 5, f = 1, two rows absent (weight 0): n - f - 2 = 0 present
  neighbours, so each score is the distance to the nearest present row and
  the outlier at 10 is not chosen. Seen to fail without the floor (every
  score 0, the lowest index wins: the outlier)."""
  x = jnp.array([[5.0], [5.0], [10.0], [0.0], [0.1]])
  w = jnp.array([0.0, 0.0, 1.0, 1.0, 1.0])
  np.testing.assert_allclose(aggregators.krum(1)(x, w), [0.0])


def test_mean_shift_cluster_keeps_the_larger_group_only():
  """Four points near 0 and two near (5, 5, 5): h is about 3, each mode
  climbs to its own group's mean, and the larger group is the cluster.
  Seen to fail when every mode climbs with one shared neighbourhood
  (`modes[:, None]` -> `modes[None, :]`: one cluster of all six)."""
  x = jnp.array([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0], [0.0, 0.1, 0.0],
                 [0.1, 0.1, 0.0], [5.0, 5.0, 5.0], [5.1, 5.0, 5.0]])
  got = signs.largest_mean_shift_cluster(x, jnp.ones(6, bool), 0.5, 10)
  np.testing.assert_array_equal(got, [True] * 4 + [False] * 2)


def test_smea_weights_matter_only_up_to_scale():
  """Four rows near 10 and one at 7, N = 5, f = 1: SMEA keeps the four,
  whatever the weights' scale (here 0.1 each: every subset's total is 0.4,
  below 1). Seen to fail when the share's normaliser is floored at 1 for
  totals up to 1 (`total > 0` -> `total > 1` in `_top_eigenvalue`: the
  covariance is taken about 0.4 of the mean, and the subset with the row at
  7 wins)."""
  x = jnp.array([[10.0], [10.1], [9.9], [10.05], [7.0]])
  for scale in (1.0, 0.1):
    got = aggregators.smea(1)(x, jnp.full(5, scale))
    np.testing.assert_allclose(got, [10.0125], rtol=1e-6)


def test_cap_duplicates_zeroes_the_dropped_rows_and_keeps_the_others_weights():
  """A copy of row 0 and an absent row (weight 0) both end at weight 0; the
  kept rows keep their own (non-unit) weights. Seen to fail when the
  dropped rows get weight 1 (`where(keep, weights, 0.0)` -> `1.0`, session
  7's mutant #278 of `--preset aggregators`)."""
  x = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [5.0, 5.0]])
  w = jnp.array([0.5, 3.0, 0.0, 2.5])
  _, got = aggregators.cap_duplicates()({"x": x}, w)
  np.testing.assert_array_equal(got, [0.5, 0.0, 0.0, 2.5])


def test_caf_with_no_present_row_gives_zero():
  """Every weight 0: CAF's loop never runs and the aggregate is 0, as for
  the other rules. Seen to fail when the starting share divides by the
  total only where it is 0 (`where(total > 0, total, 1.0)` -> `where(total
  > 0, 1.0, total)`, session 7's mutant #437 of `--preset aggregators`: 0 /
  0, a NaN aggregate)."""
  x = jnp.arange(6.0).reshape(3, 2)
  np.testing.assert_array_equal(aggregators.caf(1)(x, jnp.zeros(3)),
                                [0.0, 0.0])


def test_bulyan_allows_no_byzantine_client():
  """f = 0 is a valid Bulyan (every row selected, every value averaged),
  f = -1 is refused. Seen to fail when f must be >= 1 (`minimum=0` -> `1`,
  session 7's mutant #161 of `--preset aggregators`)."""
  aggregators.bulyan(0)
  with pytest.raises(ValueError, match="num_byzantine"):
    aggregators.bulyan(-1)


def test_mda_keeps_the_subset_of_least_diameter_by_hand():
  """Four points, f = 1: the subsets' squared diameters are 16, 16, 9 and 8
  (rows 1-3 the least), so MDA is their mean (2, 1/3). Seen to fail when a
  squared distance takes one row's norm twice (`sq[None, :]` ->
  `sq[:, None]`, session 7's mutant #478 of `--preset aggregators`: rows
  0, 2, 3 win)."""
  x = jnp.array([[-1.0, 1.0], [3.0, 1.0], [2.0, 1.0], [1.0, -1.0]])
  np.testing.assert_allclose(aggregators.mda(1)(x), [2.0, 1.0 / 3.0],
                             rtol=1e-6)
