"""FedAvg (Global) with a robust aggregator in place of the mean.

Mutations seen to fail these tests: `fedavg` ignoring `aggregator` (the median
round and the robustness test fail), the default path routed through
`aggregators.median()` (the bit-identity test fails).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import aggregators
from tests.toy import linreg_federation
from tests.toy import quadratic


def _run(alg, params, batch, byz=None, rounds=3):
  state = alg.init(params, byzantine=byz)
  step = jax.jit(alg.step)
  for r in range(rounds):
    state, _ = step(state, batch, jax.random.key(r))
  return state


def test_default_and_mean_aggregator_are_bit_identical():
  loss, batch, params = linreg_federation(jax.random.key(0))
  a = _run(prfl.algorithms.fedavg(loss, optax.sgd(0.05)), params, batch)
  b = _run(prfl.algorithms.fedavg(loss, optax.sgd(0.05),
                                  aggregator=aggregators.mean()),
           params, batch)
  np.testing.assert_array_equal(a.params, b.params)


@pytest.mark.parametrize("local_steps", [1, 2])
def test_median_round_matches_numpy(local_steps):
  """x <- x - lr * median_j(messages); Byzantine rows send 1e4 x theirs."""
  targets = np.array([0.0, 1.0, 2.0, 4.0, 30.0])
  byz = np.array([False, False, False, False, True])
  lr = 0.5
  batch = jnp.asarray(np.stack([targets] * 2, axis=1))  # [N, B=2].
  alg = prfl.algorithms.fedavg(quadratic, optax.sgd(lr),
                               local_steps=local_steps,
                               attack=prfl.attacks.large(1e4),
                               aggregator=aggregators.median())
  state = alg.init(jnp.full(5, 3.0), byzantine=jnp.asarray(byz))
  state, _ = alg.step(state, batch, jax.random.key(0))
  if local_steps == 1:
    grads = 3.0 - targets
    grads[byz] *= 1e4
    expected = 3.0 - lr * np.median(grads)
  else:  # Two local steps of x <- x - lr (x - c), then model changes.
    local = np.full(5, 3.0)
    for _ in range(2):
      local = local - lr * (local - targets)
    deltas = local - 3.0
    deltas[byz] *= 1e4
    expected = 3.0 + np.median(deltas)
  np.testing.assert_allclose(state.params, np.full(5, expected), rtol=1e-6)


def test_robust_aggregators_resist_an_attack_the_mean_does_not():
  loss, batch, params = linreg_federation(jax.random.key(1), num_clusters=1,
                                          per_cluster=7)
  byz = jnp.array([False] * 5 + [True] * 2)
  attack = prfl.attacks.large(1e4)
  clean = _run(prfl.algorithms.fedavg(loss, optax.sgd(0.05)), params, batch,
               rounds=20)
  for agg in [aggregators.median(), aggregators.trimmed_mean(0.3),
              aggregators.krum(2), aggregators.geometric_median(10),
              aggregators.centered_clipping(1.0, 3)]:
    s = _run(prfl.algorithms.fedavg(loss, optax.sgd(0.05), attack=attack,
                                    aggregator=agg), params, batch, byz,
             rounds=20)
    assert np.abs(np.asarray(s.params) - clean.params).max() < 0.2
  s = _run(prfl.algorithms.fedavg(loss, optax.sgd(0.05), attack=attack),
           params, batch, byz, rounds=20)
  err = np.abs(np.asarray(s.params) - clean.params)
  assert np.nan_to_num(err, nan=np.inf).max() > 10.0  # Diverges (or NaN).


def test_aggregator_must_be_callable():
  with pytest.raises(TypeError, match="aggregator"):
    prfl.algorithms.fedavg(quadratic, optax.sgd(0.1), aggregator="median")
