"""Tests of Federated-Clustering (Algorithm 1)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax.algorithms.federated_clustering import random_groups
from tests import reference

ETA = 0.1


def example1_loss(x, batch):
  """Section 2, Example 1: f1, f2, f3 selected by the client index."""
  c = batch[0]
  f1 = x ** 2 / (6 * ETA)
  f2 = jnp.where(x < 1, 4 * (x - 1) ** 3 + 3 * (x - 1) ** 4 + 1,
                 (x - 1) ** 2 / (2 * ETA) + 1)
  f3 = (x - 2) ** 2 / (2 * ETA)
  return jnp.select([c == 0, c == 1, c == 2], [f1, f2, f3])


def example2_loss(x, batch):
  """Section 2, Example 2: f1 = (x + 0.5)^2, f2 = (x - 0.5)^2."""
  return (x + jnp.where(batch[0] == 0, 0.5, -0.5)) ** 2


def shifted_quadratic(x, batch):
  """f_j(x) = 0.5 * ||x - c_j||^2, gradient x - c_j."""
  return 0.5 * jnp.sum((x - batch[0]) ** 2)


def _run(alg, params, batch, rounds, seed=0):
  state = alg.init(params)
  step = jax.jit(alg.step)
  for t in range(rounds):
    state, metrics = step(state, batch, jax.random.key(seed + t))
  return state, metrics


def test_example1_ends_at_optima():
  alg = prfl.algorithms.federated_clustering(
      example1_loss, optax.sgd(ETA), radius=0.5 / ETA, num_iters=10)
  state, _ = _run(alg, jnp.full((3,), 1.5), jnp.arange(3).reshape(3, 1), 100)
  np.testing.assert_allclose(state.params, [0.0, 0.0, 2.0], atol=1e-4)


def test_example1_first_round_by_hand():
  # Round 1 at x = 1.5: gradients 1/(2 eta), 1/(2 eta), -1/(2 eta) = 5, 5, -5
  # at every model. Clients 1, 2: points at distance 0, 0, 10 from their own
  # gradient, radius 5 -> centre stays 5 -> x = 1.5 - 0.1 * 5 = 1.
  # Client 3: only itself inside -> centre -5 -> x = 2.
  alg = prfl.algorithms.federated_clustering(
      example1_loss, optax.sgd(ETA), radius=0.5 / ETA, num_iters=10)
  state, _ = _run(alg, jnp.full((3,), 1.5), jnp.arange(3).reshape(3, 1), 1)
  np.testing.assert_allclose(state.params, [1.0, 1.0, 2.0], atol=1e-6)
  # Round 2, client 2 at x = 1 (Section 3.1.3): g1(1) = 1/(3 eta), g2(1) = 0,
  # g3(1) = -1/eta; client 1 is within 5 of 0, so client 2 leaves the saddle.
  state, _ = _run(alg, jnp.full((3,), 1.5), jnp.arange(3).reshape(3, 1), 2)
  assert state.params[1] < 1.0


def test_example2_separates_clients():
  alg = prfl.algorithms.federated_clustering(
      example2_loss, optax.sgd(0.1), radius=0.5, num_iters=10)
  state, _ = _run(alg, jnp.zeros(2), jnp.arange(2).reshape(2, 1), 150)
  np.testing.assert_allclose(state.params, [-0.5, 0.5], atol=1e-4)


def _np_fc_round(x, c, lr, radius, num_iters, weights=None):
  """One FC round with the NumPy reference of Algorithm 2 (shifted quadratic)."""
  new = x.copy()
  for i in range(x.shape[0]):
    grads = x[i][None] - c  # [N, P]: g_j(x_i)
    v = reference.threshold_clustering(grads, grads[i][None], radius,
                                       num_iters, weights=weights)[0]
    new[i] = x[i] - lr * v
  return new


def test_one_round_by_hand():
  # Gradients at x = 0 are -c_j = 0, -1, -10; radius 2, one clustering step:
  # client 1: {0, -1} inside -> v = (0 - 1 + 0) / 3 = -1/3 -> x = 1/3
  # client 2: {0, -1} inside -> v = (0 - 1 - 1) / 3 = -2/3 -> x = 2/3
  # client 3: alone -> v = -10 -> x = 10.
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(1.0), radius=2.0, num_iters=1)
  c = jnp.array([[0.0], [1.0], [10.0]])
  state, metrics = _run(alg, jnp.zeros((3, 1)), c[:, None], 1)
  np.testing.assert_allclose(state.params[:, 0], [1 / 3, 2 / 3, 10.0],
                             rtol=1e-6)
  np.testing.assert_allclose(metrics["ball_fraction"], (2 + 2 + 1) / 9,
                             rtol=1e-6)


@pytest.mark.parametrize("radius", [1.5, "quantile"])
@pytest.mark.parametrize("plan", [
    prfl.ExecutionPlan(chunk_size=None, kernel="gram"),
    prfl.ExecutionPlan(chunk_size=2, kernel="direct"),
    prfl.ExecutionPlan(chunk_size=3, kernel="gram"),
    prfl.ExecutionPlan()])  # No dense layer: falls back to the Gram kernel.
@pytest.mark.filterwarnings("ignore:prfl_jax. found no dense")
def test_rounds_match_numpy(radius, plan):
  rng = np.random.default_rng(0)
  c = rng.normal(size=(7, 3)).astype(np.float32) * 2
  x = rng.normal(size=(7, 3)).astype(np.float32)
  rule = prfl.quantile_radius(0.4) if radius == "quantile" else radius
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.3), radius=rule, num_iters=4,
      plan=plan)
  state, _ = _run(alg, jnp.asarray(x), jnp.asarray(c)[:, None], 3)
  ref = x.astype(np.float64)
  for _ in range(3):
    if radius == "quantile":
      ref = _np_fc_round_q(ref, c, 0.3, 0.4, 4)
    else:
      ref = _np_fc_round(ref, c, 0.3, radius, 4)
  np.testing.assert_allclose(state.params, ref, rtol=1e-4, atol=1e-4)


def _np_fc_round_q(x, c, lr, q, num_iters):
  new = x.copy()
  for i in range(x.shape[0]):
    grads = x[i][None] - c
    v = reference.threshold_clustering(grads, grads[i][None], None, num_iters,
                                       quantile=q)[0]
    new[i] = x[i] - lr * v
  return new


def test_random_groups_partition_and_padding():
  groups = random_groups(jax.random.key(3), 7, 3)
  assert groups.index.shape == (3, 3)
  real = np.asarray(groups.index)[np.asarray(groups.weight) > 0]
  np.testing.assert_array_equal(np.sort(real), np.arange(7))
  assert float(jnp.sum(groups.weight)) == 7
  flat = np.asarray(groups.index).ravel()
  np.testing.assert_array_equal(flat[np.asarray(groups.slot)], np.arange(7))


def test_groups_cluster_within_group_with_padding():
  # With an infinite radius every client's centre is the mean gradient of the
  # real members of its group; padding clients must not count.
  n, g = 7, 3
  rng = np.random.default_rng(1)
  c = rng.normal(size=(n, 2)).astype(np.float32)
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(1.0), radius=np.inf, num_iters=3,
      num_groups=g)
  key = jax.random.key(11)
  state = alg.init(jnp.zeros((n, 2)))
  state, _ = jax.jit(alg.step)(state, jnp.asarray(c)[:, None], key)
  groups = random_groups(jax.random.split(key)[0], n, g)
  expected = np.zeros((n, 2))
  for row, w in zip(np.asarray(groups.index), np.asarray(groups.weight)):
    members = row[w > 0]
    expected[members] = c[members].mean(0)  # x = 0 - 1 * mean(0 - c_j).
  np.testing.assert_allclose(state.params, expected, rtol=1e-5, atol=1e-6)


def test_local_steps_alternate_with_clustering():
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.1), radius=1.0, local_steps=2)
  state = alg.init(jnp.zeros((4, 2)))
  batch = jnp.arange(8.0).reshape(4, 1, 2)
  flags = []
  for t in range(6):
    state, m = jax.jit(alg.step)(state, batch, jax.random.key(t))
    flags.append(float(m["clustered"]))
  assert flags == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
  # A local round is a plain gradient step.
  local = prfl.algorithms.local(shifted_quadratic, optax.sgd(0.1))
  s1 = alg.init(jnp.ones((4, 2)))._replace(round=jnp.array(1, jnp.int32))
  s1, _ = alg.step(s1, batch, jax.random.key(0))
  s2, _ = local.step(local.init(jnp.ones((4, 2))), batch, jax.random.key(0))
  np.testing.assert_allclose(s1.params, s2.params)


@pytest.mark.parametrize("attack", [
    prfl.attacks.non_finite(float("nan")), prfl.attacks.non_finite(float("inf")),
    prfl.attacks.large(1e6), prfl.attacks.gaussian(1e3),
    prfl.attacks.bit_flip(), prfl.attacks.alie(), prfl.attacks.ipm(),
    prfl.attacks.mimic()])
def test_byzantine_clients_keep_benign_models_finite(attack):
  rng = np.random.default_rng(2)
  c = np.concatenate([np.zeros((4, 2)), 5 + np.zeros((4, 2))]).astype(
      np.float32) + 0.01 * rng.normal(size=(8, 2)).astype(np.float32)
  byz = jnp.array([False, False, False, True, False, False, False, True])
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.5), radius=1.0, attack=attack)
  state = alg.init(jnp.zeros((8, 2)), byzantine=byz)
  step = jax.jit(alg.step)
  for t in range(30):
    state, metrics = step(state, jnp.asarray(c)[:, None], jax.random.key(t))
  params = np.asarray(state.params)[~np.asarray(byz)]
  assert np.all(np.isfinite(params))
  assert np.isfinite(float(metrics["loss"]))


def test_large_gradient_attack_never_enters_the_ball():
  c = np.array([[0.0], [0.1], [0.2], [5.0], [5.1], [5.2]], np.float32)
  byz = jnp.array([False, False, True, False, False, True])
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.5), radius=1.0,
      attack=prfl.attacks.large(1e4))
  state = alg.init(jnp.zeros((6, 1)), byzantine=byz)
  for t in range(60):
    state, metrics = jax.jit(alg.step)(state, jnp.asarray(c)[:, None],
                                       jax.random.key(t))
  assert float(metrics["byzantine_in_ball"]) == 0.0
  np.testing.assert_allclose(state.params[:2, 0], 0.05, atol=1e-3)
  np.testing.assert_allclose(state.params[3:5, 0], 5.05, atol=1e-3)


def test_same_seed_same_numbers_and_one_trace():
  data, _ = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                           clients_per_cluster=3)
  traced_loss = chex.assert_max_traces(prfl.data.regression_loss, n=8)
  alg = prfl.algorithms.federated_clustering(
      traced_loss, optax.sgd(1e-3), radius=prfl.quantile_radius(0.3),
      num_groups=2)
  step = chex.assert_max_traces(alg.step, n=1)
  alg = alg._replace(step=step)
  kw = dict(num_rounds=12, key=jax.random.key(5), batch_size=5,
            eval_fn=prfl.data.regression_eval, eval_every=4, verbose=False)
  r1 = prfl.train(alg, jnp.zeros((6, 10)), data, **kw)
  chex.clear_trace_counter()
  r2 = prfl.train(alg, jnp.zeros((6, 10)), data, **kw)
  np.testing.assert_array_equal(r1.state.params, r2.state.params)
  np.testing.assert_array_equal(r1.history["eval/error"],
                                r2.history["eval/error"])


def test_bad_arguments():
  loss = shifted_quadratic
  with pytest.raises(ValueError, match="num_iters"):
    prfl.algorithms.federated_clustering(loss, optax.sgd(1.0), radius=1.0,
                                         num_iters=0)
  with pytest.raises(ValueError, match="num_groups"):
    prfl.algorithms.federated_clustering(
        loss, optax.sgd(1.0), radius=1.0, num_groups=5).init(jnp.zeros((4, 2)))
  with pytest.raises(ValueError, match="local_steps"):
    prfl.algorithms.federated_clustering(loss, optax.sgd(1.0), radius=1.0,
                                         local_steps=-1)
  with pytest.raises(TypeError, match="optimizer"):
    prfl.algorithms.federated_clustering(loss, 0.1, radius=1.0)
  with pytest.raises(ValueError, match="radius"):
    prfl.algorithms.federated_clustering(loss, optax.sgd(1.0), radius=-2.0)
  with pytest.raises(ValueError, match="byzantine"):
    prfl.algorithms.federated_clustering(
        loss, optax.sgd(1.0), radius=1.0).init(jnp.zeros((4, 2)),
                                               byzantine=jnp.zeros(3, bool))
  alg = prfl.algorithms.federated_clustering(
      lambda x, b: x - b[0], optax.sgd(1.0), radius=1.0)
  with pytest.raises(TypeError, match="loss_fn"):
    alg.step(alg.init(jnp.zeros((4, 2))), jnp.zeros((4, 1, 2)),
             jax.random.key(0))
  with pytest.raises(ValueError, match="leading axes must match"):
    alg.step(alg.init(jnp.zeros((4, 2))), jnp.zeros((3, 1, 2)),
             jax.random.key(0))
