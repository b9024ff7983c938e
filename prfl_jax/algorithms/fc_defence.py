"""What one model of Federated-Clustering receives: attack, then defence.

Federated-Clustering (Werner et al., 2023, Algorithm 1, line 7) clusters,
at every model i, the N gradients `g_j(x_i)`. This module builds the
`message_fn` the all-pairs engine applies to them: the Byzantine clients'
attack first (what they send), then an optional pre-aggregator from
`prfl_jax.aggregators` that keeps one row per client (NNM, clipping, ARC,
`cap_duplicates`). Rows the pre-aggregator drops (weight 0) reach
Threshold-Clustering as non-finite rows, which are outside every ball
(and count as infinitely far in a quantile radius).

It also holds the defence that looks across models: `ball_cap`, a limit on
how many of a round's balls one client's messages may join
(`defended_clustering` runs the two clustering passes it needs).

The defence chosen for Federated-Clustering, `cap_duplicates` with
`ball_cap`, and why, is in `docs/design.md` ("Byzantine robustness of
Federated-Clustering").
"""

import math
import numbers
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib

# Keys of the pre-aggregator (folded from the message key) and of the ball
# cap (folded from the group key): the attack keeps the key it always had,
# so adding a defence changes no attack's draws. The pre-aggregator's
# constant is int32's largest: attacks draw from `fold_in(key, c)` for
# small c (`attacks.jittered` folds 0 and 1), and `split(key, n)[c]` is
# `fold_in(key, c)` for every c < n (JAX's partitionable threefry), so only
# a split into 2^31 keys reaches it.
_PRE_KEY = 2**31 - 1
_CAP_KEY = 2


def apply_pre_aggregator(pre_aggregator, messages, weights: jax.Array,
                         key: jax.Array):
  """`pre_aggregator` on one model's rows; dropped rows become NaN.

  Args:
    pre_aggregator: `pre(messages, weights, key) -> (messages, weights)`
      keeping one row per client.
    messages: leaves `[S, ...]`.
    weights: `[S]` (0 on padding slots).
    key: PRNG key of the pre-aggregator.

  Returns:
    leaves `[S, ...]`: the transformed rows, NaN where a present row was
    dropped.

  Raises:
    ValueError: if the pre-aggregator changes the number of rows (e.g.
      bucketing: Threshold-Clustering needs one row per client).
  """
  out, out_w = pre_aggregator(messages, weights, key)
  s = tree_lib.num_leading(messages)
  if tree_lib.num_leading(out) != s:
    raise ValueError(
        f"`pre_aggregator` must keep one row per client ({s}), got "
        f"{tree_lib.num_leading(out)} rows (bucketing cannot run before "
        "Threshold-Clustering, whose centre starts at the owner's row).")
  dropped = (weights > 0) & (out_w <= 0)
  return _drop(out, dropped)


def _drop(messages, dropped: jax.Array):
  """Rows where `dropped` ([S] bool) become NaN: outside every ball."""
  return tree_lib.where(dropped, jax.tree.map(
      lambda x: jnp.full_like(x, jnp.nan), messages), messages)


def message_fn(attack, pre_aggregator, byzantine: jax.Array,
               weights: jax.Array,
               allowed: Optional[jax.Array] = None) -> Optional[Callable]:
  """The `message_fn(grads, i, key)` of one group, or None if it is honest
  and undefended.

  Args:
    attack: `attack(messages, byzantine, key)` or None.
    pre_aggregator: a row-preserving pre-aggregator or None.
    byzantine: `[S]` bool, the group's Byzantine slots.
    weights: `[S]` slot weights (0 on padding).
    allowed: optional `[S, S]` bool, `allowed[i, j]`: client j's message may
      take part at model i (`cap_balls`); the others are dropped (NaN) after
      the attack and the pre-aggregator.
  """
  if attack is None and pre_aggregator is None and allowed is None:
    return None

  def fn(grads, index, key):
    if attack is not None:
      grads = attack(grads, byzantine, key)
    if pre_aggregator is not None:
      grads = apply_pre_aggregator(pre_aggregator, grads, weights,
                                   jax.random.fold_in(key, _PRE_KEY))
    if allowed is not None:
      grads = _drop(grads, ~allowed[index])
    return grads
  return fn


