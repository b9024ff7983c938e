"""Tests of `cluster_and_assign(..., balls="assigned", members=...)`."""

import jax.numpy as jnp
import numpy as np
import pytest

import prfl_jax as prfl
from tests.tolerances import LIBRARY

POINTS = jnp.array([[0.0], [1.0], [10.0], [11.0], [12.0]])
START = jnp.array([[0.0], [10.0]])


@pytest.mark.parametrize("method", ["direct", "gram"])
def test_assigned_balls_by_hand(method):
  """Radius 100 holds every point. With every ball over all points
  (Algorithm 2) both centres move to the mean 6.8 and coincide; with each
  ball over the points nearest to its centre they move to 0.5 and 11.

  Seen to fail when the assigned balls' average divided by N instead of
  the centre's own weight (centres 0.2 and 6.6).
  """
  centers, assignment, _, info = prfl.clustering.cluster_and_assign_with_info(
      POINTS, START, radius=100.0, num_iters=1, method=method,
      balls="assigned")
  np.testing.assert_allclose(centers[:, 0], [0.5, 11.0], **LIBRARY)
  np.testing.assert_array_equal(assignment, [0, 0, 1, 1, 1])
  np.testing.assert_allclose(info.coefs, [[0.5, 0.5, 0, 0, 0],
                                          [0, 0, 1 / 3, 1 / 3, 1 / 3]],
                             **LIBRARY)
  centers, assignment, _ = prfl.cluster_and_assign(
      POINTS, START, radius=100.0, num_iters=1, method=method, balls="all")
  np.testing.assert_allclose(centers[:, 0], [6.8, 6.8], **LIBRARY)
  np.testing.assert_array_equal(assignment, [0] * 5)


@pytest.mark.parametrize("method", ["direct", "gram"])
def test_members_fixed_during_the_steps(method):
  """Members [1, 0, 0, 0, 0] (point 0 with centre 1, the rest with centre
  0) are kept for all steps: centre 0 averages 1, 10, 11, 12 -> 8.5 and
  centre 1 keeps point 0 -> 0, and only then is every point assigned to its
  nearest centre (0 and 1 -> centre 1). A negative member takes its nearest
  centre at every step (as without `members`).

  Seen to fail when `members` was ignored.
  """
  members = jnp.array([1, 0, 0, 0, 0])
  centers, assignment, _, info = prfl.clustering.cluster_and_assign_with_info(
      POINTS, START, radius=100.0, num_iters=3, method=method,
      balls="assigned", members=members)
  np.testing.assert_allclose(centers[:, 0], [8.5, 0.0], **LIBRARY)
  np.testing.assert_array_equal(assignment, [1, 1, 0, 0, 0])
  np.testing.assert_allclose(info.coefs[1], [1, 0, 0, 0, 0], **LIBRARY)
  free = prfl.cluster_and_assign(
      POINTS, START, radius=100.0, num_iters=3, method=method,
      balls="assigned", members=-jnp.ones(5, jnp.int32))
  np.testing.assert_allclose(free[0][:, 0], [0.5, 11.0], **LIBRARY)


@pytest.mark.parametrize("method", ["direct", "gram"])
def test_equal_starts_with_members_each_follow_their_own(method):
  """Two centres that start equal at 0, members [0, 0, 1, 1, 1]: centre 0
  averages 0 and 1 -> 0.5, centre 1 averages 10, 11, 12 -> 11, and points
  2-4 are assigned to centre 1, as the docstring says (each centre keeps
  its members). Failed before (session 9, found by a probe of
  Momentum-Clustering started from all-zero centres): a repeated start
  followed the first one's iterates, so both centres ended at 0.5 and
  every point went to centre 0."""
  members = jnp.array([0, 0, 1, 1, 1])
  centers, assignment, _ = prfl.cluster_and_assign(
      POINTS, jnp.zeros((2, 1)), radius=100.0, num_iters=2, method=method,
      balls="assigned", members=members)
  np.testing.assert_allclose(centers[:, 0], [0.5, 11.0], **LIBRARY)
  np.testing.assert_array_equal(assignment, [0, 0, 1, 1, 1])
  # Without members of its own, a repeated start follows the first and
  # gets no point (the seeding round: every member -1).
  centers, assignment, _ = prfl.cluster_and_assign(
      POINTS, jnp.zeros((2, 1)), radius=100.0, num_iters=2, method=method,
      balls="assigned", members=jnp.array([0, 0, -1, -1, -1]))
  np.testing.assert_allclose(centers[:, 0], centers[0, 0], **LIBRARY)
  np.testing.assert_array_equal(assignment, [0] * 5)


