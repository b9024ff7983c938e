"""Tests of IFCA (Options I and II) against hand-computed rounds."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prfl_jax import aggregators
from prfl_jax import attacks
from prfl_jax.algorithms.ifca import ifca
from tests.toy import linreg_federation
from tests.toy import quadratic


TARGETS = np.array([0.0, 1.0, 5.0, 9.0])
MODELS = np.array([0.0, 4.0, 100.0])  # Cluster 2 never wins: stays empty.


def assignment(models):
  losses = 0.5 * (models[:, None] - TARGETS[None, :]) ** 2
  return np.argmin(losses, axis=0)


def test_option1_two_rounds_match_numpy():
  gamma = 0.1
  alg = ifca(quadratic, optax.sgd(gamma), num_clusters=3, option=1)
  state = alg.init(jnp.zeros(4), init_models=jnp.asarray(MODELS))
  models = MODELS.copy()
  batch = jnp.asarray(TARGETS)[:, None]
  for r in range(2):
    state, metrics = alg.step(state, batch, jax.random.PRNGKey(r))
    a = assignment(models)
    grads = models[a] - TARGETS
    for k in range(3):
      if np.any(a == k):
        models[k] -= gamma * grads[a == k].mean()
    np.testing.assert_allclose(state.models, models, rtol=1e-6)
    np.testing.assert_array_equal(state.assignment, a)
    np.testing.assert_allclose(state.params, models[a], rtol=1e-6)
    assert metrics["num_clusters"] == len(set(a.tolist()))
  assert state.models[2] == 100.0  # Empty cluster kept its model.


def test_option2_two_rounds_match_numpy():
  eta, steps = 0.25, 2
  alg = ifca(quadratic, optax.sgd(eta), num_clusters=3, option=2,
             local_steps=steps)
  state = alg.init(jnp.zeros(4), init_models=jnp.asarray(MODELS))
  models = MODELS.copy()
  # Two micro-batches per client: targets c and c + 1.
  batch = jnp.asarray(np.stack([TARGETS, TARGETS + 1.0], axis=1))
  for r in range(2):
    state, _ = alg.step(state, batch, jax.random.PRNGKey(r))
    losses = 0.5 * ((models[:, None, None] - np.asarray(batch)[None]) ** 2
                    ).mean(-1)
    a = np.argmin(losses, axis=0)
    local = models[a].copy()
    for s in range(steps):
      local -= eta * (local - (TARGETS + s))
    for k in range(3):
      if np.any(a == k):
        models[k] = local[a == k].mean()
    np.testing.assert_allclose(state.models, models, rtol=1e-6)
    np.testing.assert_array_equal(state.assignment, a)


def test_random_init_and_init_errors():
  alg = ifca(quadratic, optax.sgd(0.1), num_clusters=2, init_scale=1.0)
  state = alg.init(jnp.full(4, 3.0), key=jax.random.PRNGKey(0))
  assert state.models.shape == (2,)
  assert not np.allclose(state.models[0], state.models[1])
  with pytest.raises(ValueError, match="init_models"):
    alg.init(jnp.zeros(4))
  with pytest.raises(ValueError, match="init_models"):
    alg.init(jnp.zeros(4), init_models=jnp.zeros(3))
  with pytest.raises(ValueError, match="init_models"):
    alg.init(jnp.zeros((4, 2)), init_models=jnp.zeros((2, 3)))


@pytest.mark.parametrize("option", [1, 2])
def test_jit_linear_regression(option):
  loss, batch, params = linreg_federation(jax.random.PRNGKey(0))
  byz = jnp.array([False] * 5 + [True])
  alg = ifca(loss, optax.sgd(0.05), num_clusters=2, option=option,
             local_steps=2 if option == 2 else 1, attack=attacks.bit_flip())
  state = alg.init(params, byzantine=byz, key=jax.random.PRNGKey(1))
  step = jax.jit(alg.step)
  for r in range(3):
    state, metrics = step(state, batch, jax.random.PRNGKey(r))
  assert state.params.shape == (6, 4) and state.models.shape == (2, 4)
  assert np.all(np.isfinite(np.asarray(state.models)))
  assert all(np.isfinite(v) for v in jax.device_get(metrics).values())


@pytest.mark.parametrize("kwargs, match", [
    ({"num_clusters": 0}, "num_clusters"),
    ({"option": 3}, "option"),
    ({"option": 1, "local_steps": 2}, "local_steps"),
    ({"option": 2, "local_steps": 0}, "local_steps"),
    ({"init_scale": -1.0}, "init_scale"),
])
def test_bad_arguments(kwargs, match):
  args = {"num_clusters": 2}
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    ifca(quadratic, optax.sgd(0.1), **args)


def test_bad_types():
  with pytest.raises(TypeError, match="optimizer"):
    ifca(quadratic, "sgd", num_clusters=2)
  with pytest.raises(TypeError, match="loss_fn"):
    ifca(3, optax.sgd(0.1), num_clusters=2)


def test_option1_median_aggregator_matches_numpy():
  """Each cluster model moves by the median of its members' messages only."""
  gamma = 0.1
  targets = np.array([0.0, 1.0, 5.0, 9.0, 6.0])
  byz = np.array([False, False, False, False, True])
  alg = ifca(quadratic, optax.sgd(gamma), num_clusters=2, option=1,
             attack=attacks.large(100.0), aggregator=aggregators.median())
  models = np.array([0.0, 6.0])
  state = alg.init(jnp.zeros(5), byzantine=jnp.asarray(byz),
                   init_models=jnp.asarray(models))
  state, _ = alg.step(state, jnp.asarray(targets)[:, None],
                      jax.random.PRNGKey(0))
  a = np.argmin(0.5 * (models[:, None] - targets[None]) ** 2, axis=0)
  grads = models[a] - targets
  grads[byz] *= 100.0
  for k in range(2):
    models[k] -= gamma * np.median(grads[a == k])
  np.testing.assert_allclose(state.models, models, rtol=1e-6)


def test_mean_aggregator_matches_default():
  loss, batch, params = linreg_federation(jax.random.PRNGKey(0))
  states = []
  for agg in (None, aggregators.mean()):
    alg = ifca(loss, optax.sgd(0.05), num_clusters=2, aggregator=agg)
    state = alg.init(params, key=jax.random.PRNGKey(1))
    for r in range(3):
      state, _ = jax.jit(alg.step)(state, batch, jax.random.PRNGKey(r))
    states.append(state)
  np.testing.assert_allclose(states[0].models, states[1].models, rtol=1e-6)


def test_aggregator_must_be_callable():
  with pytest.raises(TypeError, match="aggregator"):
    ifca(quadratic, optax.sgd(0.1), num_clusters=2, aggregator=0.5)
