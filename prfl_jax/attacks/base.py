"""The attack interface and what every attack shares."""

from typing import Any, Callable

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax.aggregators import base as agg_base

PyTree = Any
Attack = Callable[[PyTree, jax.Array, jax.Array], PyTree]


def replace(messages: PyTree, byzantine: jax.Array, bad: PyTree) -> PyTree:
  """Rows of `bad` (leaves `[N, ...]` or `[...]`) where `byzantine`."""
  bad = jax.tree.map(lambda b, m: jnp.broadcast_to(b, m.shape).astype(m.dtype),
                     bad, messages)
  return tree_lib.where(byzantine, bad, messages)


def benign_stats(messages: PyTree, byzantine: jax.Array, ddof: int = 0):
  """Coordinate-wise mean and std over benign clients (leaves `[...]`).

  `ddof=1` gives the sample standard deviation (ByzFL's ALIE).

  The deviations from the mean are squared times a power of two per
  coordinate, 2^k bringing the largest benign one into [0.5, 1), and the
  std multiplied back by 2^-k (each applied as two normal factors): exact,
  so the std is as before wherever the squares neither overflow nor
  underflow, and right for float32 rows ~1e19 (squares inf) or ~1e-22
  (squares 0). The Byzantine rows' deviations are left out (their weight is
  0 anyway; an inf square would make 0 * inf = NaN).
  """
  w = (~byzantine).astype(jnp.float32)
  mean = tree_lib.weighted_mean(messages, w)
  count = jnp.sum(w)
  scale = count / jnp.maximum(count - ddof, 1.0)

  def std(m, mu):
    dev = m - mu[None]
    dev = jnp.where(byzantine.reshape((-1,) + (1,) * (dev.ndim - 1)), 0.0,
                    dev).astype(dev.dtype)
    _, e = jnp.frexp(jnp.max(jnp.abs(dev), axis=0).astype(
        jnp.result_type(dev.dtype, jnp.float32)))
    low = -e // 2
    high = -e - low
    var = tree_lib.weighted_mean(jnp.square(
        dev * agg_base.power_of_two(low, dev.dtype) *
        agg_base.power_of_two(high, dev.dtype)), w)
    return (jnp.sqrt(var * scale) * agg_base.power_of_two(-low, var.dtype) *
            agg_base.power_of_two(-high, var.dtype))
  return mean, jax.tree.map(std, messages, mean)
