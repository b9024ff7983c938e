"""Which clients take part in a round: the cohort and its dropouts.

A round's cohort is a pure function of the round's key, so `prfl.train` can
draw the cohorts of a whole chunk of rounds ahead on the host (to gather
their data and state) and get exactly the clients the step draws in jit.

* Uniform (default): C of the N clients without replacement, by Floyd's
  algorithm (Bentley and Floyd, 1987): C draws, each O(C), so a round never
  touches an O(N) array. Exactly uniform over the C-subsets.
* Weighted: successive sampling proportional to `weights` without
  replacement (Efraimidis and Spirakis, 2006) as a Gumbel top-C; this one
  reads all N weights, O(N) per round.
* Dropouts: `floor(dropout * C)` of the C drawn clients, uniformly at
  random, fail; the other `C - floor(dropout * C)` (at least one) arrive.

Both member lists are sorted, so `cohort_size=N` without dropouts is
`arange(N)` and the cohort's gathers and scatters are the identity.
"""

import math
import numbers
from typing import NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np


class Members(NamedTuple):
  """One round's participants."""
  index: jax.Array  # [C - D] int32 sorted: clients whose messages arrive.
  dropped: jax.Array  # [D] int32 sorted: drawn clients that failed.


def check_cohort_size(cohort_size) -> int:
  """Raises ValueError unless `cohort_size` is an integer >= 1."""
  if (not isinstance(cohort_size, numbers.Integral) or
      isinstance(cohort_size, bool) or cohort_size < 1):
    raise ValueError(
        f"`cohort_size` must be an integer >= 1 (clients per round), got "
        f"{cohort_size!r}.")
  return int(cohort_size)


def check_dropout(dropout) -> float:
  """Raises ValueError unless `dropout` is a real number in [0, 1)."""
  if (not isinstance(dropout, numbers.Real) or isinstance(dropout, bool) or
      not 0.0 <= float(dropout) < 1.0):
    raise ValueError(
        f"`dropout` must be a number in [0, 1) (the share of the cohort that "
        f"fails each round), got {dropout!r}.")
  return float(dropout)


def num_dropped(cohort_size: int, dropout: float) -> int:
  """D = floor(dropout * C): the failures of every round (D < C)."""
  return int(math.floor(dropout * cohort_size + 1e-9))


def check_weights(weights, num_clients: int, cohort_size: int) -> np.ndarray:
  """Validates sampling weights `[N]`; returns them as float32 NumPy.

  Raises:
    ValueError: unless `weights` is `[N]`, finite, >= 0 with at least
      `cohort_size` positive entries.
  """
  w = np.asarray(weights, np.float64)
  if w.shape != (num_clients,) or not np.all(np.isfinite(w)) or np.any(w < 0):
    raise ValueError(
        f"`weights` must be [{num_clients}] finite numbers >= 0 (e.g. each "
        f"client's example count), got shape {w.shape}.")
  if np.count_nonzero(w) < cohort_size:
    raise ValueError(
        f"`weights` has {np.count_nonzero(w)} positive entries, fewer than "
        f"`cohort_size`={cohort_size}.")
  return w.astype(np.float32)


def uniform_subset(key: jax.Array, num_clients: int,
                   size: int) -> jax.Array:
  """`size` distinct clients of `num_clients`, uniformly; `[size]` sorted.

  Floyd's algorithm: for j = N - C, ..., N - 1 draw t in [0, j]; take t, or
  j when t was taken already. O(C^2) work, no O(N) array.
  """
  keys = jax.random.split(key, size)
  first = num_clients - size

  def body(j, chosen):
    high = first + j
    t = jax.random.randint(keys[j], (), 0, high + 1, jnp.int32)
    taken = jnp.any(chosen == t)
    return chosen.at[j].set(jnp.where(taken, high, t).astype(jnp.int32))

  chosen = lax.fori_loop(0, size, body, jnp.full((size,), -1, jnp.int32))
  return jnp.sort(chosen)


def weighted_subset(key: jax.Array, weights: jax.Array,
                    size: int) -> jax.Array:
  """`size` distinct clients drawn successively with prob. ∝ `weights`.

  The Gumbel top-k form of Efraimidis and Spirakis (2006); weight-0
  clients are never drawn. `[size]` sorted int32.
  """
  scores = jnp.log(weights) + jax.random.gumbel(key, weights.shape)
  _, index = lax.top_k(scores, size)
  return jnp.sort(index.astype(jnp.int32))


def draw(key: jax.Array, num_clients: int, cohort_size: int,
         num_failed: int, weights: Optional[jax.Array] = None) -> Members:
  """The round's cohort and its dropouts, from the round's cohort key.

  Args:
    key: PRNG key.
    num_clients: N.
    cohort_size: C <= N.
    num_failed: D < C, drawn clients that fail.
    weights: optional `[N]` sampling weights (None: uniform).

  Returns:
    `Members(index [C - D], dropped [D])`, both sorted.
  """
  pick_key, fail_key = jax.random.split(key)
  if weights is None:
    drawn = uniform_subset(pick_key, num_clients, cohort_size)
  else:
    drawn = weighted_subset(pick_key, jnp.asarray(weights), cohort_size)
  if num_failed == 0:
    return Members(drawn, jnp.zeros((0,), jnp.int32))
  order = jax.random.permutation(fail_key, cohort_size)
  return Members(jnp.sort(drawn[order[num_failed:]]),
                 jnp.sort(drawn[order[:num_failed]]))
