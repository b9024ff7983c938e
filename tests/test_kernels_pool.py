"""Tests of `prfl_jax.kernels.pool`: max-pooling with a slice-based gradient.

Mutations seen caught (each made once, then undone):
  * `first = (s == y)` without `& ~taken` (every tied tap gets the gradient):
    `test_values_and_gradient_match_reduce_window` fails on the tied inputs;
  * taps visited in reverse order (last maximum instead of the first): it
    fails too;
  * the interior padding `st - 1` of the transposed slice dropped: the strided
    cases fail;
  * the tiling path (`_tiled_bwd`) taking the last maximum (`jnp.max` of the
    tied taps' indices): the `flax_2x2` and `nchw` cases fail;
  * its tap index column-major over the window (`prod(window[:d])`): the
    `nchw` case (a 2x3 window) fails.
"""

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax.kernels import pool

# name: (input shape, window, strides, padding) of reduce_window_max.
CASES = {
    "flax_2x2": ((2, 6, 6, 3), (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4),
    "uneven_2x2": ((2, 5, 7, 3), (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4),
    "overlap_same": ((2, 5, 7, 3), (1, 3, 3, 1), (1, 2, 2, 1),
                     ((0, 0), (1, 1), (0, 1), (0, 0))),
    "1d_stride1": ((2, 9, 3), (1, 3, 1), (1, 1, 1), ((0, 0), (2, 1), (0, 0))),
    "nchw": ((2, 3, 8, 6), (1, 1, 2, 3), (1, 1, 2, 3), ((0, 0),) * 4),
}


def _params(window, strides, padding):
  n = len(window)
  return dict(window_dimensions=window, window_strides=strides,
              padding=padding, base_dilation=(1,) * n,
              window_dilation=(1,) * n)


def _reference(x, p):
  return lax.reduce_window(x, -jnp.inf, lax.max, p["window_dimensions"],
                           p["window_strides"], p["padding"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradient_match_reduce_window(name):
  """Same values and vjp as `reduce_window_max`, ties included.

  The vjp is bit-identical where windows do not overlap; where they do, the
  contributions to one input are summed in another order (1 ulp).

  The input is a ReLU of rounded normals, so many windows hold several equal
  maxima (zeros, integers): the gradient must go to the first of them.
  """
  shape, window, strides, padding = CASES[name]
  p = _params(window, strides, padding)
  rng = np.random.default_rng(0)
  x = np.maximum(np.round(2 * rng.standard_normal(shape)), 0).astype(
      np.float32)

  @jax.jit
  def run(x):
    y, vjp = jax.vjp(lambda x: _reference(x, p), x)
    ours, our_vjp = jax.vjp(lambda x: pool.max_pool(x, p), x)
    dy = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    return y, ours, vjp(dy)[0], our_vjp(dy)[0]

  y, ours, dx, our_dx = run(x)
  np.testing.assert_array_equal(ours, y)
  np.testing.assert_allclose(our_dx, dx, rtol=1e-6, atol=1e-6)
  if window == strides:
    np.testing.assert_array_equal(our_dx, dx)
  # Both ways of writing dx are exercised: interleaved where windows tile.
  assert pool.tiles(p, shape) == (name in ("flax_2x2", "nchw"))


def test_matches_flax_max_pool_under_vmap():
  """The equation flax's `max_pool` emits matches, also under vmap and grad."""
  x = np.random.default_rng(1).standard_normal((3, 2, 6, 4, 5)).astype(
      np.float32)
  jaxpr = jax.make_jaxpr(lambda x: nn.max_pool(x, (2, 2), (2, 2)))(x[0])
  (eqn,) = jaxpr.jaxpr.eqns
  assert eqn.primitive is lax.reduce_window_max_p
  assert pool.matches(eqn.params, eqn.invars[0].aval)
  loss = lambda f: lambda x: jnp.sum(jnp.sin(f(x)))
  ref = jax.jit(jax.vmap(jax.grad(loss(
      lambda x: nn.max_pool(x, (2, 2), (2, 2))))))(x)
  ours = jax.jit(jax.vmap(jax.grad(loss(
      lambda x: pool.max_pool(x, eqn.params)))))(x)
  np.testing.assert_array_equal(ours, ref)


def test_matches_declines():
  """Dilations, huge windows and integer inputs keep `reduce_window_max`."""
  aval = jax.ShapeDtypeStruct((2, 8, 8, 3), jnp.float32)
  p = _params((1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4)
  assert pool.matches(p, aval)
  assert not pool.matches(dict(p, base_dilation=(1, 2, 1, 1)), aval)
  assert not pool.matches(dict(p, window_dilation=(1, 2, 1, 1)), aval)
  assert not pool.matches(dict(p, window_dimensions=(1, 8, 9, 1)), aval)
  assert not pool.matches(p, jax.ShapeDtypeStruct(aval.shape, jnp.int32))
