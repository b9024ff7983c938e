"""Cluster-aware groups for Federated-Clustering's subgroup rounds.

The paper (Werner et al., 2023, §5.2) splits the N clients into G uniformly
random groups every round and clusters each group alone, which cuts a round's
cost from N^2 to N^2 / G gradients; but a group of S = N / G clients holds
only about S / K members of a client's cluster, so each estimate averages a
handful of gradients (`prfl_jax.diagnostics`' effective count). This module
forms each round's groups so that a group holds more of its members' cluster,
at the same cost (beyond the paper):

* after `start_round` uniform rounds, the models are sketched (a Gaussian
  random projection to `sketch_dim` coordinates, redrawn every round) and the
  clients not drawn for the random share are ordered by a nearest-neighbour
  chain over the sketch distances (start at a random client, then always the
  nearest client not yet visited); consecutive runs of that order fill the
  groups' similarity slots. Models of one cluster move together, so a run
  stays inside a cluster except where the chain jumps between clusters.
  No number of clusters is needed.
* `random_share` of every group's S slots is filled with clients drawn
  uniformly at random, whatever their models: a client that the chain put
  with the wrong cluster still meets clients of its own cluster, and every
  client keeps being re-checked against random others (the paper's guarantee
  rests on every client being clustered among all of them).
* optionally (`quantile`), a larger radius quantile from `start_round` on:
  an aware group holds more of its members' cluster, so a ball can take a
  larger share of it and stay pure, while the uniform rounds before keep
  FC's radius (their groups hold only about S / K of a cluster).
* optionally (`mix_groups`), the chain is shuffled within blocks of a few
  groups, so that a client meets other clients of its block (of its
  cluster, with blocks of a cluster's size) every round instead of the same
  nearest neighbours.

Byzantine clients control their own models, hence where the chain places
them: they can gather in the groups of the cluster they imitate (up to all
of them, in its similarity slots), but a client is in exactly one group, so
no attacker is in more than one group per round, and one that places its
model between the clusters to meet everyone ends up in one or two groups
instead of spread over all of them (`tests/test_fc_groups.py` measures
both against uniform groups).
"""

import math
from typing import Any, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import clustering
from prfl_jax import tree as tree_lib
from prfl_jax import validation

PyTree = Any


class Groups(NamedTuple):
  """A partition of the N clients into G groups of S slots."""
  index: jax.Array  # [G, S] int32 client index of each group slot.
  weight: jax.Array  # [G, S] 1.0 for real clients, 0.0 for padding.
  slot: jax.Array  # [N] int32 position of client i in index.ravel().


def from_slots(index: jax.Array, valid: jax.Array, num_clients: int) -> Groups:
  """`Groups` from a slot table; padding slots point at client 0.

  Args:
    index: `[G, S]` int client of every slot (ignored where not `valid`).
    valid: `[G, S]` bool; the valid slots hold every client exactly once.
    num_clients: N.
  """
  index = jnp.where(valid, index, 0).astype(jnp.int32)
  dest = jnp.where(valid, index, num_clients).ravel()  # Padding: dropped.
  slot = jnp.zeros((num_clients,), jnp.int32).at[dest].set(
      jnp.arange(index.size, dtype=jnp.int32), mode="drop")
  return Groups(index, valid.astype(jnp.float32), slot)


def sketch(params: PyTree, key: jax.Array, dim: int) -> jax.Array:
  """`[N, dim]` Gaussian random projection of the flattened models.

  Squared distances between rows estimate those between the models
  (Johnson-Lindenstrauss): `E ||s_i - s_j||^2 = ||x_i - x_j||^2`.
  """
  leaves = jax.tree.leaves(params)
  keys = jax.random.split(key, len(leaves))
  out = 0.0
  for k, x in zip(keys, leaves):
    flat = x.reshape(x.shape[0], -1).astype(jnp.float32)
    proj = jax.random.normal(k, (flat.shape[1], dim), jnp.float32)
    out = out + jnp.matmul(flat, proj, precision=lax.Precision.HIGHEST)
  return out / math.sqrt(dim)


def nearest_neighbour_chain(sq_dist: jax.Array) -> jax.Array:
  """An order of the M points: from point 0, always the nearest unvisited.

  Args:
    sq_dist: `[M, M]` squared distances (NaN counts as +inf).

  Returns:
    `[M]` int32 permutation.
  """
  m = sq_dist.shape[0]
  d = jnp.where(jnp.isnan(sq_dist), jnp.inf, sq_dist)

  def body(t, carry):
    order, visited = carry
    here = order[t - 1]
    nxt = jnp.argmin(jnp.where(visited, jnp.inf, d[here])).astype(jnp.int32)
    # With only +inf distances left argmin may return a visited point.
    nxt = jnp.where(visited[nxt], jnp.argmin(visited).astype(jnp.int32), nxt)
    return order.at[t].set(nxt), visited.at[nxt].set(True)

  order = jnp.zeros((m,), jnp.int32)
  visited = jnp.zeros((m,), bool).at[0].set(True)
  order, _ = lax.fori_loop(1, m, body, (order, visited))
  return order


