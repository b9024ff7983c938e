"""Attacks adapted to Federated-Clustering's defences.

`jittered` unties any attack whose Byzantine clients send one vector, so
that `aggregators.cap_duplicates` (which counts near-identical messages
once) no longer merges them; the rows move by a negligible amount.
`concentrated` spends the Byzantine clients' messages on one cluster's
models only, against the ball cap (`fc_defence.cap_balls`), which limits
how many balls a client joins but not where.
"""

import math
import numbers

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax.aggregators import base as agg_base
from prfl_jax.attacks import base

Attack = base.Attack


def jittered(attack: Attack, scale: float = 0.01) -> Attack:
  """`attack`, then each Byzantine row moved by `scale` times its norm.

  Byzantine row j becomes `b_j + scale * ||b_j|| * e_j`, with `e_j` a
  uniformly random unit direction of its own (fresh each call, from `key`;
  the wrapped attack gets a key folded from it). Two rows that were tied
  end up about `sqrt(2) * scale` of their norm apart: with the default 1%
  they are 14 times `cap_duplicates`' default tolerance (0.1%) apart, so
  every copy counts, while each moves by 1% of its norm.

  Args:
    attack: any attack (`attack(messages, byzantine, key)`).
    scale: > 0, the jitter's norm relative to the row's.

  Raises:
    TypeError: if `attack` is not callable.
    ValueError: if `scale` is not a finite number > 0.
  """
  if not callable(attack):
    raise TypeError(f"`attack` must be callable, got {type(attack)}.")
  if (isinstance(scale, bool) or not isinstance(scale, numbers.Real) or
      not math.isfinite(scale) or scale <= 0):
    raise ValueError(f"`scale` must be a finite number > 0, got {scale!r}.")

  def attacked(messages, byzantine, key):
    bad = attack(messages, byzantine, jax.random.fold_in(key, 0))
    leaves, treedef = jax.tree.flatten(bad)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
    noise = jax.tree.unflatten(treedef, [
        jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])
    # ||b_j|| / ||e_j|| with b_j brought to largest |entry| in [0.5, 1) by
    # its own power of two 2^k_j and the ratio multiplied back by 2^-k_j
    # (k_j = 0 for rows not finite): exact, so as before where ||b_j||^2
    # neither overflows nor underflows, and right for rows ~1e19 or ~1e-22.
    peaks = agg_base.row_peaks(bad)
    _, e = jnp.frexp(peaks.astype(jnp.result_type(peaks, jnp.float32)))
    ratio = scale * jnp.sqrt(tree_lib.sq_norms(
        agg_base.times_power_of_two(bad, -e)) / jnp.maximum(
            tree_lib.sq_norms(noise), 1e-30))
    ratio = agg_base.times_power_of_two(ratio, e)
    moved = jax.tree.map(
        lambda b, e: b + ratio.reshape((-1,) + (1,) * (b.ndim - 1)).astype(
            b.dtype) * e, bad, noise)
    return base.replace(messages, byzantine, moved)
  return attacked


def concentrated(attack: Attack, share: float = 0.5) -> Attack:
  """`attack` at the models of one benign client's cluster, NaN elsewhere.

  Federated-Clustering calls an attack once per model with every client's
  honest gradient at that model. The target is the first benign client t;
  a model is taken for one of t's cluster when t's gradient there is among
  the smallest `share` of the benign gradients (a model fits its own
  cluster's data: with K equal clusters, about 1/K of the benign clients
  have small gradients there, so `share` 0.5 separates them for K >= 3).
  There the Byzantine rows are `attack`'s; at every other model they are
  NaN, which lies outside every ball. A Byzantine client so joins only
  the balls of t's cluster's models: under the ball cap its M balls all
  fall there, where an attack sent to every model spreads them over all
  N (Werner et al., 2023, Theorem 1: beta_i for that cluster is back to
  about f / (f + qN)).

  Args:
    attack: any attack (`attack(messages, byzantine, key)`).
    share: in (0, 1], the fraction of benign clients whose gradients count
      as small.

  Raises:
    TypeError: if `attack` is not callable.
    ValueError: if `share` is not a number in (0, 1].
  """
  if not callable(attack):
    raise TypeError(f"`attack` must be callable, got {type(attack)}.")
  if (isinstance(share, bool) or not isinstance(share, numbers.Real) or
      not 0 < share <= 1):
    raise ValueError(f"`share` must be a number in (0, 1], got {share!r}.")

  def attacked(messages, byzantine, key):
    benign = ~byzantine
    norms = tree_lib.sq_norms(messages)
    target = jnp.argmax(benign)
    rank = jnp.sum(benign & (norms < norms[target]))
    near = rank < share * jnp.sum(benign)
    bad = attack(messages, byzantine, key)
    nan = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), messages)
    return tree_lib.where(byzantine & ~near, nan, bad)
  return attacked
