"""Tests of prfl_jax.tree (stacked-client pytrees)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax import tree
from tests import tolerances


def _points(key, n):
  k1, k2 = jax.random.split(key)
  return {"w": jax.random.normal(k1, (n, 3, 2)), "b": jax.random.normal(k2, (n, 4))}


def _flat(t):
  return np.concatenate([np.asarray(t["b"]).reshape(t["b"].shape[0], -1),
                         np.asarray(t["w"]).reshape(t["w"].shape[0], -1)], 1)


def test_broadcast_stack_unstack_roundtrip():
  one = {"w": jnp.ones((3, 2)), "b": jnp.arange(4.0)}
  stacked = tree.broadcast(one, 5)
  assert stacked["w"].shape == (5, 3, 2) and stacked["b"].shape == (5, 4)
  parts = tree.unstack(stacked)
  assert len(parts) == 5
  np.testing.assert_array_equal(parts[3]["b"], one["b"])
  restacked = tree.stack(parts)
  np.testing.assert_array_equal(restacked["w"], stacked["w"])


def test_num_leading_errors():
  with pytest.raises(ValueError, match="different leading axes"):
    tree.num_leading({"a": jnp.zeros((3, 2)), "b": jnp.zeros((4,))}, "params")
  with pytest.raises(ValueError, match="scalar leaf"):
    tree.num_leading({"a": jnp.zeros(())})
  with pytest.raises(ValueError, match="no array leaves"):
    tree.num_leading({})
  with pytest.raises(ValueError, match="num_clients"):
    tree.broadcast(jnp.zeros(3), 0)


def test_distances_gram_and_means_match_numpy():
  pts = _points(jax.random.key(0), 6)
  ctr = _points(jax.random.key(1), 2)
  p, c = _flat(pts), _flat(ctr)
  d2 = ((p[:, None] - c[None]) ** 2).sum(-1)
  np.testing.assert_allclose(tree.sq_distances(pts, ctr), d2, rtol=1e-5)
  np.testing.assert_allclose(tree.gram(pts), p @ p.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(tree.inner_products(pts, ctr), p @ c.T,
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(tree.sq_norms(pts), (p ** 2).sum(1), rtol=1e-5)
  w = np.array([1.0, 0.0, 2.0, 1.0, 0.0, 1.0])
  mean = tree.weighted_mean(pts, jnp.asarray(w))
  np.testing.assert_allclose(_flat(jax.tree.map(lambda x: x[None], mean))[0],
                             (w[:, None] * p).sum(0) / w.sum(), rtol=1e-5)
  coefs = np.random.default_rng(0).normal(size=(2, 6))
  np.testing.assert_allclose(_flat(tree.combine(jnp.asarray(coefs), pts)),
                             coefs @ p, rtol=1e-4, atol=1e-5)


def test_all_finite_where_take_and_keys():
  pts = {"a": jnp.array([[1.0], [jnp.nan], [2.0]]),
         "b": jnp.array([[0.0], [1.0], [jnp.inf]])}
  np.testing.assert_array_equal(tree.all_finite(pts), [True, False, False])
  sel = tree.where(jnp.array([True, False, True]), pts,
                   jax.tree.map(jnp.zeros_like, pts))
  np.testing.assert_array_equal(sel["a"][:, 0], [1.0, 0.0, 2.0])
  np.testing.assert_array_equal(tree.take(pts, jnp.array([2, 0]))["a"][:, 0],
                                [2.0, 1.0])
  keys = tree.client_keys(jax.random.key(0), 4)
  assert keys.shape == (4,)
  assert tree.vdot({"a": jnp.ones(3)}, {"a": jnp.arange(3.0)}) == 3.0


@pytest.mark.parametrize("name", ["gram", "inner_products", "combine",
                                  "masked_combination", "weighted_mean",
                                  "vdot"])
def test_contractions_run_at_highest_whatever_the_default(name):
  """On GPUs the default float32 matmul is TF32, on TPUs bf16; the library's
  distances, Gram matrices and weighted sums must not follow it (issue 11).
  The lowered program is checked under a bf16 default (CPUs ignore the flag,
  so the HLO is what tells). Failed before for every name but `gram`.
  """
  pts = _points(jax.random.key(0), 6)
  coefs = jnp.ones((2, 6)) / 6
  fns = {
      "gram": lambda p: tree.gram(p),
      "inner_products": lambda p: tree.inner_products(p, p),
      "combine": lambda p: tree.combine(coefs, p),
      "masked_combination": lambda p: tree.masked_combination(
          coefs[0], p, jnp.arange(6) < 4),
      "weighted_mean": lambda p: tree.weighted_mean(p, coefs[0]),
      "vdot": lambda p: tree.vdot(jax.tree.map(lambda x: x[0], p),
                                  jax.tree.map(lambda x: x[1], p)),
  }
  with jax.default_matmul_precision("bfloat16"):
    assert tolerances.all_highest(fns[name], pts), tolerances.dot_precisions(
        fns[name], pts)
