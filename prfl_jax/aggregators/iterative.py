"""Iterative rules: geometric median (RFA) and centered clipping.

Both move a point by a fixed number of re-weighted averaging steps; the
distances are over the whole flattened pytree.
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


def _distances(sq: jax.Array, diff: PyTree) -> jax.Array:
  """`[N]` distances: `sqrt(sq)`, `sq` the squared norms of the rows of
  `diff`, unless one of them overflowed (inf: float32 entries ~1e19) or
  underflowed (a nonzero row's below the smallest normal number, 0 on CPU
  for entries ~1e-22); then `base.row_norms(diff)`, its NaN (from entries
  that overflow themselves) read as inf. In `lax.cond`, so the scale-safe
  norms' extra pass runs only then; otherwise `sqrt(sq)` as before, bit
  for bit.
  """
  tiny = jnp.finfo(sq.dtype).tiny
  fine = jnp.isfinite(sq) & ((sq >= tiny) | (base.row_peaks(diff) == 0))

  def safe(_):
    norms = base.row_norms(diff)
    return jnp.where(jnp.isnan(norms), jnp.inf, norms)
  return lax.cond(jnp.all(fine), jnp.sqrt, safe, sq)


def geometric_median(num_iters: int, eps: float = 1e-8) -> Aggregator:
  """Geometric median by smoothed Weiszfeld iterations (RFA).

  From the weighted mean z of the present rows, `num_iters` times
  `z <- sum_i w_i x_i / max(eps, ||x_i - z||) / sum_i w_i / max(eps,
  ||x_i - z||)`.

  Args:
    num_iters: Weiszfeld iterations (>= 1).
    eps: smoothing (> 0): distances below it count as `eps`.

  Raises:
    ValueError: if `num_iters < 1` or `eps <= 0`.

  References:
    Pillutla, Kakade and Harchaoui, 2022, "Robust Aggregation for Federated
    Learning", Algorithm 2 (smoothed Weiszfeld).
  """
  validation.check_positive_int(num_iters, "num_iters")
  base.check_positive_float(eps, "eps")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = base.prepare(messages, weights)

    def body(_, z):
      d2 = tree_lib.sq_distances(zeroed, jax.tree.map(lambda v: v[None], z))
      dist = _distances(d2[:, 0], jax.tree.map(lambda x, c: x - c[None],
                                               zeroed, z))
      beta = jnp.where(present, weights / jnp.maximum(eps, dist), 0.0)
      return tree_lib.weighted_mean(zeroed, beta)

    return lax.fori_loop(0, num_iters, body,
                         tree_lib.weighted_mean(zeroed, weights))
  return agg


def centered_clipping(radius: float, num_iters: int,
                      center: Optional[PyTree] = None) -> Aggregator:
  """Centered clipping (Karimireddy et al., 2021).

  `num_iters` times `v <- v + mean_i clip(x_i - v, radius)` (weighted mean
  over present rows), `clip(u, r) = u * min(1, r / ||u||)`, from `center` or,
  if None, the coordinate-wise (weighted) median of the present rows.

  Args:
    radius: clipping radius tau (> 0).
    num_iters: clipping iterations (>= 1).
    center: optional starting point, a pytree like one message (leaves
      `[...]`), e.g. the previous round's aggregate.

  Raises:
    ValueError: if `radius <= 0` or `num_iters < 1`.

  References:
    Karimireddy, He and Jaggi, 2021, "Learning from History for Byzantine
    Robust Optimization", eq. (CC).
  """
  base.check_positive_float(radius, "radius")
  validation.check_positive_int(num_iters, "num_iters")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    _, weights, present, zeroed = base.prepare(messages, weights)
    if center is None:
      v0 = coordinate.weighted_median(zeroed, present, weights)
    else:
      tree_lib.check_same_structure(
          zeroed, jax.tree.map(lambda c: jnp.asarray(c)[None], center),
          "messages", "center")
      v0 = jax.tree.map(lambda c, x: jnp.asarray(c, x.dtype), center, zeroed)

    total = jnp.sum(weights)
    share = weights / jnp.where(total > 0, total, 1.0)  # [N], 0 if absent.

    def body(_, v):
      diff = jax.tree.map(lambda x, c: x - c[None], zeroed, v)
      norm = _distances(tree_lib.sq_norms(diff), diff)
      coef = share * jnp.minimum(1.0, radius / jnp.maximum(norm, 1e-30))
      return jax.tree.map(
          lambda c, d: c + jnp.tensordot(coef.astype(d.dtype), d, axes=1),
          v, diff)

    return lax.fori_loop(0, num_iters, body, v0)
  return agg
