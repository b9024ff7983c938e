"""Edges of the robust rules that every test passed through when changed
(issue 21's mutation audit): the number of Weiszfeld iterations, Krum's
one-neighbour floor, and the sampled mutants that survived them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax import aggregators
from prfl_jax.aggregators import base
from prfl_jax.aggregators import signs
from prfl_jax.aggregators import spectral
from tests.test_aggregators import np_centered_clipping
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
  _, got = jax.jit(aggregators.cap_duplicates())({"x": x}, w)
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


def test_caf_filters_an_outlier_at_any_scale():
  """Four rows within 0.1 of 0 and one at (10, 10), f = 1, all scaled by
  1e6 (and 1e-8): CAF's weights fall on the outlier and the aggregate stays
  within 0.1 (scaled) of 0, as unscaled (0.008, -0.022). The mean is (2,
  1.99). Seen to fail when the squared projections are multiplied by the
  top eigenvalue instead of divided (`spectral.top_direction`, session 10's
  mutant #391 of `--preset aggregators`): the ratio `tau / max tau` is the
  same in exact arithmetic, but `proj^2 * lambda` grows as the sixth power
  of the scale, overflows float32 at 1e6 (inf / inf) and flushes to 0 at
  1e-8, and CAF returns the mean."""
  x = jnp.array([[0.0, 0.0], [0.1, 0.0], [-0.1, 0.05], [0.0, -0.1],
                 [10.0, 10.0]])
  rule = jax.jit(aggregators.caf(1))  # One compile for both scales.
  for scale in (1e6, 1e-8):
    got = np.asarray(rule(scale * x)) / scale
    assert np.all(np.abs(got) < 0.1), (scale, got)


def test_mda_measures_squared_distances_with_twice_the_inner_product():
  """Points -0.5, 0.5 and 1.6, f = 1: the closest pair is (-0.5, 0.5),
  distance 1 against 1.1, so MDA is 0. Seen to fail when the squared
  distance takes three inner products (`2.0 * g` -> `3.0 * g` in
  `subsets._diameter`, session 10's mutant #480 of `--preset aggregators`:
  0.25 + 2.56 - 2.4 = 0.41 for (0.5, 1.6) beats 1.25, and MDA is 1.05).
  Points symmetric about 0 or a pair at the origin tell the two apart
  only by chance."""
  x = jnp.array([[-0.5], [0.5], [1.6]])
  np.testing.assert_allclose(aggregators.mda(1)(x), [0.0], atol=1e-6)


def test_cap_duplicates_measures_the_tolerance_against_the_longer_row():
  """Rows (2, 0) and (1.2, 0) at tolerance 0.5: distance 0.8 <= 0.5 * 2, so
  the later row is dropped whichever of the two comes first. Seen to fail
  when the tolerance takes the later row's norm only (`norms[None, :]` ->
  `norms[:, None]` in `cap_duplicates`, session 10's mutant #270 of
  `--preset aggregators`: 0.8 > 0.5 * 1.2 keeps (1.2, 0) after (2, 0))."""
  pre = jax.jit(aggregators.cap_duplicates(0.5))
  for x in ([[2.0, 0.0], [1.2, 0.0]], [[1.2, 0.0], [2.0, 0.0]]):
    _, got = pre({"x": jnp.array(x)}, jnp.ones(2))
    np.testing.assert_array_equal(got, [1.0, 0.0])


def test_cap_duplicates_takes_a_tolerance_in_zero_to_one():
  """Tolerances 0 and 0.999 are allowed; 1, 1.5 and -0.1 are refused (the
  docstring's [0, 1): at 1 two rows of equal norm 60 degrees apart would
  be one). Seen to fail when the bound is 2 (`check_fraction(..., 1.0)` ->
  `2.0` in `cap_duplicates`, session 10's mutant #265 of `--preset
  aggregators`)."""
  aggregators.cap_duplicates(0.0)
  aggregators.cap_duplicates(0.999)
  for bad in (1.0, 1.5, -0.1):
    with pytest.raises(ValueError, match="tolerance"):
      aggregators.cap_duplicates(bad)


def test_signguard_keeps_only_rows_that_pass_both_filters():
  """Four rows about (1, 1); (30, 0.001) has their signs but 21 times the
  median norm (outside the norm filter), (-1, -1) their norm but the other
  signs (outside the largest sign cluster): SignGuard averages the four,
  clipped to the median norm M = (sqrt(2) + sqrt(2.08)) / 2, which scales
  (1.2, 0.8) and (0.8, 1.2) by c = M / sqrt(2.08): (1 + c) / 2 (1, 1).
  Seen to fail when a row needs to pass either filter (`s1 & s2` -> `s1 |
  s2`, session 10's mutant #373 of `--preset aggregators`: all six rows are
  averaged, (0.73, 0.50))."""
  x = jnp.array([[1.0, 1.0], [1.2, 0.8], [0.8, 1.2], [1.0, 1.0],
                 [30.0, 0.001], [-1.0, -1.0]])
  c = (np.sqrt(2.0) + np.sqrt(2.08)) / 2 / np.sqrt(2.08)
  np.testing.assert_allclose(aggregators.signguard()(x),
                             [(1 + c) / 2] * 2, rtol=1e-5)


def test_mean_shift_counts_points_at_exactly_the_bandwidth():
  """Points 0, 1, 2 at quantile 0.5: each one's nearest other point is at
  1, so h = 1 exactly; the ends climb to 0.5 and 1.5 (their neighbour at
  distance h counts), 1 stays, and the modes 0.5 apart (h / 2) form one
  cluster of all three. Seen to fail when a point at distance h is left
  out of the climb (`<= h * h` -> `<`, session 10's mutant #312 of
  `--preset aggregators`: every point stays alone) or modes h / 2 apart are
  not one cluster (`<= h * h / 4` -> `<`, #327): only point 0 is kept.
  One climb already reaches the modes, so with `num_iters=1` too; seen to
  fail when the climb loop starts at 1 (`fori_loop(0, ...)` -> `(1, ...)`,
  #326: no climb at all)."""
  for num_iters in (1, 5):
    got = signs.largest_mean_shift_cluster(
        jnp.array([[0.0], [1.0], [2.0]]), jnp.ones(3, bool), 0.5, num_iters)
    np.testing.assert_array_equal(got, [True, True, True])


def test_mean_shift_measures_distances_over_every_feature():
  """Points (0, 0), (3, 0), (5, 0) at quantile 0.5: h = (3 + 2 + 2) / 3 =
  7/3, so (0, 0) has no neighbour and (3, 0), (5, 0) climb to (4, 0): the
  largest cluster is the last two. Seen to fail when the squared distance
  is averaged over the features instead of summed (`jnp.sum` -> `jnp.mean`
  in the climb, session 10's mutant #313 of `--preset aggregators`: a
  radius of h sqrt(2) joins (0, 0) and (3, 0), and only (0, 0) is kept)."""
  got = signs.largest_mean_shift_cluster(
      jnp.array([[0.0, 0.0], [3.0, 0.0], [5.0, 0.0]]), jnp.ones(3, bool),
      0.5, 5)
  np.testing.assert_array_equal(got, [False, True, True])


def test_caf_makes_at_most_max_iters_passes():
  """`max_iters=1`: one pass, whose eigenvalue is that of the starting
  weights, so CAF returns the plain mean (2, 1.99) of the rows of
  `test_caf_filters_an_outlier_at_any_scale`. Seen to fail when the loop
  runs while `it <= max_iters` (session 10's mutant #414 of `--preset
  aggregators`: a second pass down-weights the outlier)."""
  x = jnp.array([[0.0, 0.0], [0.1, 0.0], [-0.1, 0.05], [0.0, -0.1],
                 [10.0, 10.0]])
  np.testing.assert_allclose(aggregators.caf(1, max_iters=1)(x),
                             jnp.mean(x, axis=0), rtol=1e-6)


def test_monna_divides_by_the_neighbours_weight_below_one():
  """MoNNA's mean divides by the neighbours' total weight even when it is
  below 1: rows 0, 1, 10 with weights 0.25, 0.25, 0.5 and f = 1, so row 0's
  two nearest (0, 1) give (0.25 * 0 + 0.25 * 1) / 0.5 = 0.5. Seen to fail
  when the total is used only above 1 (`where(total > 1, total, 1)`:
  session 11's sampled survivor aggregators #189 gives 0.25; the other
  tests' weights summed to 1 or more)."""
  got = jax.jit(aggregators.monna(1))(jnp.array([[0.0], [1.0], [10.0]]),
                                      jnp.array([0.25, 0.25, 0.5]))
  np.testing.assert_allclose(got, [0.5], rtol=1e-6)


def test_monna_without_byzantine_rows_is_the_weighted_mean():
  """f = 0 is allowed: every present row is a neighbour of the trusted
  one, so MoNNA is the weighted mean, (0 + 1 + 2 * 10) / 4 = 5.25. Seen to
  fail when `num_byzantine` must be at least 1 (session 12's sampled
  survivor aggregators #191, `minimum=0` -> `1`: the other tests use
  f >= 1)."""
  got = jax.jit(aggregators.monna(0))(jnp.array([[0.0], [1.0], [10.0]]),
                                      jnp.array([1.0, 1.0, 2.0]))
  np.testing.assert_allclose(got, [5.25], rtol=1e-6)


def test_monna_skips_an_absent_first_row():
  """Row 0 absent (weight 0, far away), trusted row 1, f = 1: the n - f = 2
  nearest present rows of row 1 are rows 1 and 2, mean 0.5. Seen to fail
  when `base.nearest` masks its choice with `present[:, None]` instead of
  `present[None, :]` (session 12's sampled survivor aggregators #45: with
  one query row that is row 0's presence for every column, so nothing is
  chosen and MoNNA returns 0)."""
  got = jax.jit(aggregators.monna(1, index=1))(
      jnp.array([[100.0], [0.0], [1.0], [2.0]]),
      jnp.array([0.0, 1.0, 1.0, 1.0]))
  np.testing.assert_allclose(got, [0.5], rtol=1e-6)


def test_dnc_checks_subsample_dim_only_when_one_is_given():
  """`subsample_dim=None` (every coordinate, the default) is accepted and a
  given one must be an integer >= 1. Seen to fail when the check runs only
  for None (session 11's sampled survivor aggregators #444: the default is
  refused and 0 let through; the other tests build `dnc(F)` when their
  module is imported, before the tool swaps the code in)."""
  aggregators.dnc(1)
  with pytest.raises(ValueError, match="subsample_dim"):
    aggregators.dnc(1, subsample_dim=0)


def test_dnc_normalises_weights_that_sum_below_one():
  """Four rows near (10, 10) and an outlier at (10, 0), f = 1, weights 0.1
  each (total 0.5): DnC centres the rows at their weighted mean, finds the
  outlier's direction and drops it, as with weights 1. Seen to fail when
  the weights are normalised only above a total of 1 (session 11's sampled
  survivor aggregators #454: the centre (5, 4) points the top direction at
  the four rows and one of them is dropped)."""
  x = jnp.array([[10.0, 10.0], [10.1, 10.0], [10.0, 10.1], [9.9, 10.0],
                 [10.0, 0.0]])
  dnc = jax.jit(aggregators.dnc(1))
  for weight in (0.1, 1.0):
    np.testing.assert_allclose(dnc(x, jnp.full(5, weight)), [10.0, 10.025],
                               rtol=1e-6)


def test_dnc_removes_a_share_of_f_below_one():
  """Points 0, 1, 2, 3 and 100, f = 2: DnC scores them by their squared
  distance from the mean 21.2 and removes floor(filter_frac * f) rows:
  filter_frac = 1 removes 100 and 0 (mean 2), 0.5 only 100 (mean 1.5), 0
  none (the mean, 21.2). Seen to fail when filter_frac must be at least 1
  (session 14's sampled survivor aggregators #442, `check_fraction(...,
  0.0, 2.0)` -> `1.0, 2.0`: 0.5 and 0 refused); every other test used the
  paper's c = 1 or a negative one."""
  x = jnp.array([[0.0], [1.0], [2.0], [3.0], [100.0]])
  for frac, mean in ((1.0, 2.0), (0.5, 1.5), (0.0, 21.2)):
    got = jax.jit(aggregators.dnc(2, filter_frac=frac))(x)
    np.testing.assert_allclose(got, [mean], rtol=1e-6)


def test_signguard_keeps_rows_at_exactly_the_norm_bounds():
  """Norms 1, 2, 2, 2, 6 along one axis: M = 2, so with `low=0.5,
  high=3.0` the first and last rows sit exactly on the bounds and are kept;
  the last is clipped to 2: the mean is (1 + 2 + 2 + 2 + 2) / 5 = 1.8.
  Seen to fail when the lower bound is strict (`ratio > low`, session 11's
  sampled survivor aggregators #365: (2, 0)), and when the upper one is
  (`ratio < high`: 1.75)."""
  x = jnp.array([[1.0, 0.0], [2.0, 0.0], [2.0, 0.0], [2.0, 0.0],
                 [6.0, 0.0]])
  np.testing.assert_allclose(
      jax.jit(aggregators.signguard(low=0.5, high=3.0))(x), [1.8, 0.0],
      rtol=1e-6)


def test_signguard_drops_a_present_row_below_the_lower_norm_bound():
  """Norms 0.05, 1, 1, 1 along one axis (the same signs): M = 1, so with the
  default `low=0.1` the first row fails the norm filter and the mean is
  (1, 0). Seen to fail when a present row passes the lower bound whatever
  its norm (session 13's sampled survivor aggregators #364, `present &
  (ratio >= low)` -> `present | (ratio >= low)`: 0.7625, every row kept;
  the other tests' rows are never below the bound)."""
  x = jnp.array([[0.05, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
  np.testing.assert_allclose(jax.jit(aggregators.signguard())(x), [1.0, 0.0],
                             rtol=1e-6)


def test_signguard_draws_coord_frac_of_the_coordinates(monkeypatch):
  """With `coord_frac` < 1 the sign statistics use `int(coord_frac * d)`
  random coordinates, at least one: 4 of 8 at 0.5, 1 of 8 at 0.1 (the
  draw's size is read from `jax.random.choice`, wrapped, while the rule is
  traced). Seen to fail
  when the count is `min(1, ...)` instead of `max(1, ...)` (session 12's
  sampled survivor aggregators #351: every draw is one coordinate, and no
  output test could tell which coordinates a key draws)."""
  sizes = []
  choice = jax.random.choice

  def spy(key, a, shape=(), *args, **kwargs):
    sizes.append((a, tuple(shape)))
    return choice(key, a, shape, *args, **kwargs)

  monkeypatch.setattr(jax.random, "choice", spy)
  x = jnp.arange(40.0).reshape(5, 8) - 15.0
  for frac in (0.5, 0.1):
    agg = aggregators.signguard(coord_frac=frac)
    jax.eval_shape(lambda m: agg(m, key=jax.random.key(0)), x)  # Traced.
  assert sizes == [(8, (4,)), (8, (1,))]


def test_signguard_takes_coord_frac_in_zero_to_one():
  """`coord_frac` is a share of the coordinates: 1 (the default) and 0.5
  are accepted, 1.5 and 0 refused with ValueError naming it. Seen to fail
  when the upper bound is 2 + 1e-9 instead of 1 + 1e-9 (`1e-9` ->
  `1.000000001` in `1.0 + 1e-9`, session 16's census survivor aggregators
  #345 at 9158dc9: 1.5 passes, and the rule silently reads every
  coordinate; no test tried a share above 1)."""
  aggregators.signguard(coord_frac=1.0)
  aggregators.signguard(coord_frac=0.5)
  for bad in (1.5, 0.0):
    with pytest.raises(ValueError, match="coord_frac"):
      aggregators.signguard(coord_frac=bad)


def test_top_direction_returns_squared_projections_on_the_unit_vector():
  """`spectral.top_direction` against NumPy's covariance eigenpair: tau_i
  = ((x_i - mu)^T v)^2 with v of unit length, for a spread whose top
  eigenvalue is below 1 (0.08) and one above (8.1). Seen to fail when the
  squared projections are divided by lambda only above 1 (session 12's
  sampled survivor aggregators #394, `where(lam > 0, lam, 1)` -> `lam > 1`:
  CAF and DnC read tau only up to scale, so their tests could not tell)."""
  share = np.array([0.1, 0.2, 0.3, 0.4])
  top = jax.jit(spectral.top_direction)
  for scale in (1.0, 10.0):
    x = scale * np.array([[0.0, 0.0], [0.5, 0.1], [0.0, 0.2], [0.6, 0.3]])
    mu = share @ x
    values, vectors = np.linalg.eigh((share[:, None] * (x - mu)).T @ (x - mu))
    lam, tau = top(jnp.asarray(x @ x.T, jnp.float32), jnp.asarray(share))
    np.testing.assert_allclose(lam, values[-1], rtol=1e-4)
    np.testing.assert_allclose(tau, ((x - mu) @ vectors[:, -1]) ** 2,
                               rtol=1e-3, atol=1e-6 * scale ** 2)


def test_krum_picks_the_same_row_at_a_small_scale():
  """Points 0, 1, 2.2, 3.5, 10 (N = 5, f = 1: scores over the 2 nearest,
  2.44 for the point 1, the lowest): Krum returns the point 1, and 1e-4 at
  1e-4 times the scale (squared distances near 1e-8, as late in training).
  Seen to fail when the ranks past the nearest add 1 instead of 0 to every
  score (session 14's sampled survivor aggregators #154, `where(rank <
  neighbours, nearest, 0.0)` -> `1.0`: every score becomes 3 + 1e-8 terms,
  which float32 rounds to a tie, and Krum returns the point 0); a shift
  common to every score keeps the choice only where it is not rounded
  away."""
  points = jnp.array([[0.0], [1.0], [2.2], [3.5], [10.0]])
  krum = jax.jit(aggregators.krum(1))
  for scale in (1.0, 1e-4):
    np.testing.assert_allclose(krum(scale * points), [scale], rtol=1e-6)


def test_nnm_allows_any_f_below_n():
  """NNM needs only f < N (each row keeps n - f >= 1 neighbours), not 2 f
  < N: points 0, 1, 3, 10 with f = 2 mix each with its nearest other point
  (0.5, 0.5, 2, 6.5), f = 3 leaves every row alone, f = 4 is refused.
  Seen to fail when the check is 2 f < N (session 15's sampled survivor
  aggregators #212, `factor=1` -> `2` in `nnm`: f = 2 and 3 refused; the
  other tests use f < N / 2)."""
  x = jnp.array([[0.0], [1.0], [3.0], [10.0]])
  for f, expected in ((2, [0.5, 0.5, 2.0, 6.5]), (3, [0.0, 1.0, 3.0, 10.0])):
    out, w = jax.jit(aggregators.nnm(f))(x)
    np.testing.assert_allclose(out[:, 0], expected, rtol=1e-6)
    np.testing.assert_array_equal(w, np.ones(4))
  with pytest.raises(ValueError, match="num_byzantine"):
    aggregators.nnm(4)(x)


def test_arc_leaves_a_row_at_the_threshold_alone_even_at_infinite_norm():
  """ARC with f = 0 clips k = 0 rows: the threshold is the largest norm and
  every row comes out as it went in, also a finite row (3e38, -3e38) whose
  norm exceeds float32's largest (norm and threshold both inf), and a row
  (3e19, 0) whose squared norm overflows (norm and threshold 3e19, since
  `base.row_norms` is scale-safe). Seen to fail when rows at the threshold
  are rescaled too (`norms > threshold` -> `>=`, session 15's sampled
  survivor aggregators #206, then in `pre._clip_to`, now in
  `base.clip_rows`: the inf row becomes inf, (x / m) * (inf / sqrt(2)); before
  the norms were scale-safe the 3e19 row, of norm inf, showed it, inf / inf
  = NaN). For finite norms the two agree, as x / x is exactly 1 and a
  float32 norm is 0 or above 1e-30. Also fails when ARC refuses f = 0
  (`minimum=0` -> `1`, #245)."""
  for x in (jnp.array([[3e38, -3e38], [1.0, 2.0], [0.0, -4.0]]),
            jnp.array([[3e19, 0.0], [1.0, 2.0], [0.0, -4.0]])):
    out, w = jax.jit(aggregators.arc(0))(x)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(w, np.ones(3))


def test_an_absent_row_0_leaves_the_nearest_rows_of_another_row_unchanged():
  """Row 0 absent (weight 0, far away). MoNNA trusting row 3 (at 0) among
  2, 1, 0 with f = 1 averages its two nearest present rows, 0 and 1: 0.5.
  DnC with f = 1 on 100, 0, 1, 2 (present) drops the largest score, 100:
  mean 1. Seen to fail when `base.nearest` masks the distances by the
  query row's presence (`present[None, :]` -> `present[:, None]` in the
  `where`, session 15's sampled survivor aggregators #39): for one query
  row (MoNNA, DnC) that broadcasts to every row's presence and row 0 of it
  is read, so an absent row 0 makes every distance inf and the
  lowest-indexed present rows win (MoNNA 1.5, DnC 33.7);
  `test_monna_skips_an_absent_first_row` has its nearest rows lowest too."""
  w = jnp.array([0.0, 1.0, 1.0, 1.0])
  got = jax.jit(aggregators.monna(1, index=3))(
      jnp.array([[100.0], [2.0], [1.0], [0.0]]), w)
  np.testing.assert_allclose(got, [0.5], rtol=1e-6)
  got = jax.jit(aggregators.dnc(1))(
      jnp.array([[50.0], [100.0], [0.0], [1.0], [2.0]]),
      jnp.array([0.0, 1.0, 1.0, 1.0, 1.0]))
  np.testing.assert_allclose(got, [1.0], rtol=1e-6)


def test_krum_refuses_n_equal_to_2f_plus_2():
  """Krum needs N > 2 f + 2: f = 1 is refused for N = 4 and allowed for
  N = 5 (the other tests refused only N well below 2 f + 2). Seen to fail
  when N = 2 f + 2 passes (`>=` -> `>` in `check_krum`, session 15's
  sampled survivor aggregators #133)."""
  with pytest.raises(ValueError, match="num_byzantine"):
    aggregators.check_krum(1, 4)
  with pytest.raises(ValueError, match="num_byzantine"):
    aggregators.krum(1)(jnp.zeros((4, 2)))
  aggregators.check_krum(1, 5)


def test_bucket_means_gives_an_empty_bucket_a_zero_row_of_weight_zero():
  """Rows 0 and 3 present of four, buckets of one: buckets 0 and 1 hold rows
  0 and 3, buckets 2 and 3 are empty and come out as zero rows of weight 0
  (the module's contract for absent rows). Seen to fail when the bucket's
  total is divided by also at 0 (`where(total > 0, total, 1.0)` -> `total
  >= 0`, session 15's sampled survivor aggregators #233: 0 / 0, NaN rows;
  the reference test has no empty bucket), and when an empty bucket's
  weight is 1 (`0.0` -> `1.0` in the returned weights, session 16's census
  survivor aggregators #243 at 9158dc9: weights 2, 1, 1, 1)."""
  x = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
  means, w = jax.jit(aggregators.bucket_means, static_argnums=2)(
      {"x": x}, jnp.arange(4), 1, jnp.array([2.0, 0.0, 0.0, 1.0]))
  np.testing.assert_array_equal(means["x"],
                                [[1.0, 2.0], [7.0, 8.0], [0.0, 0.0],
                                 [0.0, 0.0]])
  np.testing.assert_array_equal(w, [2.0, 1.0, 0.0, 0.0])


def test_sign_features_count_zeros_apart_from_positive_entries():
  """Shares of positive, zero and negative entries: (2, 0, -1, 0) has 1/4,
  1/2 and 1/4; (0, 0, 0, 3) 1/4, 3/4, 0. Seen to fail when zeros count as
  positive (`flat > 0` -> `flat >= 0`, session 15's sampled survivor
  aggregators #285: 3/4 and 1 positive; the other tests' rows had no exact
  zero or the same share of them in every row, where the shift is common
  to all rows and the clustering does not see it), and when entries below
  1 count as negative (`flat < 0` -> `flat < 1`, #290: 3/4 and 3/4) or
  zeros count as negative (`flat < 0` -> `flat <= 0`, session 16's census
  survivor aggregators #289 at 9158dc9: 3/4 and 3/4)."""
  got = jax.jit(signs.sign_features)(
      jnp.array([[2.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 3.0]]))
  np.testing.assert_array_equal(got, [[0.25, 0.5, 0.25], [0.25, 0.75, 0.0]])


def test_signguard_clips_to_the_median_norm_at_a_scale_below_one():
  """The rows of `test_signguard_keeps_rows_at_exactly_the_norm_bounds`
  divided by 16 (norms 1/16 to 6/16, all below 1; powers of two keep the
  ratios exact): SignGuard is scale-equivariant, 1.8 / 16. Seen to fail
  when the norms under the clip's ratio are floored at 1 (`maximum(norms,
  1e-30)` -> `maximum(norms, 1.0)`, session 15's sampled survivor
  aggregators #371: every row is scaled by min(1, M) = 1/8, 0.02; the other
  tests' norms were 1 or more)."""
  x = jnp.array([[1.0, 0.0], [2.0, 0.0], [2.0, 0.0], [2.0, 0.0],
                 [6.0, 0.0]])
  rule = jax.jit(aggregators.signguard(low=0.5, high=3.0))
  for scale in (1.0, 1.0 / 16):
    np.testing.assert_allclose(rule(scale * x), [1.8 * scale, 0.0],
                               rtol=1e-6)


def test_dnc_keeps_only_rows_kept_in_every_pass():
  """Rows (10, 0) and (0, 10) are each the outlier of one coordinate; DnC
  with f = 1, one coordinate per pass and 20 passes (key 0 draws both
  coordinates) drops each in some pass, so only (0, 0), (1, 1), (-1, -1)
  are kept in every pass: mean (0, 0). Seen to fail when a row kept in any
  pass is averaged (`jnp.all` -> `jnp.any` over the passes, session 15's
  sampled survivor aggregators #461: all five rows, (2, 2)); with one pass,
  or passes over every coordinate, the two agree."""
  x = jnp.array([[10.0, 0.0], [0.0, 10.0], [0.0, 0.0], [1.0, 1.0],
                 [-1.0, -1.0]])
  rule = aggregators.dnc(1, num_iters=20, subsample_dim=1)
  got = jax.jit(lambda m, k: rule(m, key=k))(x, jax.random.key(0))
  np.testing.assert_allclose(got, [0.0, 0.0], atol=1e-6)


def test_mda_averages_exactly_n_minus_f_present_rows():
  """Present rows 0, 0, 1, 1 and an absent last row (weight 0), f = 1:
  every 3 of the 4 present rows have diameter 1, so the first valid subset
  in combinations order wins, rows 0-2 (mean 1/3); the subset that drops
  the absent row keeps all 4 present rows and is not valid. Seen to fail
  when a subset is valid if it keeps or finds present any row (`jnp.all` ->
  `jnp.any` in `_best_subset`, session 15's sampled survivor aggregators
  #466: the 4 present rows, tied at diameter 1 and first in order, 0.5)."""
  got = jax.jit(aggregators.mda(1))(
      jnp.array([[0.0], [0.0], [1.0], [1.0], [100.0]]),
      jnp.array([1.0, 1.0, 1.0, 1.0, 0.0]))
  np.testing.assert_allclose(got, [1.0 / 3.0], rtol=1e-6)


def test_trimmed_mean_and_meamed_normalise_weights_that_sum_below_one():
  """Rows 0, 1, 2, 10 at weight 1/8 each (powers of two: exact sums): the
  trimmed mean at 0.25 drops 0 and 10 (1.5); Meamed with f = 1 averages the
  3 values nearest the median 1.5, rows 0-2 (1), as with weights 1. Seen to
  fail when `_ranked_mean` divides by the kept weight only above 1
  (`where(total > 0, total, 1.0)` -> `total > 1`, session 15's sampled
  survivor aggregators #83: 0.375 for both; the other tests' kept weights
  summed to 1 or more), or gives 0 unless it is above 1 (the outer `total >
  0` -> `total > 1`, #79: 0 for both)."""
  x = jnp.array([[0.0], [1.0], [2.0], [10.0]])
  for weight in (1.0, 0.125):
    w = jnp.full(4, weight)
    np.testing.assert_allclose(jax.jit(aggregators.trimmed_mean(0.25))(x, w),
                               [1.5], rtol=1e-6)
    np.testing.assert_allclose(jax.jit(aggregators.meamed(1))(x, w), [1.0],
                               rtol=1e-6)


def test_meamed_breaks_ties_in_the_gap_by_lower_row_among_many_rows():
  """20 rows: 9 at +1 (rows 0-8), 9 at -1 (rows 9-17), 2 at 0: the median
  is 0 and 18 rows tie at gap 1. Meamed with f = 9 averages n - f = 11
  values: the two zeros and the 9 lowest tied rows, all +1: 9 / 11. Seen
  to fail when the gap's sort is not stable (`stable=True` -> `False` in
  `mean_around_median`, session 15's sampled survivor aggregators #103): on
  CPU an unstable sort keeps the order of ties up to 16 rows, and the
  other tests have at most 14 rows, of random values without ties."""
  x = jnp.array([[1.0]] * 9 + [[-1.0]] * 9 + [[0.0]] * 2)
  np.testing.assert_allclose(jax.jit(aggregators.meamed(9))(x), [9.0 / 11.0],
                             rtol=1e-6)


def test_meamed_takes_a_large_f_when_n_is_larger_still():
  """Meamed's f is bounded only by N, known at the call: f = 45 with 91
  rows, 0, 1, ..., 45 and 1000, ..., 1044: the median is 45, the n - f = 46
  values nearest it are 0..45, mean 22.5. Seen to fail when the check at
  construction uses N = 90 instead of 10^9 (`10 ** 9` -> `10 * 9` in
  `mean_around_median`, session 16's census survivor aggregators #107 at
  9158dc9: meamed(45) is refused before any message is seen; the other
  tests' f was at most 9)."""
  x = jnp.concatenate([jnp.arange(46.0), 1000.0 + jnp.arange(45.0)])[:, None]
  np.testing.assert_allclose(jax.jit(aggregators.meamed(45))(x), [22.5],
                             rtol=1e-6)


def test_krum_allows_no_byzantine_client():
  """f = 0 is a valid Krum (N = 4 > 2): scores over the 2 nearest others,
  for 0, 1, 1.5, 10: 3.25, 1.25, 2.5, 153.25, so Krum returns 1; f = -1 is
  refused. Seen to fail when f must be at least 1 (`minimum=0` -> `1` in
  `krum`, session 15's sampled survivor aggregators #156: the other tests
  use f >= 1)."""
  got = jax.jit(aggregators.krum(0))(jnp.array([[0.0], [1.0], [1.5], [10.0]]))
  np.testing.assert_allclose(got, [1.0])
  with pytest.raises(ValueError, match="num_byzantine"):
    aggregators.krum(-1)


def test_top_direction_centres_exactly_far_from_the_origin():
  """Integer rows with spread about 1, at offsets 0 and 1000, equal shares
  1/4: the Gram matrix (entries up to 2e6), the shares' products and the
  centring g - r_i - r_j + s are all exact in float32, so the eigenpair is
  as accurate as at the origin (1e-7 against NumPy's float64 covariance).
  Seen to fail when the centring subtracts s = ||mu||^2 instead of adding
  it (session 15's sampled survivor aggregators #374, `+ jnp.dot(share,
  r)` -> `-`): in exact arithmetic that only moves the covariance's null
  direction sqrt(share) to eigenvalue -2 s, leaving the top pair alone, but
  in float32 an eigenvalue of -4e6 next to the spread's 1.5 costs the top
  pair 2e-2 (lambda) and 9e-2 (tau) at offset 1000 (3e-7 at 0)."""
  base = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])
  share = np.full(4, 0.25)
  top = jax.jit(spectral.top_direction)
  for offset in (0.0, 1000.0):
    x = base + offset
    mu = share @ x
    values, vectors = np.linalg.eigh((share[:, None] * (x - mu)).T @ (x - mu))
    lam, tau = top(jnp.asarray(x @ x.T, jnp.float32),
                   jnp.asarray(share, jnp.float32))
    expected = ((x - mu) @ vectors[:, -1]) ** 2
    np.testing.assert_allclose(lam, values[-1], rtol=1e-5)
    np.testing.assert_allclose(tau, expected, rtol=1e-5,
                               atol=1e-5 * expected.max())


def test_multi_krum_may_select_every_row():
  """`num_selected` = N is allowed and averages every row (0, 1, 2, 3, 10:
  3.2); N + 1 is refused. Seen to fail when N is refused too (`num_selected
  > n` -> `>=` in `krum`, session 15's sampled survivor aggregators #157:
  the other tests select fewer than N)."""
  x = jnp.array([[0.0], [1.0], [2.0], [3.0], [10.0]])
  got = jax.jit(aggregators.krum(1, num_selected=5))(x)
  np.testing.assert_allclose(got, [3.2], rtol=1e-6)
  with pytest.raises(ValueError, match="num_selected"):
    aggregators.krum(1, num_selected=6)(x)


def test_unflatten_inverts_flatten_for_several_leaves():
  """`base.unflatten(base.flatten(tree)[i], tree)` is row i of every leaf,
  for leaves of 2 and 2 x 3 entries (flattened in `jax.tree.leaves` order).
  Seen to fail when the offset moves back instead of on (`offset + size` ->
  `offset - size`, session 15's sampled survivor aggregators #36: the
  second leaf reads the first's entries; no library code calls `unflatten`
  at present, so no other test did), and when it moves back after each
  leaf (`offset += size` -> `offset -= size`, session 16's census survivor
  aggregators #37 at 9158dc9: the second leaf reads from offset -2) or
  starts at 1 (`offset = 0` -> `1`, census survivor #35: the first leaf
  reads entries 1-2)."""
  from prfl_jax.aggregators import base
  tree = {"b": np.arange(4.0, dtype=np.float32).reshape(2, 2),
          "w": 10.0 + np.arange(12.0, dtype=np.float32).reshape(2, 2, 3)}
  flat = base.flatten(tree)
  for i in range(2):
    got = base.unflatten(flat[i], tree)
    np.testing.assert_array_equal(got["b"], tree["b"][i])
    np.testing.assert_array_equal(got["w"], tree["w"][i])


def test_caf_stops_when_the_weights_total_reaches_n_minus_2f():
  """Points 2, -1, -1, -1, 1 (mean 0), f = 1: the first pass's squared
  projections are 4, 1, 1, 1, 1 over lambda, so the weights become 0, 3/4,
  3/4, 3/4, 3/4 and their total is n - 2 f = 3 exactly (in float32 too,
  at these scales): CAF's loop (while the total is > n - 2 f) stops and
  returns the mean of its one pass, 0 (also at twice the scale). Seen to
  fail when it goes on at equality (`jnp.sum(c) > stop` -> `>=`, session
  15's sampled survivor aggregators #410: a second pass over -1, -1, -1, 1
  has the smaller eigenvalue, mean -0.5)."""
  x = jnp.array([[2.0], [-1.0], [-1.0], [-1.0], [1.0]])
  rule = jax.jit(aggregators.caf(1))
  for scale in (1.0, 2.0):
    np.testing.assert_allclose(rule(scale * x), [0.0], atol=1e-6)


def test_trimmed_mean_takes_a_number_in_zero_to_one_half():
  """0 and 0.25 are accepted (built here, not at import), a string, a bool
  and 0.5 are refused with ValueError. Seen to fail when the type check is
  inverted (`not isinstance(trim_fraction, (int, float))` -> `isinstance`,
  session 15's sampled survivor aggregators #87: 0.25 is refused and a
  string reaches the range check's `<`, a TypeError; the other tests build
  `trimmed_mean(0.25)` when their module is imported, before the in-process
  tool swaps the code in), and when the range starts at 1 (`0 <=
  trim_fraction` -> `1 <=`, #89: 0 and 0.25 refused)."""
  aggregators.trimmed_mean(0)
  aggregators.trimmed_mean(0.25)
  for bad in ("0.1", True, 0.5):
    with pytest.raises(ValueError, match="trim_fraction"):
      aggregators.trimmed_mean(bad)


def test_cap_duplicates_keeps_a_zero_row_after_an_absent_one():
  """An absent row (weight 0) comes out as a zero row, but it is not a
  message: a present zero row after it keeps its weight (rows (5, 5) absent,
  (0, 0), (1, 0): weights 0, 1, 1). Seen to fail when the earlier row's
  presence is replaced by the later row's (`present[None, :]` ->
  `present[:, None]` in `cap_duplicates`, session 15's sampled survivor
  aggregators #272: the zero row is dropped as a copy of the absent one;
  only an exactly zero present row is within the tolerance of a zeroed
  absent row, and no other test had one)."""
  x = jnp.array([[5.0, 5.0], [0.0, 0.0], [1.0, 0.0]])
  _, got = jax.jit(aggregators.cap_duplicates())({"x": x},
                                                 jnp.array([0.0, 1.0, 1.0]))
  np.testing.assert_array_equal(got, [0.0, 1.0, 1.0])


def test_dnc_allows_no_byzantine_client():
  """f = 0 is a valid DnC: no row is removed, the mean of 0, 1, 2, 3, 100
  is 21.2; f = -1 is refused. Seen to fail when f must be at least 1
  (`minimum=0` -> `1` in `dnc`, session 15's sampled survivor aggregators
  #441: the other tests use f >= 1)."""
  x = jnp.array([[0.0], [1.0], [2.0], [3.0], [100.0]])
  np.testing.assert_allclose(jax.jit(aggregators.dnc(0))(x), [21.2],
                             rtol=1e-6)
  with pytest.raises(ValueError, match="num_byzantine"):
    aggregators.dnc(-1)


def test_mda_compares_diameters_below_one():
  """Points 0, 0.9, 0.1, 0.2 and f = 1: the squared diameters of the four
  3-subsets are 0.81, 0.81, 0.04 and 0.64, all below 1, and MDA averages
  the least, rows 0, 2, 3: 0.1. Seen to fail when the squared distances
  are floored at 1 instead of 0 (`maximum(..., 0.0)` -> `1.0` in
  `subsets._diameter`, session 16's census survivor aggregators #481 at
  9158dc9: every subset's diameter is 1, the first wins, 1/3; the other
  tests' subsets all had diameters above 1)."""
  x = jnp.array([[0.0], [0.9], [0.1], [0.2]])
  np.testing.assert_allclose(jax.jit(aggregators.mda(1))(x), [0.1],
                             rtol=1e-6)


def test_mda_and_smea_allow_no_byzantine_client():
  """f = 0 is a valid MDA and SMEA: the one subset of n - 0 rows is every
  row, and the mean of 0, 1, 5 is 2; f = -1 is refused. Seen to fail when
  f must be at least 1 (`minimum=0` -> `1` in `subsets._subset_rule`,
  session 16's census survivor aggregators #473 at 9158dc9: both refuse
  f = 0; the other tests use f >= 1)."""
  x = jnp.array([[0.0], [1.0], [5.0]])
  for rule in (aggregators.mda, aggregators.smea):
    np.testing.assert_allclose(jax.jit(rule(0))(x), [2.0], rtol=1e-6)
    with pytest.raises(ValueError, match="num_byzantine"):
      rule(-1)


def test_dnc_filter_frac_is_below_two():
  """DnC's filter_frac c removes floor(c f) rows per pass and is in [0, 2):
  0 and 1.5 are accepted, 2 and 2.5 refused with ValueError naming it.
  Seen to fail when the bound is 3 (`2.0` -> `3.0` in `dnc`'s check,
  session 16's census survivor aggregators #443 at 9158dc9: 2 and 2.5
  pass; no test tried a share at or above 2)."""
  aggregators.dnc(1, filter_frac=0.0)
  aggregators.dnc(1, filter_frac=1.5)
  for bad in (2.0, 2.5):
    with pytest.raises(ValueError, match="filter_frac"):
      aggregators.dnc(1, filter_frac=bad)


def test_dnc_draws_distinct_coordinates_per_pass():
  """Rows (3, 3, 3) and (0, 0, 4) among three near 0, f = 1, 2 of the 3
  coordinates per pass: every pair of distinct coordinates scores (3, 3, 3)
  highest (a NumPy SVD: 5.85 against 3.85 on the pair (0, 2)), so over 50
  passes only it is removed: mean (0, -0.125, 1.125). Seen to fail when
  the coordinates are drawn with replacement (`replace=False` -> `True` in
  `dnc`, session 15's sampled survivor aggregators #459): a pass that draws
  coordinate 2 twice scores (0, 0, 4) highest (6.25 against 2.25), and it
  is removed too, (0, -1/6, 1/6); the other tests draw one coordinate per
  pass, or rows that are all alike."""
  x = jnp.array([[3.0, 3.0, 3.0], [0.0, 0.0, 4.0], [0.0, 0.0, 0.0],
                 [0.5, -0.5, 0.0], [-0.5, 0.0, 0.5]])
  rule = aggregators.dnc(1, num_iters=50, subsample_dim=2)
  got = jax.jit(lambda m, k: rule(m, key=k))(x, jax.random.key(0))
  np.testing.assert_allclose(got, [0.0, -0.125, 1.125], atol=1e-6)


def test_arc_allows_f_up_to_n():
  """ARC needs only f <= N (k = floor(2 f (n - f) / n) is then a count of
  rows): norms 1, 2, 10 with f = 2 clip k = 1 row, the 10, to the second
  largest norm, 2; f = 3 clips none; f = 4 is refused. Seen to fail when
  the check is f < N - 1 (`n + 1` -> `n - 1` in `arc`, session 15's sampled
  survivor aggregators #246: f = 2 and 3 refused; the other tests use f <
  N / 2), and when the threshold's index is capped at N - 2 (`n - 1` -> `n
  - 2` in the clip, session 16's census survivor aggregators #263 at
  9158dc9: at f = 3, k = 0, the 10 is clipped to 2)."""
  x = jnp.array([[1.0, 0.0], [0.0, 2.0], [6.0, 8.0]])
  for f, expected in ((2, [[1.0, 0.0], [0.0, 2.0], [1.2, 1.6]]),
                      (3, [[1.0, 0.0], [0.0, 2.0], [6.0, 8.0]])):
    out, _ = jax.jit(aggregators.arc(f))(x)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
  with pytest.raises(ValueError, match="num_byzantine"):
    aggregators.arc(4)(x)


def test_mean_shift_cluster_ties_go_to_the_lowest_present_point():
  """Groups 0, 0.1, 0.2 (rows 1-3) and 5, 5.1, 5.2 (rows 4-6) with an
  absent row 0 at 5.1, quantile 0.34: h = 1/6, each group climbs to its
  mean, and the two clusters tie at 3; the tie goes to the lower present
  row, so rows 1-3. Seen to fail when an absent point's mode counts as a
  candidate (`present[:, None]` -> `present[None, :]` in the cluster
  mask, session 15's sampled survivor aggregators #337: row 0 climbs to
  5.1, also sees 3 modes, and wins the tie by index: rows 4-6)."""
  x = jnp.array([[5.1], [0.0], [0.1], [0.2], [5.0], [5.1], [5.2]])
  present = jnp.array([False] + [True] * 6)
  got = jax.jit(signs.largest_mean_shift_cluster, static_argnums=(2, 3))(
      x, present, 0.34, 5)
  np.testing.assert_array_equal(got, [False] + [True] * 3 + [False] * 3)


def test_centered_clipping_normalises_weights_that_sum_below_one():
  """Points 0, 1, 2, 10 with a radius nothing reaches (100) and one
  iteration from the median 1.5: CC is the weighted mean, 3.25, at weights
  1 and at weights 1/8 (total 1/2). Seen to fail when the weights are
  normalised only above a total of 1 (`where(total > 0, ...)` -> `total >
  1` in `centered_clipping`, session 15's sampled survivor aggregators
  #122: 1.5 + (13 - 6) / 8 = 2.375; the other tests' weights summed to 1
  or more), and when short differences are stretched up to twice their
  length (`minimum(1.0, radius / norm)` -> `minimum(2.0, ...)`, #127: 5.0;
  the reference test's differences all reach its radius)."""
  x = jnp.array([[0.0], [1.0], [2.0], [10.0]])
  rule = jax.jit(aggregators.centered_clipping(100.0, 1))
  for weight in (1.0, 0.125):
    np.testing.assert_allclose(rule(x, jnp.full(4, weight)), [3.25],
                               rtol=1e-6)


def test_cap_duplicates_at_tolerance_zero_drops_exact_copies_only():
  """Tolerance 0: a row equal to an earlier one is within 0 of it and is
  dropped, a row 1e-3 away is kept (rows (1, 0), (1, 0), (1, 0.001), (0,
  2): weights 1, 0, 1, 1). Seen to fail when the tie needs a distance
  strictly below the tolerance (`d <= ...` -> `d < ...`, session 15's
  sampled survivor aggregators #266: nothing is below 0, so the copy is
  kept; the other tests' tolerances were positive, where exact copies are
  strictly inside)."""
  x = jnp.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.001], [0.0, 2.0]])
  _, got = jax.jit(aggregators.cap_duplicates(0.0))({"x": x}, jnp.ones(4))
  np.testing.assert_array_equal(got, [1.0, 0.0, 1.0, 1.0])


def test_mean_shift_leaves_a_point_with_no_neighbour_where_it_is():
  """Points 0.9, 1.0, 1.1 and 2.0 at quantile 0.5: h = (0.2 + 0.1 + 0.2 +
  1.0) / 4 = 0.375, so 2.0 has no other point within h and its mode, the
  mean of itself alone, stays at 2.0; the three others climb to 1.0 and
  are the cluster. Seen to fail when the neighbour count is floored at 2
  (`maximum(sum(near), 1)` -> `2`, session 15's sampled survivor
  aggregators #323: a lone point's mode moves halfway to the origin, here
  to 1.0, and joins the cluster)."""
  got = jax.jit(signs.largest_mean_shift_cluster, static_argnums=(2, 3))(
      jnp.array([[0.9], [1.0], [1.1], [2.0]]), jnp.ones(4, bool), 0.5, 5)
  np.testing.assert_array_equal(got, [True, True, True, False])


def test_caf_counts_each_pass_towards_max_iters_once():
  """Points 0, 0, 0, 1, 10 with f = 1: the first pass's squared
  projections (2.2 - x)^2 leave weights 56, 56, 56, 59.4, 0 (over 60.84);
  their total, 3.74, is still above n - 2 f = 3, so with `max_iters=2` a
  second pass runs, and its eigenvalue is the smaller: CAF returns the
  reweighted mean 59.4 / 227.4 (the first pass alone gives the mean 2.2).
  Seen to fail when a pass counts twice (`it + 1` -> `it + 2`, session 15's
  sampled survivor aggregators #435: `max_iters=2` stops after one pass,
  2.2; `test_caf_makes_at_most_max_iters_passes` uses 1, where one pass is
  made either way)."""
  x = jnp.array([[0.0], [0.0], [0.0], [1.0], [10.0]])
  np.testing.assert_allclose(jax.jit(aggregators.caf(1, max_iters=2))(x),
                             [59.4 / 227.4], rtol=1e-5)


def test_caf_returns_the_pass_of_least_eigenvalue_not_the_last():
  """Points (1, 1), (-1, 1) twice, (1, -1), (-1, -1), f = 1: the first
  pass's top eigenvalue is 1.12 (covariance [[0.96, -0.16], [-0.16,
  0.96]]), the second's, after down-weighting (1, -1) to 0, 1.27; the
  weights' total is then 1.11 < 3 and the loop ends. CAF returns the first
  pass's mean, (-0.2, 0.2) (as the NumPy reference). Seen to fail when the
  least eigenvalue is not recorded (`where(better, lam, best_lam)` ->
  `where(better, best_lam, lam)`, session 15's sampled survivor
  aggregators #421: it stays inf, every pass is "better", and the last
  pass's mean (-4/11, 4/11) is returned; the other tests' eigenvalues fell
  pass by pass)."""
  x = jnp.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, 1.0], [1.0, -1.0],
                 [-1.0, -1.0]])
  np.testing.assert_allclose(jax.jit(aggregators.caf(1))(x), [-0.2, 0.2],
                             rtol=1e-5)


def test_monna_with_no_present_row_gives_zero():
  """Every weight 0: no row is a neighbour and MoNNA returns 0, as the
  other rules do. Seen to fail when the neighbours' total is divided by
  also at 0 (`where(total > 0, total, 1.0)` -> `total >= 0` in
  `neighbour_means`, session 15's sampled survivor aggregators #188: 0 / 0,
  NaN; the all-absent test covers the rules of `test_aggregators.py`
  only)."""
  got = jax.jit(aggregators.monna(1))(jnp.arange(8.0).reshape(4, 2),
                                      jnp.zeros(4))
  np.testing.assert_array_equal(got, [0.0, 0.0])


def test_dnc_with_subsample_dim_equal_to_the_dimension_needs_no_key():
  """`subsample_dim` = P takes every coordinate, as None does: no random
  draw, so no key, and the rows of the weights-below-one DnC test give the
  same (10, 10.025). Seen to fail when a subsample of
  all P coordinates is still drawn (`subsample_dim < size` -> `<=` in
  `dnc`, session 15's sampled survivor aggregators #447: ValueError asking
  for a key; the other tests' subsamples were below P)."""
  x = jnp.array([[10.0, 10.0], [10.1, 10.0], [10.0, 10.1], [9.9, 10.0],
                 [10.0, 0.0]])
  np.testing.assert_allclose(
      jax.jit(aggregators.dnc(1, subsample_dim=2))(x), [10.0, 10.025],
      rtol=1e-6)


def test_weights_with_a_non_finite_entry_are_refused():
  """Concrete weights must all be finite: [1, nan, 1] and [1, inf, 1] are
  refused with ValueError even though other entries are finite. Seen to
  fail when one finite entry is enough (`np.all(np.isfinite(w))` ->
  `np.any` in `base.check_weights`, session 15's sampled survivor
  aggregators #4: both pass, and the NaN row is silently absent; the other
  tests' non-finite values were in the messages, not the weights)."""
  x = jnp.arange(6.0).reshape(3, 2)
  for bad in (np.nan, np.inf):
    with pytest.raises(ValueError, match="finite"):
      aggregators.mean()(x, np.array([1.0, bad, 1.0], np.float32))


def test_weights_with_one_negative_entry_are_refused():
  """Concrete weights must all be non-negative: [1, -1, 1] is refused with
  ValueError even though the other entries are positive. Seen to fail when
  only all-negative weights are refused (`np.any(w < 0)` -> `np.all` in
  `base.check_weights`, census survivor aggregators #5 at 9158dc9: the
  weights pass and the row of weight -1 is silently absent, mean (2, 3);
  the argument tests tried only -1 everywhere)."""
  x = jnp.arange(6.0).reshape(3, 2)
  with pytest.raises(ValueError, match="non-negative"):
    aggregators.mean()(x, np.array([1.0, -1.0, 1.0], np.float32))


def test_krum_scores_are_sums_of_squared_distances():
  """`selection.krum_scores` for points 0, 1, 2.2, 3.5, 10 and f = 1 (the 2
  nearest others): 1 + 4.84, 1 + 1.44, 1.44 + 1.69, 1.69 + 6.25, 42.25 +
  60.84; an absent row scores inf. Seen to fail when the scores are means
  over the N columns (`jnp.sum` -> `jnp.mean`, session 15's sampled
  survivor aggregators #151: every score / 6); Krum, Bulyan and Fang-Krum
  read the scores only through their order, which a common factor keeps,
  so no other test could tell."""
  from prfl_jax.aggregators import selection
  p = np.array([0.0, 1.0, 2.2, 3.5, 10.0, 50.0])
  d2 = jnp.asarray((p[:, None] - p[None, :]) ** 2, jnp.float32)
  present = jnp.array([True] * 5 + [False])
  got = jax.jit(selection.krum_scores, static_argnums=2)(d2, present, 1)
  np.testing.assert_allclose(
      got, [5.84, 2.44, 3.13, 7.94, 103.09, np.inf], rtol=1e-5)


def test_mean_shift_bandwidth_rank_stays_below_count_at_a_quantile_near_one():
  """bandwidth_quantile = 1 - 1e-8 is below 1, but float32 rounds it to 1,
  so floor(q * 4) = 4 for 4 present points 0, 1, 2, 10: the rank is
  clipped to count - 1 = 3, each point's farthest other point (10, 9, 8,
  10), h = 9.25, and every mode climbs to 3.25: one cluster of all four
  (NumPy by hand). Seen to fail when the cap is count + 1 (`count - 1` ->
  `count + 1` in the clip, session 16's census survivor aggregators #302
  at 9158dc9: rank 4 reads past the sorted row, h is NaN and the cluster
  is empty; below float32's rounding floor(q * count) <= count - 1 and the
  cap never acts)."""
  got = jax.jit(signs.largest_mean_shift_cluster, static_argnums=(2, 3))(
      jnp.array([[0.0], [1.0], [2.0], [10.0]]), jnp.ones(4, bool),
      1.0 - 1e-8, 10)
  np.testing.assert_array_equal(got, [True, True, True, True])


def test_mean_shift_joins_two_points_into_one_cluster():
  """Two present points 0 and 1: the bandwidth takes each point's nearest
  other point (k = 1 is both the least and the largest rank allowed, count
  - 1), so h = 1, both climb to 0.5 and form one cluster. Seen to fail when
  the rank is capped at count - 2 (`count - 1` -> `count - 2` in the clip,
  session 15's sampled survivor aggregators #303: k = 0, the point itself,
  h = 0 and each point is alone: only the first is kept)."""
  got = jax.jit(signs.largest_mean_shift_cluster, static_argnums=(2, 3))(
      jnp.array([[0.0], [1.0]]), jnp.ones(2, bool), 0.5, 5)
  np.testing.assert_array_equal(got, [True, True])


def test_top_direction_gives_zero_projections_when_the_covariance_vanishes():
  """Four identical integer rows at shares 1/4 (the centring is exact):
  lambda = 0 and, as documented (v = 0 where lambda is 0), every tau is 0. Seen to fail when tau is 1 there
  (`where(lam > 0, ..., 0.0)` -> `1.0`, session 15's sampled survivor
  aggregators #396); CAF stops at lambda 0 before reading tau, and DnC
  sees only ties either way, so no rule's test could tell."""
  x = np.array([[1.0, 2.0]] * 4)
  lam, tau = jax.jit(spectral.top_direction)(
      jnp.asarray(x @ x.T, jnp.float32), jnp.full(4, 0.25))
  assert float(lam) == 0.0
  np.testing.assert_array_equal(tau, [0.0, 0.0, 0.0, 0.0])


def test_mean_shift_merges_modes_by_their_distance_over_every_feature():
  """Points (0, 0), (1, 0), (2, 0), (3, 0) at quantile 0.5 and one climb: h
  = 1.5, the modes are 0.5, 1, 2, 2.5 (on the x axis), and modes within h
  / 2 = 0.75 are one cluster: {0.5, 1} and {2, 2.5} tie, the first wins.
  Seen to fail when the modes' squared distance is averaged over the 2
  features (`jnp.sum` -> `jnp.mean`, session 15's sampled survivor
  aggregators #328: 1 and 2 are then 1 / 2 <= 0.5625 apart and the modes
  1 and 2 see three each: rows 0-2)."""
  got = jax.jit(signs.largest_mean_shift_cluster, static_argnums=(2, 3))(
      jnp.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]),
      jnp.ones(4, bool), 0.5, 1)
  np.testing.assert_array_equal(got, [True, True, False, False])


def test_mda_allows_exactly_max_subsets_subsets():
  """f = 1 of 4 rows enumerates C(4, 1) = 4 subsets: `max_subsets=4` is
  enough (0, 1, 2, 10: the least diameter is 0, 1, 2, mean 1), 3 is not.
  Seen to fail when the count must stay below `max_subsets` (`count >
  max_subsets` -> `>=` in `_subsets`, session 15's sampled survivor
  aggregators #463: 4 refused; the other tests' counts were far below or
  above it)."""
  x = jnp.array([[0.0], [1.0], [2.0], [10.0]])
  np.testing.assert_allclose(
      jax.jit(aggregators.mda(1, max_subsets=4))(x), [1.0], rtol=1e-6)
  with pytest.raises(ValueError, match="max_subsets"):
    aggregators.mda(1, max_subsets=3)(x)


def test_mda_diameters_use_both_squared_norms():
  """Points 4, 3, 5, 5, f = 1: the subsets' diameters are 2, 2, 1 and 2, so
  MDA averages 4, 5, 5: 14 / 3. Seen to fail when a squared distance
  subtracts the second row's squared norm (`sq[:, None] + sq[None, :]` ->
  `-` in `_diameter`, session 15's sampled survivor aggregators #476: for
  these positive points every such value is at most 0, all subsets tie and
  the first, 4, 3, 5, wins: 4; found by a search of small integer points
  with one least diameter)."""
  x = jnp.array([[4.0], [3.0], [5.0], [5.0]])
  np.testing.assert_allclose(jax.jit(aggregators.mda(1))(x), [14.0 / 3.0],
                             rtol=1e-6)


def test_signguard_averages_rows_whose_squared_norms_overflow_or_underflow():
  """Five rows of one sign pattern (so the sign cluster is all of them) at
  norms 5, 10, 10, 13 and 500 times c: M = 10 c, the last row fails the
  norm filter (ratio 50) and (12, 5) c is clipped to 10 c; SignGuard is
  scale-equivariant, so the answer is c times the float64 NumPy one at
  c = 1. At c = 1e19 every squared norm overflows float32 and at c = 1e-22
  every one underflows to 0, yet the norms (and so the answer) are finite
  and right. Seen to fail before the norms were scale-safe
  (`sqrt(sq_norms)`: NaN at 1e19, the median norm inf / inf; 0 at 1e-22,
  every ratio 0 below `low`)."""
  x = np.array([[3.0, 4.0], [6.0, 8.0], [8.0, 6.0], [12.0, 5.0],
                [300.0, 400.0]])
  norms = np.linalg.norm(x, axis=1)
  med = np.median(norms)
  keep = (norms / med >= 0.1) & (norms / med <= 3.0)
  want = np.mean((x * np.minimum(1.0, med / norms)[:, None])[keep], axis=0)
  rule = jax.jit(aggregators.signguard())
  for c in (1.0, 1e19, 1e-22):
    np.testing.assert_allclose(rule(jnp.asarray(c * x, jnp.float32)),
                               c * want, rtol=1e-5)


def test_clipping_and_arc_bring_an_overflowing_row_to_the_threshold():
  """Finite rows whose squared norm overflows float32 are clipped in their
  own direction, not zeroed: `clipping(1)` takes (3e19, 4e19) to (0.6, 0.8)
  and (3e38, -3e38) (norm above float32's largest, inf) to (1, -1) / sqrt(2);
  ARC with f = 1 of 4 clips the largest row, (3e19, 4e19), to the third
  norm, 3: (1.8, 2.4). Rows of ordinary norm are unchanged or clipped as
  always, and rows at c = 1e-22 (squared norms underflow to 0) are clipped
  to c like their c = 1 counterparts. Seen to fail before the norms were
  scale-safe (`sqrt(sq_norms)` in `_clip_to` / ARC: threshold / inf made
  both big rows 0; the tiny rows had norm 0 and were left unclipped)."""
  x = jnp.array([[3e19, 4e19], [0.3, 0.4], [3e38, -3e38], [-6.0, 8.0]])
  out, w = jax.jit(aggregators.clipping(1.0))(x)
  np.testing.assert_allclose(
      out, [[0.6, 0.8], [0.3, 0.4], [0.5 ** 0.5, -0.5 ** 0.5], [-0.6, 0.8]],
      rtol=1e-6)
  np.testing.assert_array_equal(w, np.ones(4))
  tiny = np.array([[3.0, 4.0], [0.3, 0.4], [-6.0, 8.0]])
  out, _ = jax.jit(aggregators.clipping(1e-22))(
      jnp.asarray(1e-22 * tiny, jnp.float32))
  np.testing.assert_allclose(
      out, 1e-22 * np.array([[0.6, 0.8], [0.3, 0.4], [-0.6, 0.8]]),
      rtol=1e-5)
  out, _ = jax.jit(aggregators.arc(1))(
      jnp.array([[3e19, 4e19], [1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]))
  np.testing.assert_allclose(
      out, [[1.8, 2.4], [1.0, 0.0], [0.0, 2.0], [3.0, 0.0]], rtol=1e-6)


def test_cap_duplicates_tells_rows_apart_whose_squared_norms_overflow_or_underflow():
  """Rows (3e19, 0), (0, 3e19), (-3e19, 0), (1, 2) and a copy of row 0:
  the first four are about 3e19 apart or more, far beyond 0.1% of the
  longer norm (3e16), so they are kept and only the copy is dropped:
  weights 1, 1, 1, 1, 0. Likewise (3e-23, 0), (0, 3e-23), (-3e-23, 0) and a
  copy of row 0 (4.2e-23 or 6e-23 apart against a tolerance of 3e-26): 1,
  1, 1, 0. In float32 the squared norms of the big rows overflow and those
  of the small ones underflow to 0. Seen to fail before the distances were
  taken on rows scaled by a common power of two (`sqrt` of the squares of
  the rows as given: every tolerance beside a big row inf, the distances
  inf or NaN; resp. every norm, distance and tolerance 0; either way every
  row tied with row 0: 1, 0, 0, 0, 0 and 1, 0, 0, 0)."""
  pre = jax.jit(aggregators.cap_duplicates())
  big = jnp.array([[3e19, 0.0], [0.0, 3e19], [-3e19, 0.0], [1.0, 2.0],
                   [3e19, 0.0]])
  _, w = pre({"x": big})
  np.testing.assert_array_equal(w, [1.0, 1.0, 1.0, 1.0, 0.0])
  small = jnp.array([[3e-23, 0.0], [0.0, 3e-23], [-3e-23, 0.0],
                     [3e-23, 0.0]])
  _, w = pre({"x": small})
  np.testing.assert_array_equal(w, [1.0, 1.0, 1.0, 0.0])


@pytest.mark.parametrize("scale", [1.0, 1e19, 1e-22])
def test_krum_nnm_and_mda_pick_the_close_rows_whose_squares_overflow_or_underflow(
    scale):
  """Rows (100, 0), (0, 0), (1, 0), (3, 0), (7, 0) times c, f = 1 of 5 (by
  hand, at any c): Krum's scores (2 nearest squared distances) are 10, 5,
  13, 52 for rows 1-4 and ~1e4 for row 0, so Krum picks (1, 0) c and
  Multi-Krum (m = 2) averages rows 2 and 1, (0.5, 0) c; NNM mixes row 0
  with its 3 nearest, (100 + 7 + 3 + 1) / 4 = 27.75 c, and every other row
  with the rest of rows 1-4, 2.75 c; MoNNA around row 2 gives 2.75 c; MDA
  drops row 0 (squared diameter 49 against 93^2 or more), 2.75 c. At c =
  1e19 the rows' squares overflow float32 and at c = 1e-22 they underflow
  to 0, yet the answers are c times those at c = 1. Seen to fail before the
  distances were taken on the rows times a power of two
  (`base.pairwise_sq_distances(zeroed)`: every distance inf or NaN at
  1e19, 0 at 1e-22, so Krum and MDA took row 0's 100 c or the first
  subset's 26 c, and NNM mixed by index)."""
  x = jnp.asarray(scale * np.array(
      [[100.0, 0.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [7.0, 0.0]]),
      jnp.float32)
  e = np.array([1.0, 0.0])
  np.testing.assert_allclose(jax.jit(aggregators.krum(1))(x), scale * e,
                             rtol=1e-6)
  np.testing.assert_allclose(jax.jit(aggregators.krum(1, 2))(x),
                             scale * 0.5 * e, rtol=1e-6)
  mixed, _ = jax.jit(aggregators.nnm(1))(x)
  np.testing.assert_allclose(
      mixed, scale * np.outer([27.75, 2.75, 2.75, 2.75, 2.75], e),
      rtol=1e-6)
  np.testing.assert_allclose(jax.jit(aggregators.monna(1, index=2))(x),
                             scale * 2.75 * e, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(aggregators.mda(1))(x),
                             scale * 2.75 * e, rtol=1e-6)


def test_one_huge_row_leaves_krum_and_mda_telling_the_others_apart():
  """Rows (1e15, 0), (1, 0), (1.1, 0.1), (0.9, -0.1), (1, 0.2), (1e35,
  1e35): the four rows near (1, 0) have, by hand, squared distances 0.02
  (rows 1-2, 1-3, 2-4), 0.04 (1-4), 0.08 (2-3), 0.10 (3-4), so Krum (f = 1:
  3 nearest) scores them 0.08, 0.12, 0.20, 0.16 and picks (1, 0), and MDA
  (f = 2) keeps exactly those four (squared diameter 0.1), mean (1, 0.05).
  The rows are scaled by one power of two before the distances are taken,
  chosen from the median row, not the largest: brought to a 1e35 row, the
  others' squares are below float32's smallest normal number, every
  distance among rows 0-4 is 0 and Krum picks row 0's 1e15 (seen by hand),
  and MDA the first subset (2.5e14). Seen to fail for MDA also with no
  scaling (the 1e35 row's squared distances inf - inf = NaN, and argmin
  took a NaN diameter: 2.5e34)."""
  x = jnp.array([[1e15, 0.0], [1.0, 0.0], [1.1, 0.1], [0.9, -0.1],
                 [1.0, 0.2], [1e35, 1e35]], jnp.float32)
  np.testing.assert_allclose(jax.jit(aggregators.krum(1))(x), [1.0, 0.0],
                             rtol=1e-6)
  np.testing.assert_allclose(jax.jit(aggregators.mda(2))(x), [1.0, 0.05],
                             rtol=1e-6)


def test_cap_duplicates_tells_small_rows_apart_beside_a_huge_or_a_unit_row():
  """Rows (1e35, 1e35), (1, 0), (0, 1), (1, 0), (-1, 0): only row 3 copies
  an earlier row (row 1), so the weights are 1, 1, 1, 0, 1; and rows (1,
  0), (1e-30, 0), (0, 1e-30), (-1e-30, 0), (1e-30, 0): the tiny rows are
  apart by sqrt(2) or 2 times their norm, only row 4 copies row 1: 1, 1,
  1, 1, 0. Each pair is compared at its own power-of-two scale. Seen to
  fail when all rows shared the scale of the largest entry (e32cba2's
  `_scaled_to_unit_peak`): beside 1e35 the unit rows' squares and beside
  1 the 1e-30 rows' squares flushed to 0, every distance among them and
  every tolerance 0, so each tied with the first of them: 1, 1, 0, 0, 0
  both times."""
  pre = jax.jit(aggregators.cap_duplicates())
  x = jnp.array([[1e35, 1e35], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0],
                 [-1.0, 0.0]])
  np.testing.assert_array_equal(pre(x)[1], [1.0, 1.0, 1.0, 0.0, 1.0])
  y = jnp.array([[1.0, 0.0], [1e-30, 0.0], [0.0, 1e-30], [-1e-30, 0.0],
                 [1e-30, 0.0]])
  np.testing.assert_array_equal(pre(y)[1], [1.0, 1.0, 1.0, 1.0, 0.0])


def test_arc_counts_a_present_zero_row_among_the_norms():
  """ARC with f = 1 of 4 rows (0, 0), (3, 4), (6, 8), (12, 5): k = 2 * 1 *
  3 // 4 = 1 row is clipped, to the third smallest norm of 0, 5, 10, 13,
  so (12, 5) becomes (12, 5) * 10 / 13 = (9.2308, 3.8462) by hand and the
  rest stay. Seen to fail when the zero row's norm is NaN (session 16's
  new-code survivor aggregators #38 at d00f29e, `peaks > 0` -> `>=` in
  `base._unit_rows`: rsqrt(0) = inf and 0 * inf = NaN, the NaN sorts last,
  the threshold is 13 and nothing is clipped); every other test's zero
  rows were absent, outside the sort."""
  x = jnp.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [12.0, 5.0]])
  out, w = jax.jit(aggregators.arc(1))(x)
  np.testing.assert_allclose(
      out, [[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [120 / 13, 50 / 13]],
      rtol=1e-6)
  np.testing.assert_array_equal(w, np.ones(4))


def test_row_norms_take_the_square_root_down_to_the_smallest_normal_square():
  """Rows (2^-63, 0) and (0, -2^-63) have squared norm 2^-126, float32's
  smallest normal number: `sq >= tiny` holds, the norm is sqrt(2^-126) =
  2^-63 exactly; (2^-64, 2^-64), whose squared norm 2^-127 is subnormal,
  takes the scale-safe path, 2^-63.5. Seen to fail when the boundary is
  excluded (session 16's new-code survivor aggregators #49 at d00f29e,
  `sq >= tiny` -> `sq > tiny` in `base._squares_usable`: the scale-safe
  path's m * ||x / m|| with m's rsqrt rounded gives 2^-63 (1 - 2^-24),
  1.0842021e-19 for 1.0842022e-19)."""
  x = jnp.array([[2.0 ** -63, 0.0], [0.0, -2.0 ** -63],
                 [2.0 ** -64, 2.0 ** -64]])
  norms = np.asarray(jax.jit(base.row_norms)(x))
  np.testing.assert_array_equal(norms[:2], np.float32(2.0 ** -63))
  np.testing.assert_allclose(norms[2], 2.0 ** -63.5, rtol=1e-6)


def test_clipping_brings_an_overflowing_axis_row_exactly_to_the_threshold():
  """`clipping(1)` on (2^65, 0), (0, -3e19) and (2^127, 0), whose squared
  norms overflow float32: each is brought to norm 1 along its axis, exactly
  (1, 0), (0, -1), (1, 0). On the scale-safe path the row's peak times
  rsqrt(m)^2 rounds to r = 1 - 2^-24 (CPU), the unit norm is that r, and
  the factor 1 / r makes up for it: r * fl(1 / r) rounds to 1. Seen to
  fail when unit norms up to 1 are replaced by 1 (session 16's new-code
  survivor aggregators #65 at d00f29e, `units > 0` -> `units > 1` in
  `base.clip_rows`' guard: 0.99999994); the overflow tests' rows had unit
  norms above 1 or compared with rtol 1e-6."""
  x = jnp.array([[2.0 ** 65, 0.0], [0.0, -3e19], [2.0 ** 127, 0.0]])
  out, _ = jax.jit(aggregators.clipping(1.0))(x)
  np.testing.assert_array_equal(out, [[1.0, 0.0], [0.0, -1.0], [1.0, 0.0]])


def test_power_of_two_is_exact_in_range_zero_below_and_the_largest_above():
  """`base.power_of_two(k, dtype)` (the scaling of `cap_duplicates` and of
  the distance-based rules) for every integer k from 3 below the dtype's
  normal range to 3 above it, in float16, bfloat16, float32 and float64
  (under `jax.enable_x64`), against NumPy: exactly 2^k for minexp <= k <
  maxexp, 0 below, 2^(maxexp - 1) above. `times_power_of_two` applies
  2^k as two such factors: rows (3e38, -1e30), (1e31, 0) times 2^-128 (not
  a normal float32 itself) and, per row, rows (3e-37, ...) times 2^100 are
  NumPy's `ldexp`; a float16 leaf (1024) times 2^-41 is 0 (both factors
  below float16's range; the exact 2^-31 rounds to 0) and a zero float16
  leaf times 2^31 stays 0 (the factor 2^16 is capped at 2^15, not inf:
  0 x inf is NaN). Kills session 17's new-code survivors `aggregators` #299
  and #301 (the dtype table without float16 / float64: KeyError), #305 and
  #306 (`maxexp - 1` -> `+ 1` / `- 2`: 4 and 1/2 times 2^k), #307 (lower
  clip 0 -> 1: 2^minexp below the range), #308 and #310 (upper clip past
  `2 maxexp - 2`: inf and beyond above the range) and #311 (upper clip
  `2 maxexp - 3`: 2^(maxexp - 2) at the top), numbered in `pre.py`'s
  `_power_of_two` at d00f29e (moved here by 2305c0b); each seen to fail
  with the mutant applied by hand to `base.power_of_two`."""
  from prfl_jax.aggregators import base

  def check_dtype(dtype):
    info = jnp.finfo(dtype)
    k = np.arange(info.minexp - 3, info.maxexp + 3)
    got = jax.jit(base.power_of_two, static_argnums=1)(jnp.asarray(k), dtype)
    want = np.where(k < info.minexp, 0.0,
                    np.ldexp(1.0, np.minimum(k, info.maxexp - 1)))
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float64), want)

  for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
    check_dtype(dtype)
  with jax.enable_x64(True):
    check_dtype(jnp.float64)

  times = jax.jit(base.times_power_of_two)
  rows = np.array([[3e38, -1e30], [1e31, 0.0]], np.float32)
  np.testing.assert_array_equal(times(jnp.asarray(rows), -128),
                                np.ldexp(rows.astype(np.float64), -128))
  rows = np.array([[3e38, -1e30], [3e-37, 1e-37]], np.float32)
  np.testing.assert_array_equal(
      times(jnp.asarray(rows), jnp.array([-128, 100])),
      np.ldexp(rows.astype(np.float64), [[-128], [100]]))
  out = times({"a": jnp.array([[2.0**40]]),
               "h": jnp.array([[1024.0]], jnp.float16)}, -41)
  assert float(out["a"][0, 0]) == 0.5 and float(out["h"][0, 0]) == 0.0
  out = times({"h": jnp.zeros((1, 1), jnp.float16)}, 31)
  np.testing.assert_array_equal(np.asarray(out["h"], np.float32), [[0.0]])


@pytest.mark.parametrize("scale", [1e19, 1e-22])
def test_weiszfeld_and_centered_clipping_distances_survive_overflow_and_underflow(
    scale):
  """Rows (0, 0), (1, 0), (0, 1), (4, 4), (3, 0) times c: the geometric
  median (10 Weiszfeld steps, eps 1e-30) and centered clipping (radius c,
  3 steps from the median (1, 0) c) are c times the float64 NumPy
  references at c = 1, (0.9622, 0.2690) and (0.9343, 0.4730). At c = 1e19
  the squared distances overflow float32 and at c = 1e-22 they underflow
  to 0, yet the distances are right. Seen to fail with `sqrt` of the
  squared distances (main before this test: 1e19 gave (0.2315, 0.2264) c
  and (0.3894, 0.2974) c, the overflowing rows' weights and clip factors
  0; 1e-22 gave the mean, (1.6, 1) c, every distance 0)."""
  x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [4.0, 4.0], [3.0, 0.0]])
  w = np.ones(5)
  xc = jnp.asarray(scale * x, jnp.float32)
  np.testing.assert_allclose(
      jax.jit(aggregators.geometric_median(10, eps=1e-30))(xc),
      scale * np_geometric_median(x, w, 10, 1e-30), rtol=1e-5)
  np.testing.assert_allclose(
      jax.jit(aggregators.centered_clipping(scale, 3))(xc),
      scale * np_centered_clipping(x, w, 1.0, 3, np.median(x, axis=0)),
      rtol=1e-5)


@pytest.mark.parametrize("scale", [1e19, 1e-22])
def test_caf_dnc_and_smea_filter_rows_whose_squares_overflow_or_underflow(
    scale):
  """Rows (9, 9), (0, 0), (1, 0), (0, 1), (1, 1) times c, f = 1: CAF, DnC
  and SMEA are c times the float64 NumPy references at c = 1
  (`tests/reference_robust.py`; DnC and SMEA drop (9, 9): (0.5, 0.5)). At
  c = 1e19 the Gram matrix overflows float32 and at c = 1e-22 it underflows
  to 0; the rules now take it on the rows times a power of two. Seen to
  fail before (main at 7b476b9: CAF (2.2, 2.2) c at both scales, the mean;
  DnC (2.5, 2.5) c, rows 0-3 kept by index; SMEA passed there, scaled from
  the median row since 7b476b9)."""
  from tests import reference_robust as ref
  x = np.array([[9.0, 9.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
  w = np.ones(5)
  xc = jnp.asarray(scale * x, jnp.float32)
  for rule, want in ((aggregators.caf(1), ref.caf(x, w, 1)),
                     (aggregators.dnc(1), ref.dnc(x, w, 1)),
                     (aggregators.smea(1), ref.smea(x, w, 1))):
    np.testing.assert_allclose(jax.jit(rule)(xc), scale * want, rtol=1e-5)


def test_caf_dnc_and_smea_drop_one_row_whose_gram_entries_overflow():
  """Rows (1e35, 1e35), (0, 0), (1, 0), (0, 1), (1, 1), f = 1: each rule
  drops the first row and averages the others, (0.5, 0.5) (by hand: the
  only subset of 4 without it is the unit square; for CAF and DnC that row
  carries all the variance). Their Gram matrices are taken on the rows
  times the power of two that brings the largest entry to [0.5, 1), so no
  entry is inf. Seen to fail with inf entries (main at 1722bff: CAF's and
  DnC's unscaled Gram, SMEA's scaled from the median row, every
  eigendecomposition NaN: (2e34, 2e34), (2.5e34, 2.5e34) twice)."""
  x = jnp.array([[1e35, 1e35], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0],
                 [1.0, 1.0]])
  for rule in (aggregators.caf(1), aggregators.dnc(1), aggregators.smea(1)):
    np.testing.assert_allclose(jax.jit(rule)(x), [0.5, 0.5], rtol=1e-6)


def test_times_power_of_two_splits_k_evenly_across_float16s_narrow_range():
  """float16's normal exponents run from -14 to 15, so 2^+-28 exists only as
  two factors 2^+-14: 2^14 times 2^-28 is 2^-14 and 2^-14 times 2^28 is
  2^14, exactly. Seen to fail by hand with `low = k // 3` (session 17's
  new-code mutant aggregators #49 at e75e650): 2^-18 is below float16's
  normal range (taken as 0) and 2^19 above it (taken as 2^15), giving 0
  and 2^10."""
  times = jax.jit(base.times_power_of_two)
  up = times(jnp.array([[2.0**-14]], jnp.float16), 28)
  down = times(jnp.array([[2.0**14]], jnp.float16), -28)
  assert up.dtype == down.dtype == jnp.float16
  assert float(up[0, 0]) == 2.0**14 and float(down[0, 0]) == 2.0**-14


def test_peak_exponents_of_one_row_and_of_no_rows():
  """One row (8, -3): its largest |entry| 8 is 0.5 x 2^4, so both exponents
  are -4 by hand; no leaves: `row_peaks` is empty and the exponents 0.
  Seen to fail by hand with session 17's new-code mutants aggregators #65
  (`peaks.shape[0] == 1` in `median_peak_exponent`: 0 for one row) and #61
  (`row_peaks` of no leaves `jnp.zeros((1,))`: shape (1,)) at e75e650."""
  one = jnp.array([[8.0, -3.0]])
  assert int(jax.jit(base.median_peak_exponent)(one)) == -4
  assert int(jax.jit(base.max_peak_exponent)(one)) == -4
  assert base.row_peaks({}).shape == (0,)
  assert int(base.median_peak_exponent({})) == 0
  assert int(base.max_peak_exponent({})) == 0


def test_median_peak_exponent_leaves_zero_rows_out():
  """Rows (0, 0), (0, 0), (8, 1): zero rows (absent clients) are left out,
  so the median peak is 8 = 0.5 x 2^4 and the exponent -4 by hand. Seen to
  fail by hand with session 17's new-code mutant aggregators #67 (`peaks >=
  0`: the median peak 0, exponent 0) at 52c13e9."""
  rows = jnp.array([[0.0, 0.0], [0.0, 0.0], [8.0, 1.0]])
  assert int(jax.jit(base.median_peak_exponent)(rows)) == -4
