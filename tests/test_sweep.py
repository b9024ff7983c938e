"""Tests of prfl_jax.sweep: a vmapped sweep equals the runs one at a time."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import sweep as sweep_lib
from tests import tolerances


def _federation():
  data, _ = prfl.data.synthetic_regression(
      jax.random.PRNGKey(0), num_clusters=2, clients_per_cluster=3, dim=4,
      num_samples=3)
  return data


def _make_algorithm(hp):
  return prfl.algorithms.federated_clustering(
      prfl.data.regression_loss, optax.sgd(hp["lr"]),
      radius=prfl.quantile_radius(hp["q"]), num_iters=3)


def test_grid_order_and_keys():
  hp, keys = sweep_lib.grid(jnp.array([7, 8]), lr=jnp.array([0.1, 0.2, 0.3]),
                            q=jnp.array([0.5, 0.9]))
  assert keys.shape[0] == 12
  np.testing.assert_array_equal(hp["seed"], np.repeat([7, 8], 6))
  np.testing.assert_allclose(hp["lr"], np.tile(np.repeat([.1, .2, .3], 2), 2))
  np.testing.assert_allclose(hp["q"], np.tile([0.5, 0.9], 6))
  np.testing.assert_array_equal(keys[6], jax.random.PRNGKey(8))
  with pytest.raises(ValueError, match="`lr` must be a non-empty 1-D"):
    sweep_lib.grid(jnp.arange(2), lr=jnp.zeros((2, 2)))


@pytest.mark.parametrize("sampled", [False, True])
def test_sweep_equals_individual_runs(sampled):
  data = _federation()
  n, d = data.train["a"].shape[0], data.train["a"].shape[2]
  if sampled:  # Minibatches drawn in the scan, a per-run initialisation.
    batches = functools.partial(prfl.data.sample_batch, train=data.train,
                                batch_size=2)
    params = lambda key: 0.1 * jax.random.normal(key, (n, d))
  else:  # Full local datasets, one shared initialisation.
    batches = data.train
    params = jnp.zeros((n, d))
  evaluate = lambda state: jax.vmap(prfl.data.regression_eval)(
      state.params, data.test)
  hp, keys = sweep_lib.grid(jnp.arange(2), lr=jnp.array([0.01, 0.05]),
                            q=jnp.array([0.3, 0.8]))
  num_rounds = 12
  result = jax.jit(lambda h, k: sweep_lib.sweep(
      _make_algorithm, h, params, batches, num_rounds, keys=k,
      evaluate=evaluate))(hp, keys)
  g = keys.shape[0]
  assert result.metrics["loss"].shape == (g, num_rounds)
  assert result.state.params.shape == (g, n, d)
  one = jax.jit(lambda h, k: sweep_lib.run(
      _make_algorithm, h, params, batches, num_rounds, key=k,
      evaluate=evaluate))
  for i in range(g):
    alone = one(jax.tree.map(lambda x, i=i: x[i], hp), keys[i])
    jax.tree.map(lambda a, r, i=i: np.testing.assert_allclose(
        a[i], r, **tolerances.model(1e-4, 1e-5)), result, alone)
  # The hyperparameters matter: runs differ across the grid.
  assert np.ptp(np.asarray(result.final["error"]).mean(axis=1)) > 1e-3


def test_sweep_checks_grid_axis():
  data = _federation()
  hp = {"lr": jnp.array([0.1, 0.2]), "q": jnp.array([0.5, 0.5])}
  with pytest.raises(ValueError, match="same leading grid axis"):
    sweep_lib.sweep(_make_algorithm, hp, jnp.zeros((6, 4)), data.train, 2,
                    keys=jax.random.split(jax.random.PRNGKey(0), 3))
  with pytest.raises(ValueError, match="num_rounds"):
    sweep_lib.run(_make_algorithm, {"lr": 0.1, "q": 0.5}, jnp.zeros((6, 4)),
                  data.train, 0, key=jax.random.PRNGKey(0))