def check_ball_cap(ball_cap):
  """Raises ValueError unless `ball_cap` is None or a finite number >= 1."""
  if ball_cap is None:
    return
  if (isinstance(ball_cap, bool) or not isinstance(ball_cap, numbers.Real)
      or not math.isfinite(ball_cap) or ball_cap < 1):
    raise ValueError(
        f"`ball_cap` must be None or a number >= 1 (a multiple of the "
        f"median number of balls a client joins), got {ball_cap!r}.")


def cap_balls(inside: jax.Array, weights: jax.Array, ball_cap: float,
              key: jax.Array) -> jax.Array:
  """Which messages may take part where: at most M balls per client.

  `inside[i, j]` says that client j's message lies in model i's ball. A
  client joins `c_j = sum_i inside[i, j]` balls; `M = ceil(ball_cap *
  median_j c_j)` over the present clients. A client in more than M balls
  keeps its own model's ball and a uniformly random choice (from `key`) of
  the others, M in all, and is dropped at every other model; a client in
  at most M balls is never dropped. Benign clients join the balls of their
  own cluster's models (about the quantile's share of the group each), while
  a Byzantine client that attacks every model would join all of them: the
  cap gives it the reach of an honest client. With fewer than half the
  clients Byzantine the median is a benign client's count, or lies between
  two of them.

  Args:
    inside: `[S, S]` bool, models x senders (the first clustering pass).
    weights: `[S]` client weights (0: absent or padding; never counted).
    ball_cap: the multiple of the median, >= 1.
    key: PRNG key of the random choice.

  Returns:
    `[S, S]` bool `allowed[i, j]`.
  """
  s = inside.shape[0]
  present = weights > 0
  member = inside & present[:, None] & present[None, :]
  counts = jnp.sum(member, axis=0)  # [S] balls per sender.
  ordered = jnp.sort(jnp.where(present, counts, s + 1))
  num = jnp.maximum(jnp.sum(present), 1)
  median = 0.5 * (ordered[(num - 1) // 2] + ordered[num // 2])
  cap = jnp.maximum(jnp.ceil(ball_cap * median), 1.0)
  # Random priority of each of a sender's balls; its own ball first.
  own = jnp.eye(s, dtype=bool)
  score = jnp.where(own, 2.0, jax.random.uniform(key, (s, s)))
  score = jnp.where(member, score, -1.0)
  rank = jnp.sum(score[None, :, :] > score[:, None, :], axis=1)  # [S, S]
  capped = counts > cap
  return own | ~capped[None, :] | (member & (rank < cap))


def defended_clustering(cluster: Callable, attack, pre_aggregator,
                        byzantine: jax.Array, weights: jax.Array,
                        key: jax.Array, ball_cap=None):
  """One group's Threshold-Clustering, with the defence of `ball_cap`.

  Args:
    cluster: `cluster(message_fn) -> kernels.PairsOutput` for the group's
      S models (the all-pairs engine with everything else fixed).
    attack, pre_aggregator, byzantine, weights: as in `message_fn`.
    key: the group's message key (the one `cluster` passes on).
    ball_cap: None (one pass), or `cap_balls`' multiple: a first pass finds
      every model's ball, `cap_balls` limits the balls each client may join,
      and a second pass clusters again with the other messages dropped. The
      attack sees the same honest messages and key in both passes, so it
      sends the same rows.

  Returns:
    the `kernels.PairsOutput` of the last pass.
  """
  first = cluster(message_fn(attack, pre_aggregator, byzantine, weights))
  if ball_cap is None:
    return first
  allowed = cap_balls(first.inside, weights, ball_cap,
                      jax.random.fold_in(key, _CAP_KEY))
  return cluster(message_fn(attack, pre_aggregator, byzantine, weights,
                            allowed))