class ClusterAware(NamedTuple):
  """Grouping rule: model-similar groups with a random share (see module)."""
  start_round: int
  random_share: float
  sketch_dim: int
  quantile: Optional[float] = None
  mix_groups: int = 1

  def radius(self, radius, round_index: jax.Array):
    """FC's radius in round `round_index`: `radius` before `start_round`,
    the `quantile` radius from then on (`radius` throughout if None).

    Raises:
      ValueError: with a `quantile` and a `radius` other than a
        `clustering.QuantileRadius`.
    """
    if self.quantile is None:
      return radius
    if not isinstance(radius, clustering.QuantileRadius):
      raise ValueError("`cluster_aware(quantile=...)` needs FC's radius to be "
                       f"a quantile_radius, got {radius!r}.")
    return clustering.QuantileRadius(jnp.where(
        round_index < self.start_round, radius.q, self.quantile))

  def random_slots(self, num_clients: int, num_groups: int) -> int:
    """Slots per group filled uniformly at random (static)."""
    size = -(-num_clients // num_groups)
    return min(size, round(self.random_share * size))

  def __call__(self, key: jax.Array, params: PyTree, num_groups: int,
               round_index: jax.Array) -> Groups:
    """This round's groups.

    Args:
      key: PRNG key of the round's grouping.
      params: the models, leaves `[N, ...]` (before this round's update).
      num_groups: G.
      round_index: `[]` int rounds done; before `start_round` the groups
        are uniformly random.
    """
    n = tree_lib.num_leading(params, "params")
    size = -(-n // num_groups)
    r = self.random_slots(n, num_groups)
    perm_key, sketch_key = jax.random.split(key)
    perm = jax.random.permutation(perm_key, n).astype(jnp.int32)
    g, o = jnp.divmod(jnp.arange(num_groups * size), size)
    uniform = from_slots(jnp.pad(perm, (0, num_groups * size - n)).reshape(
        num_groups, size), (jnp.arange(num_groups * size) < n).reshape(
            num_groups, size), n)

    def aware(_):
      m = min(num_groups * r, n)  # Clients in random slots: perm[:m].
      chain_clients = perm[m:]
      s = sketch(tree_lib.take(params, chain_clients), sketch_key,
                 self.sketch_dim)
      sq = jnp.sum(jnp.square(s[:, None] - s[None]), axis=-1)
      chain = chain_clients[nearest_neighbour_chain(sq)]
      sim = size - r  # Similarity slots per group.
      if self.mix_groups > 1:  # Shuffle within blocks of mix_groups groups.
        block = jnp.arange(n - m) // (self.mix_groups * sim)
        u = jax.random.uniform(jax.random.fold_in(sketch_key, 1), (n - m,))
        chain = chain[jnp.argsort(block + u)]
      ci, ri = g * sim + o, g * r + o - sim
      from_chain = o < sim
      valid = jnp.where(from_chain, ci < n - m, ri < m)
      index = jnp.where(from_chain, chain[jnp.clip(ci, 0, n - m - 1)],
                        perm[jnp.clip(ri, 0, max(m - 1, 0))])
      return from_slots(index.reshape(num_groups, size),
                        valid.reshape(num_groups, size), n)

    if n - min(num_groups * r, n) == 0:  # Everything random.
      return uniform
    return lax.cond(round_index < self.start_round, lambda _: uniform, aware,
                    None)


def cluster_aware(*, start_round: int = 10, random_share: float = 0.25,
                  sketch_dim: int = 32,
                  quantile: Optional[float] = None,
                  mix_groups: int = 1) -> ClusterAware:
  """Cluster-aware groups for `federated_clustering(..., grouping=...)`.

  Args:
    start_round: uniformly random groups in the rounds before this one
      (the models need a few rounds to move apart by cluster).
    random_share: fraction of every group's slots (rounded) filled with
      uniformly random clients, in [0, 1]; 1 gives uniform groups.
    sketch_dim: coordinates of the models' random projection.
    quantile: None (FC's radius in every round) or the radius quantile in
      (0, 1] of the cluster-aware rounds (from `start_round` on); FC's
      radius must then be a `quantile_radius`, kept before `start_round`.
    mix_groups: the chain's order is shuffled at random within blocks of
      this many groups' similarity slots (1: not shuffled), so that a client
      keeps to its block of similar models (about a cluster with blocks of
      a cluster's size) but meets other partners of it every round.

  Returns:
    a `ClusterAware` rule.

  Raises:
    ValueError: on a negative `start_round`, a `random_share` outside
      [0, 1], a `sketch_dim` or `mix_groups` < 1 or a `quantile` outside
      (0, 1].
  """
  validation.check_positive_int(start_round, "start_round", minimum=0)
  validation.check_positive_int(sketch_dim, "sketch_dim")
  validation.check_positive_int(mix_groups, "mix_groups")
  if (isinstance(random_share, bool) or
      not isinstance(random_share, (int, float)) or
      not 0.0 <= random_share <= 1.0):
    raise ValueError(
        f"`random_share` must be a number in [0, 1], got {random_share!r}.")
  if quantile is not None and (
      isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or
      not 0.0 < quantile <= 1.0):
    raise ValueError(
        f"`quantile` must be None or a number in (0, 1], got {quantile!r}.")
  quantile = None if quantile is None else float(quantile)
  return ClusterAware(start_round, float(random_share), sketch_dim, quantile,
                      mix_groups)
