"""Re-seeding Momentum-Clustering's dead centres (its `reseed` option).

Algorithm 3 of Werner et al. (2023) carries K centres from round to round;
nothing in it brings back a centre that has lost all its clients or that
has run into another centre (the paper-literal run's centres collapse, see
`momentum_clustering.PAPER_LITERAL`). This module finds such dead centres
(`dead_centers`) and moves each into the largest live cluster
(`reseed_centers`): to a random member's momentum, to the member its centre
fits worst (the IFCA-style loss signal of Ghosh et al., 2020) or to the mean
momentum of the half that 2-means splits off that cluster (`split_half`;
Lloyd's iterations from a farthest pair, as in farthest-first seeding).
`docs/design.md` ("Momentum-Clustering's options, one by one") and
`experiments/results/momentum_clustering/README.md` say what was measured
with each pick. Pure functions: jit-, vmap- and scan-safe, no loop over
clients.
"""

from typing import Any, Optional

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib

PyTree = Any


def dead_centers(centers: PyTree, assignment: jax.Array,
                 rtol: float = 1e-3) -> jax.Array:
  """`[K]` bool: centres with no client, or coinciding with a lower one.

  Centres k > j coincide when `||c_k - c_j|| <= rtol * max(||c_k||,
  ||c_j||)` (as in `diagnostics.partition.center_stats`).
  """
  k = tree_lib.num_leading(centers)
  sizes = jax.ops.segment_sum(jnp.ones_like(assignment), assignment, k)
  dist = jnp.sqrt(jnp.maximum(tree_lib.sq_distances(centers, centers), 0.0))
  norms = jnp.sqrt(tree_lib.sq_norms(centers))
  close = dist <= rtol * jnp.maximum(norms[:, None], norms[None, :])
  return (sizes == 0) | jnp.any(jnp.tril(close, k=-1), axis=1)


RESEED_PICKS = ("random", "worst", "split")


def split_half(messages: PyTree, member: jax.Array, center: PyTree,
               num_iters: int = 5) -> jax.Array:
  """`[N]` bool: one half of the members, split by 2-means on the momenta.

  The two means start at a farthest pair of members (p, the member
  farthest from `center`; q, the member farthest from p), then `num_iters`
  Lloyd steps (each member to the nearer mean, ties to p's; each mean to its
  members' mean). Returned: the half whose mean is farther from `center`,
  the one `center` serves worse. Pure and jit-safe (a fixed-length
  `lax.fori_loop`, no loop over clients).

  Args:
    messages: leaves `[N, ...]`, the clients' momenta.
    member: `[N]` bool, the points to split (at least one, all usable).
    center: unstacked leaves `[...]`, the centre of the members.
    num_iters: Lloyd steps after the farthest-pair start.
  """
  center1 = jax.tree.map(lambda c: c[None], center)
  d_c = tree_lib.sq_distances(messages, center1)[:, 0]
  p = jnp.argmax(jnp.where(member, d_c, -jnp.inf))
  d_p = tree_lib.sq_distances(messages, tree_lib.take(messages, p[None]))
  q = jnp.argmax(jnp.where(member, d_p[:, 0], -jnp.inf))
  safe = tree_lib.where(member, messages,
                        jax.tree.map(jnp.zeros_like, messages))

  def sides(means):
    d = tree_lib.sq_distances(messages, means)  # [N, 2]
    return d[:, 1] < d[:, 0]  # True: q's side.

  def lloyd(_, means):
    side = sides(means)
    w = jnp.stack([member & ~side, member & side]).astype(jnp.float32)
    total = jnp.sum(w, axis=1, keepdims=True)
    new = tree_lib.combine(w / jnp.maximum(total, 1.0), safe)
    return tree_lib.where(total[:, 0] > 0, new, means)

  means = lax.fori_loop(0, num_iters, lloyd,
                        tree_lib.take(messages, jnp.stack([p, q])))
  far = jnp.argmax(tree_lib.sq_distances(means, center1)[:, 0])
  return member & (sides(means) == (far == 1))


def reseed_centers(centers: PyTree, messages: PyTree, assignment: jax.Array,
                   key: jax.Array, pick: str = "random",
                   scores: Optional[jax.Array] = None):
  """Moves every dead centre into the largest cluster.

  `pick` says where (`L`: the members of the largest live cluster with a
  usable momentum):

  * `"random"`: every dead centre to the momentum of a random member of L
    (drawn independently).
  * `"worst"`: the j-th dead centre (by index) to the member of L with the
    j-th highest `scores` (e.g. its loss at its centre's model: the
    worst-fit client; ties to the lower index).
  * `"split"`: every dead centre to the mean momentum of the half of L that
    `split_half` returns (the largest cluster split in two by 2-means from
    a farthest pair, the half its centre serves worse). Several dead
    centres get the same half, so all but the lowest coincide and are
    re-seeded again next round.

  Args:
    centers: leaves `[K, ...]`.
    messages: the clients' momenta, leaves `[N, ...]`.
    assignment: `[N]` int32 cluster of every client.
    key: PRNG key drawing the members (`"random"`).
    pick: one of `RESEED_PICKS`.
    scores: `[N]` float, higher picked first; needed by `"worst"` only.
      Non-finite scores rank last.

  Returns:
    `(centers, dead, weights)`: the centres, `[K]` bool the dead ones
    (moved) and `[K, N]` float32 the weights of the clients each centre
    would move to (its new centre is `weights[k] @ messages`; a one-hot row
    for `"random"` and `"worst"`, uniform over the half for `"split"`).

  Raises:
    ValueError: on an unknown `pick`, or `"worst"` without `scores`.
  """
  if pick not in RESEED_PICKS:
    raise ValueError(f"`pick` must be one of {RESEED_PICKS}, got {pick!r}.")
  if pick == "worst" and scores is None:
    raise ValueError("pick='worst' needs `scores`.")
  k = tree_lib.num_leading(centers)
  n = assignment.shape[0]
  dead = dead_centers(centers, assignment)
  sizes = jax.ops.segment_sum(jnp.ones_like(assignment), assignment, k)
  largest = jnp.argmax(jnp.where(dead, -1, sizes))
  member = (assignment == largest) & tree_lib.usable(messages)
  if pick == "random":
    idx = jax.random.categorical(key, jnp.where(member, 0.0, -jnp.inf),
                                 shape=(k,))
    weights = jax.nn.one_hot(idx, n, dtype=jnp.float32)
    new = tree_lib.take(messages, idx)
  elif pick == "worst":
    ranked = jnp.where(member & jnp.isfinite(scores), scores, -jnp.inf)
    ranked = jnp.where(member & ~jnp.isfinite(scores), -jnp.finfo(
        jnp.float32).max, ranked)  # Members before non-members.
    order = jnp.argsort(-ranked, stable=True)
    last = jnp.maximum(jnp.sum(member), 1) - 1
    rank = jnp.clip(jnp.cumsum(dead) - 1, 0, last)
    weights = jax.nn.one_hot(order[rank], n, dtype=jnp.float32)
    new = tree_lib.take(messages, order[rank])
  else:
    half = split_half(messages, member,
                      jax.tree.map(lambda c: c[largest], centers))
    row = half.astype(jnp.float32) / jnp.maximum(jnp.sum(half), 1)
    weights = jnp.broadcast_to(row, (k, n))
    safe = tree_lib.where(member, messages,
                          jax.tree.map(jnp.zeros_like, messages))
    new = tree_lib.combine(weights, safe)
  return tree_lib.where(dead, new, centers), dead, weights
