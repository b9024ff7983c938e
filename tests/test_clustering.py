"""Tests of Threshold-Clustering (Algorithm 2) against a NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import prfl_jax as prfl
from tests import reference
from tests import tolerances

METHODS = ["direct", "gram"]


def _data(seed, n=12, k=3, p=5):
  rng = np.random.default_rng(seed)
  means = rng.normal(scale=4.0, size=(k, p))
  points = means[rng.integers(0, k, n)] + rng.normal(size=(n, p))
  init = points[rng.choice(n, k, replace=False)] + 0.3
  return points.astype(np.float32), init.astype(np.float32)


@pytest.mark.parametrize("method", METHODS)
def test_hand_computed_two_steps(method):
  # Points 0, 1, 10; centre 0; radius 2.
  # Step 1: 0 and 1 inside -> v = (0 + 1 + 0) / 3 = 1/3.
  # Step 2: distances 1/3, 2/3, 29/3 -> v = (0 + 1 + 1/3) / 3 = 4/9.
  z = jnp.array([[0.0], [1.0], [10.0]])
  out = prfl.threshold_clustering(z, jnp.zeros((1, 1)), radius=2.0,
                                  num_iters=2, method=method)
  np.testing.assert_allclose(out, [[4.0 / 9.0]], rtol=1e-6)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("radius", [1.5, "per_centre", "quantile"])
def test_matches_numpy_reference(method, radius):
  for seed in range(3):
    points, init = _data(seed)
    if radius == "quantile":
      rule, ref_kw = prfl.quantile_radius(0.3), {"radius": None,
                                                 "quantile": 0.3}
    elif radius == "per_centre":
      r = np.array([0.5, 2.0, 4.0], np.float32)
      rule, ref_kw = jnp.asarray(r), {"radius": r}
    else:
      rule, ref_kw = radius, {"radius": radius}
    out = prfl.threshold_clustering(jnp.asarray(points), jnp.asarray(init),
                                    radius=rule, num_iters=7, method=method)
    ref = reference.threshold_clustering(points, init, num_iters=7, **ref_kw)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_weights_and_absent_clients(method):
  points, init = _data(4)
  w = np.array([1, 0, 2, 1, 0, 1, 1, 3, 0, 1, 1, 1], np.float32)
  for rule, kw in [(2.0, {"radius": 2.0}),
                   (prfl.quantile_radius(0.5), {"radius": None,
                                                "quantile": 0.5})]:
    out = prfl.threshold_clustering(points, init, radius=rule, num_iters=5,
                                    weights=jnp.asarray(w), method=method)
    ref = reference.threshold_clustering(points, init, num_iters=5,
                                         weights=w, **kw)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
  # An absent client, wherever it is, never moves a centre.
  moved = points.copy()
  moved[w == 0] = 1e3
  a = prfl.threshold_clustering(points, init, radius=3.0, weights=w,
                                method=method)
  b = prfl.threshold_clustering(moved, init, radius=3.0, weights=w,
                                method=method)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_pytree_points_match_flat(method):
  points, init = _data(5, p=6)
  as_tree = lambda x: {"w": jnp.asarray(x[:, :4]).reshape(-1, 2, 2),
                       "b": jnp.asarray(x[:, 4:])}
  out = prfl.threshold_clustering(as_tree(points), as_tree(init), radius=2.5,
                                  num_iters=4, method=method)
  ref = reference.threshold_clustering(points, init, 2.5, 4)
  flat = np.concatenate([np.asarray(out["w"]).reshape(-1, 4), out["b"]], 1)
  np.testing.assert_allclose(flat, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e30])
def test_non_finite_points_are_outside_every_ball(method, bad):
  points, init = _data(6)
  points[2, 1] = bad
  points[7] = bad
  for rule, kw in [(np.inf, {"radius": np.inf}),
                   (prfl.quantile_radius(0.9), {"radius": None,
                                                "quantile": 0.9})]:
    out = prfl.threshold_clustering(points, init, radius=rule, num_iters=6,
                                    method=method)
    assert np.all(np.isfinite(out))
    if bad != 1e30:  # 1e30 is finite but its distance overflows float32.
      ref = reference.threshold_clustering(points, init, num_iters=6, **kw)
      np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_jit_and_vmap(method):
  batch = [_data(s) for s in range(4)]
  pts = jnp.stack([b[0] for b in batch])
  ini = jnp.stack([b[1] for b in batch])
  radii = jnp.array([1.0, 2.0, 3.0, 4.0])
  fn = jax.jit(jax.vmap(lambda p, i, r: prfl.threshold_clustering(
      p, i, radius=r, num_iters=5, method=method)))
  out = fn(pts, ini, radii)
  for s in range(4):
    ref = reference.threshold_clustering(batch[s][0], batch[s][1],
                                         float(radii[s]), 5)
    np.testing.assert_allclose(out[s], ref, rtol=1e-4, atol=1e-4)
  # A traced quantile (e.g. in a vmapped sweep) works too.
  qs = jnp.array([0.1, 0.5])
  out_q = jax.jit(jax.vmap(lambda q: prfl.threshold_clustering(
      pts[0], ini[0], radius=prfl.quantile_radius(q), method=method)))(qs)
  for j, q in enumerate([0.1, 0.5]):
    ref = reference.threshold_clustering(batch[0][0], batch[0][1], None, 10,
                                         quantile=q)
    np.testing.assert_allclose(out_q[j], ref, rtol=1e-4, atol=1e-4)


def test_quantile_matches_jnp_quantile():
  rng = np.random.default_rng(0)
  for _ in range(20):
    v = rng.normal(size=9).astype(np.float32)
    present = rng.random(9) < 0.7
    present[0] = True
    q = float(rng.random())
    out = prfl.masked_quantile(jnp.asarray(v), jnp.asarray(present), q)
    np.testing.assert_allclose(out, np.quantile(v[present], q), rtol=1e-5)
  assert prfl.masked_quantile(jnp.ones(3), jnp.zeros(3, bool), 0.5) == 0.0


@pytest.mark.parametrize("n, method", [
    (7, "auto"), (600, "auto"),  # Rank counting and sorting paths.
    (7, "sort"), (600, "rank"),  # Each path forced at the other size.
])
def test_quantile_with_ties_nan_and_inf(n, method):
  rng = np.random.default_rng(n)
  for _ in range(10):
    v = rng.normal(size=n).astype(np.float32)
    v[: n // 3] = v[0]  # Ties.
    v[rng.random(n) < 0.15] = np.nan
    v[rng.random(n) < 0.1] = np.inf
    present = rng.random(n) < 0.8
    for q in (0.0, 0.2, 0.5, 0.93, 1.0):
      out = prfl.masked_quantile(jnp.asarray(v), jnp.asarray(present), q,
                                 method=method)
      ref = reference.quantile_linear(
          np.where(np.isnan(v), np.inf, v)[present], q)
      np.testing.assert_allclose(out, ref, rtol=1e-6)
  with pytest.raises(ValueError, match="`method`"):
    prfl.masked_quantile(jnp.ones(3), jnp.ones(3, bool), 0.5, method="heap")


def test_assign_nearest_ties_and_nan():
  z = jnp.array([[0.0], [0.9], [2.0], [jnp.nan], [1.0]])
  c = jnp.array([[0.0], [2.0]])
  np.testing.assert_array_equal(prfl.assign(z, c), [0, 0, 1, 0, 0])


def test_bad_arguments_raise_before_compiling():
  z, v = jnp.zeros((4, 2)), jnp.zeros((2, 2))
  with pytest.raises(ValueError, match="K must be <= N"):
    prfl.threshold_clustering(z, jnp.zeros((5, 2)), radius=1.0)
  with pytest.raises(ValueError, match="init_centers"):
    prfl.threshold_clustering(z, jnp.zeros((2, 3)), radius=1.0)
  with pytest.raises(ValueError, match="different leading axes"):
    prfl.threshold_clustering({"a": z, "b": jnp.zeros((3, 1))},
                              {"a": v, "b": jnp.zeros((2, 1))}, radius=1.0)
  with pytest.raises(ValueError, match="q"):
    prfl.quantile_radius(1.5)
  with pytest.raises(ValueError, match="q"):
    prfl.quantile_radius(-0.1)
  with pytest.raises(ValueError, match="num_iters"):
    prfl.threshold_clustering(z, v, radius=1.0, num_iters=0)
  with pytest.raises(ValueError, match="radius"):
    prfl.threshold_clustering(z, v, radius=-1.0)
  with pytest.raises(ValueError, match="radius"):
    prfl.threshold_clustering(z, v, radius=jnp.ones(3))
  with pytest.raises(ValueError, match="weights"):
    prfl.threshold_clustering(z, v, radius=1.0, weights=jnp.ones(3))
  with pytest.raises(ValueError, match="method"):
    prfl.threshold_clustering(z, v, radius=1.0, method="fast")


# Inputs that used to slip through (issue 11). Each test below failed before
# the fix that its docstring names.


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_bad_weights_are_rejected(method, bad):
  """Failed before: -1 gave a centre outside the points' hull, NaN a NaN
  centre, both silently."""
  points, init = _data(1)
  w = np.ones(12, np.float32)
  w[3] = bad
  with pytest.raises(ValueError, match="weights"):
    prfl.threshold_clustering(points, init, radius=2.0, weights=w,
                              method=method)
  with pytest.raises(TypeError, match="weights"):
    prfl.threshold_clustering(points, init, radius=2.0,
                              weights=np.array(["1"] * 12), method=method)


@pytest.mark.parametrize("method", METHODS)
def test_bad_weights_under_jit_count_as_absent(method):
  """Failed before: under jit a NaN weight made every centre NaN and a
  negative one pushed centres out of the hull. Now they weigh 0."""
  points, init = _data(2)
  w = np.ones(12, np.float32)
  w[[1, 4, 9]] = [-2.0, np.nan, np.inf]
  out = jax.jit(lambda w: prfl.threshold_clustering(
      points, init, radius=prfl.quantile_radius(0.5), num_iters=5, weights=w,
      method=method))(jnp.asarray(w))
  w0 = np.where(np.isfinite(w) & (w > 0), w, 0.0)
  ref = reference.threshold_clustering(points, init, None, 5, weights=w0,
                                       quantile=0.5)
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_integer_points_give_float_centres(method):
  """Failed before for `direct`: integer points gave all-zero centres (the
  update was rounded to the points' integer dtype)."""
  z = np.array([[0, 0], [1, 2], [2, 1], [10, 10], [11, 9]], np.int32)
  init = np.array([[0, 0], [10, 10]], np.int32)
  out = prfl.threshold_clustering(z, init, radius=3.0, num_iters=4,
                                  method=method)
  assert jnp.issubdtype(out.dtype, jnp.floating)
  ref = reference.threshold_clustering(z, init, 3.0, 4)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
  as_float = prfl.threshold_clustering(z.astype(np.float32),
                                       init.astype(np.float32), radius=3.0,
                                       num_iters=4, method=method)
  np.testing.assert_array_equal(out, as_float)


@pytest.mark.parametrize("rule", ["inf", "quantile"])
def test_overflowing_point_is_outside_in_both_kernels(rule):
  """Failed before: with radius=inf a 1e20 row was inside for `direct`
  (centre ~2.5e19) and outside for `gram`. Both now use `tree.usable`: a
  point whose squared norm overflows float32 is treated like a NaN row."""
  points, init = _data(3)
  big = points.copy()
  big[5] = 1e20
  nan = points.copy()
  nan[5] = np.nan
  radius = np.inf if rule == "inf" else prfl.quantile_radius(0.9)
  ref_kw = ({"radius": np.inf} if rule == "inf" else
            {"radius": None, "quantile": 0.9})
  ref = reference.threshold_clustering(nan, init, num_iters=6, **ref_kw)
  outs = {}
  for method in METHODS:
    outs[method] = prfl.threshold_clustering(big, init, radius=radius,
                                             num_iters=6, method=method)
    np.testing.assert_allclose(outs[method], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(
        outs[method], prfl.threshold_clustering(nan, init, radius=radius,
                                                num_iters=6, method=method))
  np.testing.assert_allclose(outs["direct"], outs["gram"], rtol=1e-5,
                             atol=1e-5)


def test_usable_is_one_definition():
  """`tree.usable` (used by both kernels and farthest-first): the last row
  has finite squares (2.25e38) whose sum overflows."""
  z = np.array([[1.0, 2.0], [np.nan, 0.0], [np.inf, 0.0], [1e20, 0.0],
                [1e18, 0.0], [-1.5e19, 1.5e19]], np.float32)
  np.testing.assert_array_equal(prfl.tree.usable(z),
                                [True, False, False, False, True, False])


@pytest.mark.parametrize("method", METHODS)
def test_empty_inputs_raise_value_error(method):
  """Failed before: N = 0 raised ZeroDivisionError."""
  with pytest.raises(ValueError, match="N=0"):
    prfl.threshold_clustering(jnp.zeros((0, 2)), jnp.zeros((0, 2)),
                              radius=1.0, method=method)
  with pytest.raises(ValueError, match="K=0"):
    prfl.threshold_clustering(jnp.zeros((3, 2)), jnp.zeros((0, 2)),
                              radius=1.0, method=method)


@pytest.mark.parametrize("method", METHODS)
def test_radius_rule_of_wrong_shape_is_named(method):
  """Failed before: a raw broadcasting / scan-carry TypeError from inside the
  loop, not naming the rule."""
  def per_point(distances, present):
    del present  # Unused.
    return distances  # [N], not one radius.
  z, v = jnp.zeros((4, 2)), jnp.zeros((2, 2))
  with pytest.raises(ValueError, match="radius rule .*per_point"):
    prfl.threshold_clustering(z, v, radius=per_point, method=method)
  def broken(distances, present):
    del present  # Unused.
    return jnp.sum(distances.reshape(3, -1))  # Fails when traced for N=4.
  with pytest.raises(TypeError, match="radius rule .*broken"):
    prfl.threshold_clustering(z, v, radius=broken, method=method)
  with pytest.raises(TypeError, match="radius"):
    prfl.threshold_clustering(z, v, radius="wide", method=method)
  # A correct custom rule is accepted.
  out = prfl.threshold_clustering(z, v, radius=lambda d, p: jnp.max(d),
                                  method=method)
  np.testing.assert_array_equal(out, np.zeros((2, 2)))


@pytest.mark.parametrize("k", [0, -1, 2.0, 2.5, True, 6])
def test_farthest_first_checks_num_centers(k):
  """Failed before: 0 -> IndexError, -1 / 2.5 -> TypeError, 6 > N silently
  returned repeated indices."""
  with pytest.raises(ValueError, match="num_centers"):
    prfl.farthest_first(jnp.arange(5.0)[:, None], k, jax.random.key(0))


def test_farthest_first_skips_overflowing_points_and_checks_separation():
  z = jnp.array([[0.0], [1.0], [1e20], [5.0]])
  for seed in range(5):
    index = prfl.farthest_first(z, 3, jax.random.key(seed))
    assert 2 not in np.asarray(index).tolist()
  with pytest.raises(ValueError, match="separation"):
    prfl.farthest_first(z, 2, jax.random.key(0), separation=-1.0)


@pytest.mark.parametrize("q, error", [
    ("0.5", TypeError), (None, TypeError), (True, TypeError),
    (0, ValueError), (0.0, ValueError), (1.01, ValueError),
    (np.nan, ValueError), ([0.2, 0.5], ValueError)])
def test_quantile_radius_checks_q(q, error):
  """Failed before: strings / None gave numpy TypeErrors not naming `q`, and
  q = 0 was accepted though (0, 1] is documented."""
  with pytest.raises(error, match="`q`"):
    prfl.quantile_radius(q)
  assert prfl.quantile_radius(1).q == 1


# Numerics on accelerators (issue 11): distances, Gram matrices and centre
# updates run at HIGHEST whatever `jax_default_matmul_precision` says.


def _weighted_with_bad_rows(seed=7, n=40, k=4, p=300):
  rng = np.random.default_rng(seed)
  means = rng.normal(scale=3.0, size=(k, p))
  points = (means[rng.integers(0, k, n)] + rng.normal(size=(n, p)) +
            100.0).astype(np.float32)  # An offset makes cancellation bite.
  points[3, 7] = np.nan
  points[11] = np.inf
  init = points[[0, 5, 9, 20]] + 0.1
  w = rng.integers(0, 4, n).astype(np.float32)
  return points, init.astype(np.float32), w


@pytest.mark.parametrize("method", METHODS)
def test_low_default_precision_does_not_reach_clustering(method):
  """Under `jax.default_matmul_precision("bfloat16")` every dot of
  Threshold-Clustering is still HIGHEST in the lowered program (what a GPU or
  TPU would run; the CPU ignores the flag, so the HLO is the check here) and
  the centres match the float64 NumPy reference to float32 accuracy.

  Failed before for `direct` (the centre update `tree.combine` and the
  weighted sums had DEFAULT precision; on an H200 the centres were off by up
  to 3e-4 relative) and for `gram` (the coefficient einsum). Mutation check:
  dropping `precision=` from `tree.combine` makes it fail.
  """
  points, init, w = _weighted_with_bad_rows()
  fn = lambda z, v, w: prfl.threshold_clustering(
      z, v, radius=prfl.quantile_radius(0.3), num_iters=8, weights=w,
      method=method)
  with jax.default_matmul_precision("bfloat16"):
    precisions = tolerances.dot_precisions(fn, points, init, w)
    assert tolerances.all_highest(fn, points, init, w), precisions
    out = jax.jit(fn)(points, init, w)
  ref = reference.threshold_clustering(points, init, None, 8, weights=w,
                                       quantile=0.3)
  np.testing.assert_allclose(out, ref, **tolerances.LIBRARY)


@pytest.mark.parametrize("method", METHODS)
def test_with_info_reports_last_step_radius_and_ball(method):
  """`threshold_clustering_with_info` returns the radius and the ball of the
  LAST step, by hand.

  Points 0, 1, 10 (1-D). Centre A starts at 0 with the quantile rule q = 0.5:
  step 1 distances 0, 1, 10 -> tau = 1, {0, 1} inside -> v = 1/3; step 2
  distances 1/3, 2/3, 29/3 -> tau = 2/3, {0, 1} inside -> v = 4/9. With the
  fixed radii [2, 0.5] and centres 0 and 10: A as in the module's first test
  (tau = 2), B keeps only 10 inside (tau = 0.5).

  Mutations seen to fail: the carry keeping the first step's radius
  (`_DirectCarry(centers, inside, carry.tau)` / the Gram twin); `inside`
  computed with `<` instead of `<=` (point 1 at distance exactly tau = 1
  in step 1 leaves the ball, moving every later number).
  """
  z = jnp.array([[0.0], [1.0], [10.0]])
  centers, info = prfl.threshold_clustering_with_info(
      z, jnp.zeros((1, 1)), radius=prfl.quantile_radius(0.5), num_iters=2,
      method=method)
  np.testing.assert_allclose(centers, [[4.0 / 9.0]], rtol=1e-6)
  np.testing.assert_allclose(info.radius, [2.0 / 3.0], rtol=1e-6)
  np.testing.assert_array_equal(info.inside, [[True, True, False]])
  centers, info = prfl.threshold_clustering_with_info(
      z, jnp.array([[0.0], [10.0]]), radius=jnp.array([2.0, 0.5]),
      num_iters=2, method=method)
  np.testing.assert_allclose(centers, [[4.0 / 9.0], [10.0]], rtol=1e-6)
  np.testing.assert_allclose(info.radius, [2.0, 0.5])
  np.testing.assert_array_equal(info.inside, [[True, True, False],
                                              [False, False, True]])


@pytest.mark.parametrize("method", METHODS)
def test_with_info_matches_numpy_last_step(method):
  """Radius and ball of the last step equal the NumPy reference's."""
  points, init = _data(7)
  w = np.array([1, 1, 0, 2, 1, 1, 0, 1, 1, 3, 1, 1], np.float32)
  _, info = prfl.threshold_clustering_with_info(
      points, init, radius=prfl.quantile_radius(0.4), num_iters=5,
      weights=jnp.asarray(w), method=method)
  _, inside, tau = reference.threshold_clustering_info(
      points, init, None, 5, weights=w, quantile=0.4)
  np.testing.assert_allclose(info.radius, tau, rtol=1e-4)
  np.testing.assert_array_equal(info.inside, inside)
  assert 0 < inside.sum() < inside.size


@pytest.mark.parametrize("method", METHODS)
def test_cluster_and_assign_by_hand(method):
  """Points 0, 1, 10, 11, 30, 5.05 (1-D), centres 0 and 10, radius 2, 1 step.

  Centre 0: {0, 1} inside -> (0 + 1 + 4 * 0) / 6 = 1/6; centre 10: {10, 11}
  inside -> (10 + 11 + 4 * 10) / 6 = 61/6. Nearest centres: 0, 0, 1, 1, 1,
  and 5.05 -> 0 (4.88 vs 5.12; it would go to 1 by the initial centres).
  With weights (2, 0, 1, 1, 0, 1), W = 5: centre 0 -> 0 (point 1 is absent),
  centre 10 -> (2*10 + 10 + 11 + 10) / 5 = 10.2; 5.05 -> 0 (5.05 vs 5.15).

  Mutations seen to fail: `assign` against the initial centres instead of
  the clustered ones; `assigned` taken from the initial centres.
  """
  z = jnp.array([[0.0], [1.0], [10.0], [11.0], [30.0], [5.05]])
  init = jnp.array([[0.0], [10.0]])
  for weights, c0, c1 in [(None, 1 / 6, 61 / 6),
                          (jnp.array([2.0, 0.0, 1.0, 1.0, 0.0, 1.0]), 0.0,
                           10.2)]:
    centers, assignment, assigned = prfl.cluster_and_assign(
        z, init, radius=2.0, num_iters=1, method=method, weights=weights)
    np.testing.assert_allclose(centers, [[c0], [c1]], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(assignment, [0, 0, 1, 1, 1, 0])
    assert assignment.dtype == jnp.int32
    np.testing.assert_allclose(assigned[:, 0], [c0, c0, c1, c1, c1, c0],
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("n", [3, 600])  # Rank counting and sorting paths.
def test_quantile_of_a_single_present_value_is_that_value(n):
  """With one present value every quantile is that value (np.quantile of
  one number), not +inf from an absent neighbour nor the empty-set 0.

  Mutations seen to fail: `jnp.maximum(count - 1, 0)` -> `(count - 1, 1)`
  (rank q instead of 0: the absent +inf is interpolated in), `count > 0` ->
  `count > 1` (one value treated as none).
  """
  values = jnp.arange(n, dtype=jnp.float32) + 2.0
  present = jnp.zeros((n,), bool).at[1].set(True)
  for q in (0.0, 0.3, 0.5, 1.0):
    np.testing.assert_allclose(prfl.masked_quantile(values, present, q), 3.0)


@pytest.mark.parametrize("method", METHODS)
def test_weights_only_matter_up_to_scale(method):
  """Algorithm 2 divides by W = sum(w): weights summing to 0.012 give the
  centres of the same weights times 1000 (and of the NumPy reference).

  Mutation seen to fail: the normaliser `where(total > 0, total, 1.0)` ->
  `where(total > 1, total, 1.0)` (a total below 1 left unnormalised).
  """
  points, init = _data(8)
  w = np.array([1, 0, 2, 1, 0, 1, 1, 3, 0, 1, 1, 1], np.float32)
  for rule, kw in [(2.0, {"radius": 2.0}),
                   (prfl.quantile_radius(0.5), {"radius": None,
                                                "quantile": 0.5})]:
    small = prfl.threshold_clustering(points, init, radius=rule, num_iters=4,
                                      weights=jnp.asarray(w * 1e-3),
                                      method=method)
    large = prfl.threshold_clustering(points, init, radius=rule, num_iters=4,
                                      weights=jnp.asarray(w), method=method)
    np.testing.assert_allclose(small, large, rtol=1e-5, atol=1e-5)
    ref = reference.threshold_clustering(points, init, num_iters=4,
                                         weights=w, **kw)
    np.testing.assert_allclose(small, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_scale_equivariant_down_to_small_gradients(method):
  """Clustering `s * z` from `s * v0` with radius `s * tau` gives `s` times
  the centres, for s = 1e-3 (late-training gradients are that small), with
  a fixed and a quantile radius, and equals the NumPy reference.

  Mutation seen to fail: `_inside` flooring squared distances at 1 instead
  of 0 (`jnp.maximum(d2, 1.0)`: every point nearer than 1 looks 1 away).
  """
  points, init = _data(9)
  s = 1e-3
  for rule, scaled, kw in [
      (1.5, 1.5 * s, {"radius": 1.5}),
      (prfl.quantile_radius(0.3), prfl.quantile_radius(0.3),
       {"radius": None, "quantile": 0.3})]:
    out = prfl.threshold_clustering(jnp.asarray(points * s),
                                    jnp.asarray(init * s), radius=scaled,
                                    num_iters=5, method=method)
    ref = reference.threshold_clustering(points, init, num_iters=5, **kw)
    np.testing.assert_allclose(np.asarray(out) / s, ref, rtol=1e-4,
                               atol=1e-4)
    assert not np.allclose(ref, init, atol=1e-3)  # The centres moved.


@pytest.mark.parametrize("method", METHODS)
def test_float64_points_under_x64_stay_float64(method):
  """With `jax.enable_x64`, float64 points give float64 centres equal to the
  float64 NumPy reference to 1e-12 (float32 rounding would show as ~1e-7).
  Defect seen before the fix: the direct kernel's radius carry was float32
  and the float64 loop failed to trace."""
  points, init = _data(1)
  points, init = points.astype(np.float64), init.astype(np.float64)
  ref = reference.threshold_clustering(points, init, num_iters=5,
                                       radius=None, quantile=0.3)
  with jax.enable_x64(True):
    out, info = prfl.threshold_clustering_with_info(
        jnp.asarray(points), jnp.asarray(init),
        radius=prfl.quantile_radius(0.3), num_iters=5, method=method)
    assert out.dtype == jnp.float64 and info.radius.dtype == jnp.float64
  np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-12, atol=1e-12)


# --- cluster_and_assign(method="gram"): one Gram matrix for everything. ---


def _cluster_and_assign_both(points, init, **kwargs):
  """(direct, gram, gram with a precomputed Gram) results of cluster_and_assign."""
  direct = prfl.cluster_and_assign(points, init, method="direct", **kwargs)
  gram = prfl.cluster_and_assign(points, init, method="gram", **kwargs)
  pre = prfl.cluster_and_assign(points, init, method="gram",
                                gram=prfl.tree.gram(points), **kwargs)
  return direct, gram, pre


def _assert_same(a, b):
  """Same centres and assigned centres (LIBRARY tolerance), same assignment."""
  for x, y in zip(jax.tree.leaves((a[0], a[2])), jax.tree.leaves((b[0], b[2]))):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x),
                               **tolerances.LIBRARY)
  np.testing.assert_array_equal(np.asarray(b[1]), np.asarray(a[1]))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("radius", [2.5, prfl.quantile_radius(0.4)])
def test_cluster_and_assign_gram_matches_direct(seed, radius):
  """Clear clusters, a pytree of two leaves, a zero weight and a NaN point.

  Mutations seen to fail: dropping the `b * <z_i, v0_k>` term of the Gram
  distances, and skipping the final `keep * b` decay (centres keep the full
  initial centre).
  """
  points, init = _data(seed, n=12, k=3, p=5)
  points[4] = np.nan
  tree = {"a": points[:, :2], "b": points[:, 2:].reshape(12, 3, 1)}
  init_tree = {"a": init[:, :2], "b": init[:, 2:].reshape(3, 3, 1)}
  w = np.ones(12, np.float32)
  w[7] = 0.0
  direct, gram, pre = _cluster_and_assign_both(
      tree, init_tree, radius=radius, num_iters=6, weights=jnp.asarray(w))
  assert np.all(np.isfinite(np.asarray(direct[0]["a"])))
  _assert_same(direct, gram)
  _assert_same(direct, pre)
  # The gram path is also the per-centre-Gram threshold_clustering's result.
  ref = prfl.threshold_clustering(tree, init_tree, radius=radius, num_iters=6,
                                  weights=jnp.asarray(w), method="gram")
  for x, y in zip(jax.tree.leaves(ref), jax.tree.leaves(gram[0])):
    np.testing.assert_allclose(y, x, **tolerances.LIBRARY)


def test_cluster_and_assign_gram_repeated_and_empty_centres():
  """A repeated initial centre stays empty (ties go to the lowest index) and
  a centre far from every point keeps its value and receives no point, in
  both kernels.

  Points 0, 0.2 and 5, 5.4; initial centres 0, 5, 5 (a repeat) and 100
  (empty); radius 1, one step, W = 4: centres (0 + 0.2 + 2 * 0) / 4 = 0.05,
  (5 + 5.4 + 2 * 5) / 4 = 5.1 (twice) and 100; assignment 0, 0, 1, 1.

  Mutations seen to fail: `keep = 0` (a centre whose ball is empty jumps to
  0); dropping the gram path's mask of repeated centres in the assignment
  together with ties to the highest index (points 2, 3 go to the repeat).
  Either guard alone keeps the repeat empty on CPU, and tying repeats to
  their first copy's iterates (`_Shared.first`) only guards against
  rounding that differs between identical rows: replacing it by `arange`
  passes here.
  """
  points = jnp.array([[0.0, 1.0], [0.2, 1.0], [5.0, 1.0], [5.4, 1.0]])
  init = jnp.array([[0.0, 1.0], [5.0, 1.0], [5.0, 1.0], [100.0, 1.0]])
  for method in METHODS:
    centers, assignment, assigned = prfl.cluster_and_assign(
        points, init, radius=1.0, num_iters=1, method=method)
    np.testing.assert_allclose(
        centers, [[0.05, 1.0], [5.1, 1.0], [5.1, 1.0], [100.0, 1.0]],
        rtol=1e-6)
    np.testing.assert_array_equal(assignment, [0, 0, 1, 1])
    np.testing.assert_allclose(assigned, np.asarray(centers)[[0, 0, 1, 1]])


def test_cluster_and_assign_gram_ties_like_direct():
  """A point exactly halfway between two distinct centres goes to the lower
  index in both kernels. Centres 2 and 0, points 1, 3, -1; radius 0.5 holds
  no point, so the centres never move and the tie of point 1 is exact (in
  the Gram kernel too: 1 - 2 * 2 + 4 = 1 - 0 + 0).

  Mutation seen to fail: ties to the highest index in the gram path's
  assignment (`k - 1 - argmin(d2[:, ::-1])`).
  """
  points = jnp.array([[1.0], [3.0], [-1.0]])
  init = jnp.array([[2.0], [0.0]])
  for method in METHODS:
    _, assignment, _ = prfl.cluster_and_assign(points, init, radius=0.5,
                                               num_iters=1, method=method)
    np.testing.assert_array_equal(assignment, [0, 0, 1])


def test_cluster_and_assign_checks_method_and_gram():
  points, init = _data(0, n=6, k=2, p=3)
  with pytest.raises(ValueError, match="method.*direct.*gram"):
    prfl.cluster_and_assign(points, init, radius=1.0, method="fast")
  with pytest.raises(ValueError, match="gram"):
    prfl.cluster_and_assign(points, init, radius=1.0, method="direct",
                            gram=prfl.tree.gram(points))
  with pytest.raises(ValueError, match=r"gram.*\[6, 6\]"):
    prfl.cluster_and_assign(points, init, radius=1.0, method="gram",
                            gram=jnp.zeros((5, 5)))
  with pytest.raises(ValueError, match="method"):
    prfl.clustering.check_method(None)


@pytest.mark.parametrize("separation", [0.0, 4.0, 100.0])
def test_farthest_first_from_gram_matches_points(separation):
  """Farthest-first from the Gram matrix picks the same indices (no ties),
  also with a NaN point and with separations that leave slots unopened.

  Mutation seen to fail: `diag - 2 G[:, j] - diag[j]` (wrong sign) in the
  Gram distances.
  """
  points, _ = _data(3, n=10, k=3, p=4)
  points[2] = np.nan
  for seed in range(4):
    key = jax.random.PRNGKey(seed)
    a = prfl.farthest_first(points, 4, key, separation=separation)
    b = prfl.farthest_first(points, 4, key, separation=separation,
                            gram=prfl.tree.gram(points))
    np.testing.assert_array_equal(b, a)
    assert 2 not in np.asarray(a).tolist()
  with pytest.raises(ValueError, match="gram"):
    prfl.farthest_first(points, 2, key, gram=jnp.zeros((3, 3)))
