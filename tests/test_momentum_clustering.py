"""Tests of Momentum-Clustering (Algorithm 3)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from tests import tolerances


def shifted_quadratic(x, batch):
  return 0.5 * jnp.sum((x - batch[0]) ** 2)


C = jnp.array([[0.0], [0.0], [10.0], [10.0]])


def test_two_rounds_by_hand():
  # Round 1 (alpha = 1): momenta = gradients = 0, 0, -10, -10. Farthest-first
  # picks one of each value; with radius 1 each centre keeps its value, the
  # clients go to the centre of their own value: x = 0, 0, 1, 1 (lr 0.1).
  alg = prfl.algorithms.momentum_clustering(
      shifted_quadratic, optax.sgd(0.1), num_clusters=2, radius=1.0,
      num_iters=1, alpha=1.0)
  state = alg.init(jnp.zeros((4, 1)))
  state, _ = alg.step(state, C[:, None], jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0], [0, 0, 1, 1], atol=1e-6)
  a = np.asarray(state.assignment)
  assert a[0] == a[1] and a[2] == a[3] and a[0] != a[2]


def test_momentum_and_carried_centres():
  # alpha = 0.5. Round 1: m = 0.5 * g = 0, 0, -5, -5; centres 0 and -5,
  # x = 0, 0, 0.5, 0.5. Round 2: g = 0, 0, -9.5, -9.5,
  # m = 0.5 * g + 0.5 * m = 0, 0, -7.25, -7.25; the carried centre -5 sees
  # both at distance 2.25 <= 3 and moves by one step to
  # (-5 - 5 - 7.25 - 7.25) / 4 = -6.125; x = 0.5 + 0.6125 = 1.1125.
  alg = prfl.algorithms.momentum_clustering(
      shifted_quadratic, optax.sgd(0.1), num_clusters=2, radius=3.0,
      num_iters=1, alpha=0.5)
  state = alg.init(jnp.zeros((4, 1)))
  state, _ = alg.step(state, C[:, None], jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0], [0, 0, 0.5, 0.5], atol=1e-6)
  state, _ = alg.step(state, C[:, None], jax.random.key(1))
  np.testing.assert_allclose(state.momentum[:, 0], [0, 0, -7.25, -7.25],
                             atol=1e-6)
  np.testing.assert_allclose(state.params[:, 0], [0, 0, 1.1125, 1.1125],
                             atol=1e-6)


def test_farthest_first_covers_separated_clusters_and_skips_nan():
  pts = jnp.array([[0.0], [0.1], [5.0], [5.1], [-7.0], [jnp.nan]])
  for seed in range(5):
    index = prfl.clustering.farthest_first(pts, 3, jax.random.key(seed))
    centres = np.sort(np.asarray(pts)[np.asarray(index), 0])
    assert centres[0] == -7.0 and 0 <= centres[1] <= 0.1 and centres[2] >= 5


def test_separates_clusters_on_quadratics_with_nan_attack():
  rng = np.random.default_rng(0)
  c = np.concatenate([np.zeros((5, 2)), np.full((5, 2), 4.0)]) + 0.1 * rng.normal(
      size=(10, 2))
  byz = jnp.zeros(10, bool).at[jnp.array([4, 9])].set(True)
  alg = prfl.algorithms.momentum_clustering(
      shifted_quadratic, optax.sgd(0.2), num_clusters=2, radius=1.0,
      alpha=0.5, attack=prfl.attacks.non_finite())
  state = alg.init(jnp.full((10, 2), 2.0), byzantine=byz)
  step = jax.jit(alg.step)
  for t in range(80):
    state, m = step(state, jnp.asarray(c, jnp.float32)[:, None],
                    jax.random.key(t))
  params = np.asarray(state.params)
  assert np.all(np.isfinite(params[~np.asarray(byz)]))
  np.testing.assert_allclose(params[:4], c[:4].mean(0, keepdims=True).repeat(4, 0),
                             atol=0.2)
  np.testing.assert_allclose(params[5:9], c[5:9].mean(0, keepdims=True).repeat(4, 0),
                             atol=0.2)


def test_bad_arguments():
  with pytest.raises(ValueError, match="num_clusters"):
    prfl.algorithms.momentum_clustering(
        shifted_quadratic, optax.sgd(0.1), num_clusters=5,
        radius=1.0).init(jnp.zeros((4, 1)))
  with pytest.raises(ValueError, match="alpha"):
    prfl.algorithms.momentum_clustering(shifted_quadratic, optax.sgd(0.1),
                                        num_clusters=2, radius=1.0, alpha=0.0)
  with pytest.raises(ValueError, match="radius"):
    prfl.algorithms.momentum_clustering(shifted_quadratic, optax.sgd(0.1),
                                        num_clusters=2, radius=jnp.ones(3))


def test_gram_method_gives_the_hand_computed_rounds():
  """`method="gram"` runs Momentum-Clustering's server clustering through
  the Gram kernel (K centres carried across rounds, none of them a point):
  the same two hand-computed rounds as `test_momentum_and_carried_centres`,
  and the same 6 rounds as `method="direct"` on a noisy federation.

  Mutation seen to fail: the Gram kernel's step without the `keep` factor
  (`a + step` in `clustering._gram_cluster_and_assign`, which
  `cluster_and_assign(method="gram")` runs).
  """
  alg = prfl.algorithms.momentum_clustering(
      shifted_quadratic, optax.sgd(0.1), num_clusters=2, radius=3.0,
      num_iters=1, alpha=0.5, method="gram")
  state = alg.init(jnp.zeros((4, 1)))
  state, _ = alg.step(state, C[:, None], jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0], [0, 0, 0.5, 0.5], atol=1e-6)
  state, _ = alg.step(state, C[:, None], jax.random.key(1))
  np.testing.assert_allclose(state.params[:, 0], [0, 0, 1.1125, 1.1125],
                             atol=1e-6)
  rng = np.random.default_rng(1)
  c = jnp.asarray(np.concatenate([np.zeros((4, 3)), np.full((4, 3), 3.0)]) +
                  0.3 * rng.normal(size=(8, 3)), jnp.float32)[:, None]
  states = []
  for method in ("direct", "gram"):
    alg = prfl.algorithms.momentum_clustering(
        shifted_quadratic, optax.sgd(0.3), num_clusters=2, radius=1.0,
        num_iters=3, alpha=0.5, method=method)
    state = alg.init(jnp.zeros((8, 3)))
    step = jax.jit(alg.step)
    for t in range(6):
      state, _ = step(state, c, jax.random.key(t))
    states.append(state)
  np.testing.assert_allclose(states[1].params, states[0].params, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(states[1].centers, states[0].centers, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_array_equal(states[1].assignment, states[0].assignment)


@pytest.mark.parametrize("radius", [1.0, prfl.quantile_radius(0.4)])
def test_gram_method_follows_direct_with_attack_round_by_round(radius):
  """Three clusters of quadratic clients with a NaN-sending Byzantine
  client: `method="gram"` (one Gram matrix of the momenta per round; the
  carried centres enter through their inner products with the momenta)
  gives direct's centres, assignment and params after every round.

  Mutations seen to fail: dropping `b_k^2 ||v0_k||^2` from the gram
  kernel's `||c_k||^2` (the radius-1.0 case; the quantile rule happens to
  keep the same balls); not masking the unusable points' `<z_i, v0_k>` (NaN
  everywhere).
  """
  rng = np.random.default_rng(2)
  means = np.repeat(np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]]), 3, axis=0)
  c = jnp.asarray(means + 0.3 * rng.normal(size=(9, 2)), jnp.float32)[:, None]
  byz = jnp.arange(9) == 4
  runs = {}
  for method in ("direct", "gram"):
    alg = prfl.algorithms.momentum_clustering(
        shifted_quadratic, optax.sgd(0.3), num_clusters=3, radius=radius,
        num_iters=4, alpha=0.5, attack=prfl.attacks.non_finite(),
        method=method)
    state = alg.init(jnp.zeros((9, 2)), byzantine=byz)
    step = jax.jit(alg.step)
    runs[method] = []
    for t in range(4):
      state, _ = step(state, c, jax.random.key(t))
      runs[method].append(state)
  for d, g in zip(runs["direct"], runs["gram"]):
    np.testing.assert_allclose(g.centers, d.centers, **tolerances.LIBRARY)
    np.testing.assert_allclose(g.params, d.params, **tolerances.LIBRARY)
    np.testing.assert_array_equal(g.assignment, d.assignment)
  assert np.all(np.isfinite(np.asarray(runs["gram"][-1].centers)))
  assert len(set(np.asarray(runs["gram"][-1].assignment)[~byz].tolist())) > 1


def test_bad_method_raises_before_tracing():
  """Mutation seen to fail: no `check_method` in `momentum_clustering`."""
  with pytest.raises(ValueError, match="method.*direct.*gram"):
    prfl.algorithms.momentum_clustering(shifted_quadratic, optax.sgd(0.1),
                                        num_clusters=2, radius=1.0,
                                        method="Gram")
