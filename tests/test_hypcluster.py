"""Tests of HypCluster against hand-computed rounds."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prfl_jax.algorithms.hypcluster import hypcluster
from prfl_jax.algorithms.ifca import ifca
from tests.toy import linreg_federation
from tests.toy import quadratic


TARGETS = np.array([0.0, 1.0, 5.0, 9.0])
MODELS = np.array([0.0, 4.0, 100.0])


def test_two_rounds_match_numpy():
  eta, steps = 0.25, 2
  alg = hypcluster(quadratic, optax.sgd(eta), num_clusters=3,
                   local_steps=steps, init_models=jnp.asarray(MODELS))
  state = alg.init(jnp.zeros(4))
  models = MODELS.copy()
  batch = np.stack([TARGETS, TARGETS + 1.0], axis=1)  # Micro-batch s: c + s.
  for r in range(2):
    state, metrics = alg.step(state, jnp.asarray(batch), jax.random.PRNGKey(r))
    losses = 0.5 * ((models[:, None, None] - batch[None]) ** 2).mean(-1)
    a = np.argmin(losses, axis=0)
    for s in range(steps):  # Centralised steps: gradients at the cluster model.
      grads = models[a] - (TARGETS + s)
      for k in range(3):
        if np.any(a == k):
          models[k] -= eta * grads[a == k].mean()
    np.testing.assert_allclose(state.models, models, rtol=1e-6)
    np.testing.assert_array_equal(state.assignment, a)
    np.testing.assert_allclose(state.params, models[a], rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"], losses.min(0).mean(),
                               rtol=1e-6)
    # Rounds done (a resumed run starts there). Seen to fail with `round +
    # 2` (session 15's sampled survivor algorithms #169: 2 after one round).
    assert int(state.round) == r + 1
  assert state.models[2] == 100.0


def test_one_step_equals_ifca_option1():
  init = jnp.asarray(MODELS)
  batch = jnp.asarray(TARGETS)[:, None]
  h = hypcluster(quadratic, optax.sgd(0.1), num_clusters=3,
                 init_models=init)
  i = ifca(quadratic, optax.sgd(0.1), num_clusters=3, option=1,
           init_models=init)
  hs, is_ = h.init(jnp.zeros(4)), i.init(jnp.zeros(4))
  for r in range(3):
    hs, _ = h.step(hs, batch, jax.random.PRNGKey(r))
    is_, _ = i.step(is_, batch, jax.random.PRNGKey(r))
  np.testing.assert_allclose(hs.models, is_.models, rtol=1e-6)


def test_jit_linear_regression():
  loss, batch, params = linreg_federation(jax.random.PRNGKey(0))
  alg = hypcluster(loss, optax.adam(0.05), num_clusters=2, local_steps=2,
                   key=jax.random.PRNGKey(1))
  state = alg.init(params)
  step = jax.jit(alg.step)
  for r in range(3):
    state, metrics = step(state, batch, jax.random.PRNGKey(r))
  assert state.params.shape == (6, 4) and state.models.shape == (2, 4)
  assert np.all(np.isfinite(np.asarray(state.models)))
  assert all(np.isfinite(v) for v in jax.device_get(metrics).values())


@pytest.mark.parametrize("kwargs, match", [
    ({"num_clusters": 0}, "num_clusters"),
    ({"local_steps": 0}, "local_steps"),
    ({"init_scale": float("nan")}, "init_scale"),
])
def test_bad_arguments(kwargs, match):
  args = {"num_clusters": 2, "key": jax.random.key(0)}
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    hypcluster(quadratic, optax.sgd(0.1), **args)
  with pytest.raises(TypeError, match="optimizer"):
    hypcluster(quadratic, None, num_clusters=2, key=jax.random.key(0))
  with pytest.raises(ValueError, match="init_models"):
    hypcluster(quadratic, optax.sgd(0.1), num_clusters=2)


def test_batch_not_divisible_by_local_steps():
  alg = hypcluster(quadratic, optax.sgd(0.1), num_clusters=2, local_steps=2,
                   init_models=jnp.zeros(2))
  state = alg.init(jnp.zeros(4))
  with pytest.raises(ValueError, match="local_steps"):
    alg.step(state, jnp.zeros((4, 3)), jax.random.PRNGKey(0))


def test_nan_client_0_does_not_poison_the_random_init():
  """Failed before: the random init copied client 0's params (NaN here)
  into every hypothesis."""
  loss, batch, params = linreg_federation(jax.random.PRNGKey(0))
  params = params.at[0].set(jnp.nan)
  alg = hypcluster(loss, optax.sgd(0.05), num_clusters=2,
                   key=jax.random.key(1))
  state, _ = jax.jit(alg.step)(alg.init(params), batch, jax.random.key(2))
  assert np.all(np.isfinite(np.asarray(state.models)))


def test_hypcluster_keeps_an_empty_hypothesis():
  """SGD 0.1 with momentum 0.9, hypotheses 0 and 4: round 1 targets 0, 1
  pick hypothesis 0 and 5, 9 hypothesis 4 (which moves to 4.3, trace -3);
  round 2 every target is -10, so hypothesis 1 has no client and must keep
  4.3 and its trace. Seen to fail when empty hypotheses step too (session
  14's sampled survivor algorithms #166, `sizes > 0` -> `sizes >= 0`: the
  trace alone moves it to 4.57); the SGD tests without momentum step an
  empty hypothesis by 0."""
  alg = hypcluster(quadratic, optax.sgd(0.1, momentum=0.9), num_clusters=2,
                   init_models=jnp.array([0.0, 4.0]))
  step = jax.jit(alg.step)
  state, _ = step(alg.init(jnp.zeros(4)),
                  jnp.array([[0.0], [1.0], [5.0], [9.0]]), jax.random.key(0))
  np.testing.assert_array_equal(state.assignment, [0, 0, 1, 1])
  np.testing.assert_allclose(state.models, [0.05, 4.3], rtol=1e-6)
  state, _ = step(state, jnp.full((4, 1), -10.0), jax.random.key(1))
  np.testing.assert_array_equal(state.assignment, [0, 0, 0, 0])
  np.testing.assert_allclose(state.models[1], 4.3, rtol=1e-6)


def test_hypcluster_steps_a_hypothesis_with_one_client():
  """SGD 0.5, hypotheses 0 and 10, targets 0, 1, 8: clients 0-1 pick
  hypothesis 0 (mean gradient -0.5: 0.25) and client 2 alone picks
  hypothesis 1 (gradient 10 - 8 = 2: 10 - 0.5 * 2 = 9). Seen to fail with
  `sizes > 1` for the non-empty test (census survivor algorithms #167 at
  9158dc9: the lone client's hypothesis stays 10); in the tests above
  every hypothesis in use had two or more clients."""
  alg = hypcluster(quadratic, optax.sgd(0.5), num_clusters=2,
                   init_models=jnp.array([0.0, 10.0]))
  state, _ = jax.jit(alg.step)(alg.init(jnp.zeros(3)),
                               jnp.array([[0.0], [1.0], [8.0]]),
                               jax.random.key(0))
  np.testing.assert_array_equal(state.assignment, [0, 0, 1])
  np.testing.assert_allclose(state.models, [0.25, 9.0], rtol=1e-6)
