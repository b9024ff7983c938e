"""What one model of Federated-Clustering receives: attack, then defence.

Federated-Clustering (Werner et al., 2023, Algorithm 1, line 7) clusters,
at every model i, the N gradients `g_j(x_i)`. This module builds the
`message_fn` the all-pairs engine applies to them: the Byzantine clients'
attack first (what they send), then an optional pre-aggregator from
`prfl_jax.aggregators` that keeps one row per client (NNM, clipping, ARC,
`cap_duplicates`). Rows the pre-aggregator drops (weight 0) reach
Threshold-Clustering as non-finite rows, which are outside every ball
(and count as infinitely far in a quantile radius).

The defence chosen for Federated-Clustering, `cap_duplicates`, and why, is
in `docs/design.md` ("Byzantine robustness of Federated-Clustering").
"""

from typing import Optional

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib

# Key of the pre-aggregator, folded from the message key: the attack keeps
# the key it always had, so adding a defence changes no attack's draws.
_PRE_KEY = 1


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
  return tree_lib.where(dropped, jax.tree.map(
      lambda x: jnp.full_like(x, jnp.nan), out), out)


def message_fn(attack, pre_aggregator, byzantine: jax.Array,
               weights: jax.Array) -> Optional[callable]:
  """The `message_fn(grads, i, key)` of one group, or None if it is honest
  and undefended.

  Args:
    attack: `attack(messages, byzantine, key)` or None.
    pre_aggregator: a row-preserving pre-aggregator or None.
    byzantine: `[S]` bool, the group's Byzantine slots.
    weights: `[S]` slot weights (0 on padding).
  """
  if attack is None and pre_aggregator is None:
    return None

  def fn(grads, index, key):
    del index  # Unused.
    if attack is not None:
      grads = attack(grads, byzantine, key)
    if pre_aggregator is not None:
      grads = apply_pre_aggregator(pre_aggregator, grads, weights,
                                   jax.random.fold_in(key, _PRE_KEY))
    return grads
  return fn
