"""bfloat16 / float16 points and models on every clustering path.

Failed before the fix, on every Gram path (`threshold_clustering(...,
method="gram")`, FC with an attack, `kernel="gram"`, and the ghost kernel's
final clustering step): `gram_clustering_coefs` started its loop carry in the
points' dtype, its body promoted it to float32, and `fori_loop` raised a
TypeError ("carry input and carry output must have equal types").
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from tests import reference

DTYPES = [jnp.bfloat16, jnp.float16]


def _eps(dtype) -> float:
  return float(jnp.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["direct", "gram"])
def test_threshold_clustering_in_low_precision_matches_numpy(dtype, method):
  """Two groups 6 apart, radius 2: the balls are clear-cut, so the only error
  is rounding. Tolerance: the centre is an average of points of magnitude
  <= 7 rounded to `dtype` at each of 5 steps, and the Gram path forms
  squared distances (up to 49) in the points' dtype: 64 eps * 7."""
  rng = np.random.default_rng(0)
  points = np.concatenate([rng.normal(0.0, 0.3, (5, 4)),
                           rng.normal(6.0, 0.3, (5, 4))])
  points = jnp.asarray(points, dtype)
  init = points[jnp.array([0, 5])]
  out = prfl.threshold_clustering(points, init, radius=2.0, num_iters=5,
                                  method=method)
  assert out.dtype == dtype
  want = reference.threshold_clustering(np.asarray(points, np.float64),
                                        np.asarray(init, np.float64), 2.0, 5)
  np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=0,
                             atol=64 * _eps(dtype) * 7)


PLANS = {"gram": dict(plan=prfl.ExecutionPlan(kernel="gram")),
         "ghost": dict(plan=prfl.ExecutionPlan(kernel="ghost")),
         "auto+attack": dict(attack=prfl.attacks.gaussian(1.0))}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_federated_clustering_round_in_low_precision(dtype, plan):
  """One FC round on `dtype` data and models equals the float32 round on the
  same (already rounded) values, to the dtype's rounding: the update is
  lr * (a gradient of magnitude <= ~10 accumulated in `dtype`), so 8 eps."""
  data = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                        clients_per_cluster=3, dim=4,
                                        num_samples=5)[0]
  train = jax.tree.map(lambda x: x.astype(dtype), data.train)
  params = jax.random.normal(jax.random.key(1), (6, 4)).astype(dtype)
  alg = prfl.algorithms.federated_clustering(
      prfl.data.regression_loss, optax.sgd(1e-2),
      radius=prfl.quantile_radius(0.5), **PLANS[plan])
  byz = np.arange(6) == 5
  low, _ = jax.jit(alg.step)(alg.init(params, byzantine=byz), train,
                             jax.random.key(2))
  as32 = lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t)
  full, _ = jax.jit(alg.step)(alg.init(as32(params), byzantine=byz),
                              as32(train), jax.random.key(2))
  assert low.params.dtype == dtype
  np.testing.assert_allclose(np.asarray(low.params, np.float32)[~byz],
                             np.asarray(full.params)[~byz], rtol=0,
                             atol=8 * _eps(dtype) * float(
                                 jnp.max(jnp.abs(full.params))))
