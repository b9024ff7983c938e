"""Nearest-neighbour averaging: MoNNA, and the mixing step NNM is built on."""

from typing import Optional

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.aggregators import base

PyTree = base.PyTree
Aggregator = base.Aggregator


def neighbour_means(zeroed: PyTree, weights: jax.Array, present: jax.Array,
                    rows: jax.Array, count) -> PyTree:
  """For each of the `rows` (`[M]` indices), the weighted mean of its
  `count` nearest present rows, itself included when present (ties: lower
  index). Returns leaves `[M, ...]`."""
  d2 = base.scaled_sq_distances(zeroed)[rows]
  chosen = base.nearest(d2, present, count)  # [M, N]
  coefs = jnp.where(chosen, weights[None, :], 0.0)
  total = jnp.sum(coefs, axis=1, keepdims=True)
  return tree_lib.combine(coefs / jnp.where(total > 0, total, 1.0), zeroed)


def monna(num_byzantine: int, index: int = 0) -> Aggregator:
  """MoNNA (Farhadkhani et al., 2023): mean of a trusted row's neighbours.

    MoNNA_{f, idx}(x_1..x_n) = 1/(n - f) * sum_{i in N_idx} x_i,

  `N_idx` the n - f nearest present rows to row `index` (itself included;
  ties: lower index), n the present count. The trusted row is assumed
  present; if it is absent or non-finite its distances are those of a zero
  row. Weights: the neighbours are averaged with their weights.

  Args:
    num_byzantine: f, with 2 f < N.
    index: the trusted row (a peer's own message in peer-to-peer learning).

  Raises:
    ValueError: on a negative `num_byzantine` or `index`; when `agg` is
      traced, if `2 f >= N` or `index >= N`.

  References:
    Farhadkhani, Guerraoui, Gupta, Hoang, Pinot and Stephan, 2023, "Robust
    Collaborative Learning with Linear Gradient Overhead", ICML (MoNNA);
    ByzFL's `MoNNA`.
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)
  validation.check_positive_int(index, "index", minimum=0)

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    base.check_num_byzantine(num_byzantine, n, "MoNNA")
    if index >= n:
      raise ValueError(f"`index`={index} must be below N={n}.")
    _, weights, present, zeroed = base.prepare(messages, weights)
    out = neighbour_means(zeroed, weights, present, jnp.array([index]),
                          jnp.sum(present) - num_byzantine)
    return jax.tree.map(lambda x: x[0], out)
  return agg
