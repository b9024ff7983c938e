"""Krum, Multi-Krum and Bulyan: rules that select rows by their neighbours.

Krum scores a row by the squared distances to its nearest other rows
(Blanchard et al., 2017); Bulyan selects rows by Krum again and again and
then averages, per coordinate, the values nearest the median of the
selection (El Mhamdi, Guerraoui and Rouault, 2018).
"""

from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.aggregators import base
from prfl_jax.aggregators import coordinate

PyTree = base.PyTree
Aggregator = base.Aggregator


def check_krum(num_byzantine: int, num_clients: int):
  """Raises ValueError unless Krum's `2 f + 2 < N` (Blanchard et al.) holds."""
  if 2 * num_byzantine + 2 >= num_clients:
    raise ValueError(
        f"`num_byzantine`={num_byzantine} is too large for Krum with N="
        f"{num_clients} messages: Krum needs N > 2 * num_byzantine + 2 "
        f"(here num_byzantine <= {max((num_clients - 3) // 2, -1)}).")


def krum_scores(d2: jax.Array, present: jax.Array,
                num_byzantine: int) -> jax.Array:
  """`[N]` Krum scores over the present rows (absent rows: +inf).

  `score_i = sum of d2[i, j] over the m - f - 2 nearest other present rows`
  (at least 1), m = the present count.
  """
  n = d2.shape[0]
  pair = present[:, None] & present[None, :] & ~jnp.eye(n, dtype=bool)
  d2 = jnp.where(pair, d2, jnp.inf)
  neighbours = jnp.maximum(jnp.sum(present) - num_byzantine - 2, 1)
  nearest = jnp.sort(d2, axis=1)
  rank = jnp.arange(n)[None, :]
  score = jnp.sum(jnp.where(rank < neighbours, nearest, 0.0), axis=1)
  return jnp.where(present, score, jnp.inf)


def krum(num_byzantine: int, num_selected: int = 1) -> Aggregator:
  """Krum and Multi-Krum (Blanchard et al., 2017).

  With n present rows, `score_i = sum of ||x_i - x_j||^2 over the n -
  num_byzantine - 2 nearest other present rows` (at least 1); the aggregate
  is the (weighted) mean of the `num_selected` lowest-scoring rows (ties:
  lower index). `num_selected=1` is Krum.

  Args:
    num_byzantine: f, the number of Byzantine rows Krum must tolerate.
    num_selected: m, rows averaged (Multi-Krum when m > 1).

  Raises:
    ValueError: on a negative `num_byzantine` or `num_selected < 1` at once;
      when `agg` is traced, if `2 * num_byzantine + 2 >= N` or
      `num_selected > N`.
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)
  validation.check_positive_int(num_selected, "num_selected")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    check_krum(num_byzantine, n)
    if num_selected > n:
      raise ValueError(
          f"`num_selected`={num_selected} exceeds the N={n} messages.")
    n, weights, present, zeroed = base.prepare(messages, weights)
    score = krum_scores(base.scaled_sq_distances(zeroed), present,
                        num_byzantine)
    # Present rows first (a lone present row has an infinite score), then by
    # score, then by index.
    order = jnp.lexsort((jnp.arange(n), score, ~present))
    selected = jnp.zeros((n,), bool).at[order[:num_selected]].set(True)
    return base.selected_mean(zeroed, weights, selected & present)
  return agg


def bulyan(num_byzantine: int) -> Aggregator:
  """Bulyan (El Mhamdi, Guerraoui and Rouault, 2018), over Krum.

  With n present rows and f = `num_byzantine` (n >= 4 f + 3):

  1. Selection: theta = n - 2 f times, Krum (`krum_scores` with the same f,
     recomputed on the rows not yet selected) picks the lowest-scoring
     remaining row (ties: lower index) and moves it to the selection S.
  2. Aggregation: per coordinate k, the mean of the beta = theta - 2 f
     values of S nearest the coordinate-wise median of S.

  Weights: the median is S's weighted median and the beta values are
  averaged with their rows' weights; counts are rows.

  Args:
    num_byzantine: f >= 0.

  Raises:
    ValueError: on a negative `num_byzantine`; when `agg` is traced, if
      `4 * num_byzantine + 3 > N`.

  References:
    El Mhamdi, Guerraoui and Rouault, 2018, "The Hidden Vulnerability of
    Distributed Learning in Byzantium", Section 4 (Bulyan over Krum).
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    base.check_num_byzantine(num_byzantine, n + 1, "Bulyan", factor=4,
                             extra=3)
    n, weights, present, zeroed = base.prepare(messages, weights)
    d2 = base.scaled_sq_distances(zeroed)
    count = jnp.sum(present)
    theta = count - 2 * num_byzantine

    def pick(step, selected):
      remaining = present & ~selected
      score = krum_scores(d2, remaining, num_byzantine)
      order = jnp.lexsort((jnp.arange(n), score, ~remaining))
      return selected.at[order[0]].set(selected[order[0]] | (step < theta))

    selected = lax.fori_loop(0, n, pick, jnp.zeros((n,), bool)) & present
    sw = jnp.where(selected, weights, 0.0)
    beta = theta - 2 * num_byzantine
    return jax.tree.map(
        lambda x: coordinate.mean_around_median(x, selected, sw, beta),
        zeroed)
  return agg