def test_quantile_radius_over_own_members():
  """q = 0.5 over centre 1's members {10, 11, 12} (distances 0, 1, 2 from
  10): radius 1, so 10 and 11 are inside and centre 1 moves to
  (10 + 11 + 10) / 3; over all five points the radius would be 1 as well
  but the average would run over N = 5.
  """
  centers, _, _ = prfl.cluster_and_assign(
      POINTS, START, radius=prfl.quantile_radius(0.5), num_iters=1,
      method="gram", balls="assigned")
  np.testing.assert_allclose(centers[1, 0], 31 / 3, **LIBRARY)


def test_assigned_gram_matches_direct_on_random_points():
  rng = np.random.default_rng(0)
  pts = jnp.asarray(rng.normal(size=(40, 3)) + 4 * rng.integers(0, 3, (40, 1)))
  start = pts[jnp.array([0, 1, 2])]
  out = [prfl.clustering.cluster_and_assign_with_info(
      pts, start, radius=prfl.quantile_radius(0.6), num_iters=5, method=m,
      balls="assigned") for m in ("direct", "gram")]
  np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(out[0][1], out[1][1])
  np.testing.assert_allclose(out[0][3].coefs, out[1][3].coefs, atol=1e-5)


def test_all_balls_info_coefs_rebuild_the_centres():
  """`info.coefs` of Algorithm 2's direct kernel: v = (1 - sum a) v0 + a z."""
  rng = np.random.default_rng(1)
  pts = jnp.asarray(rng.normal(size=(12, 2)))
  start = pts[jnp.array([0, 5])]
  centers, _, _, info = prfl.clustering.cluster_and_assign_with_info(
      pts, start, radius=prfl.quantile_radius(0.4), num_iters=4)
  rebuilt = (1 - info.coefs.sum(1, keepdims=True)) * start + info.coefs @ pts
  np.testing.assert_allclose(rebuilt, centers, **LIBRARY)


@pytest.mark.parametrize("kwargs,match", [
    ({"balls": "nearest"}, "balls"),
    ({"members": jnp.zeros(5, jnp.int32)}, "members.*assigned"),
    ({"balls": "assigned", "members": jnp.zeros(4, jnp.int32)}, r"\[5\]"),
])
def test_bad_balls_and_members(kwargs, match):
  with pytest.raises(ValueError, match=match):
    prfl.cluster_and_assign(POINTS, START, radius=1.0, **kwargs)


@pytest.mark.parametrize("method", ["direct", "gram"])
def test_sticky_points_stay_inside_their_ball(method):
  """Members {0, 1, 7} -> centre 0 at 8/3 and {10, 11, 12} -> centre 1 at 11.
  Point 7 is nearer to centre 1 (4 < 13/3) but inside centre 0's ball
  (radius 100): sticky keeps it with centre 0, nearest moves it. With radius
  4.2 (< 13/3) it is outside and moves either way.

  Seen to fail when `stay` ignored the radius (always kept the members).
  """
  pts = jnp.array([[0.0], [1.0], [7.0], [10.0], [11.0], [12.0]])
  members = jnp.array([0, 0, 0, 1, 1, 1])
  for radius, sticky, expected in ((100.0, False, 1), (100.0, True, 0),
                                   (4.2, True, 1)):
    _, assignment, _ = prfl.cluster_and_assign(
        pts, START, radius=radius, num_iters=1, method=method,
        balls="assigned", members=members, sticky=sticky)
    assert int(assignment[2]) == expected, (radius, sticky)
    np.testing.assert_array_equal(np.delete(np.asarray(assignment), 2),
                                  [0, 0, 1, 1, 1])


def test_sticky_needs_members():
  with pytest.raises(ValueError, match="sticky"):
    prfl.cluster_and_assign(POINTS, START, radius=1.0, balls="assigned",
                            sticky=True)
