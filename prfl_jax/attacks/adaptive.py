"""Attacks adapted to Federated-Clustering's defences.

`jittered` unties any attack whose Byzantine clients send one vector, so
that `aggregators.cap_duplicates` (which counts near-identical messages
once) no longer merges them; the rows move by a negligible amount.
"""

import math
import numbers

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
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
    ratio = scale * jnp.sqrt(tree_lib.sq_norms(bad) / jnp.maximum(
        tree_lib.sq_norms(noise), 1e-30))
    moved = jax.tree.map(
        lambda b, e: b + ratio.reshape((-1,) + (1,) * (b.ndim - 1)).astype(
            b.dtype) * e, bad, noise)
    return base.replace(messages, byzantine, moved)
  return attacked
