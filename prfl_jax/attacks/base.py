"""The attack interface and what every attack shares."""

from typing import Any, Callable

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib

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
  """
  w = (~byzantine).astype(jnp.float32)
  mean = tree_lib.weighted_mean(messages, w)
  var = tree_lib.weighted_mean(
      jax.tree.map(lambda m, mu: jnp.square(m - mu[None]), messages, mean), w)
  count = jnp.sum(w)
  scale = count / jnp.maximum(count - ddof, 1.0)
  return mean, jax.tree.map(lambda v: jnp.sqrt(v * scale), var)
