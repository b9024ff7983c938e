"""Clustered Federated Learning (Sattler, Mueller and Samek, 2019).

CFL runs FedAvg inside every current cluster and, once a cluster's FedAvg has
reached a stationary point, bi-partitions it by the cosine similarity of its
clients' updates, recursively. Every round:

1. every client i runs `local_steps` optimizer steps from its model (fresh
   optimizer state) and sends its update `dtheta_i` (Byzantine clients send
   `attack`'s message instead);
2. every current cluster c with at least `min_split_size` clients, after
   `warmup_rounds` rounds, whose mean update is small and some client update
   large,
     `||mean_{i in c} dtheta_i|| < eps1`  and  `max_{i in c} ||dtheta_i|| > eps2`,
   is split in two (while fewer than `max_clusters` clusters exist);
3. every client adds the mean update of its (new) cluster to its model.
Clusters are never merged again (the failure mode of the paper's Example 3).

Clusters are a fixed-size `[N]` int array of ids in `[0, max_clusters)`, so
the step is one jittable program: all cluster slots are checked at once with
`vmap`, a split cluster keeps its id for one half and gives the next free id
to the other half.

The bi-partition. Sattler et al.'s Algorithm 1 asks for
`argmin_{c1 u c2 = c} max_{i in c1, j in c2} cos(dtheta_i, dtheta_j)`, the
bipartition with the smallest maximum cross-similarity; their reference code
approximates it with complete-linkage agglomerative clustering into 2 groups.
Here it is solved exactly: the optimum is the single-linkage (maximum-spacing)
cut, i.e. removing the weakest edge of a maximum spanning tree of the
similarity graph (the cut property of spanning trees). `bipartition` builds
that tree with Prim's algorithm in a `lax.fori_loop` over N (O(N^2)) and
marks the subtree below the weakest edge. The reference code's extra
conditions (split only clusters with more than 2 clients, after round 20)
are `min_split_size` and `warmup_rounds`. All clients start from client 0's
initial model, as in FedAvg.
"""

from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import optax

from prfl_jax import diagnostics
from prfl_jax import gradients
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models
from prfl_jax.algorithms.fedavg import local_updates

PyTree = Any


class _PrimCarry(NamedTuple):
  in_tree: jax.Array  # [N] bool: vertex already in the spanning tree.
  best: jax.Array  # [N] highest similarity to the tree.
  parent: jax.Array  # [N] int32: tree vertex achieving `best`.
  weight: jax.Array  # [N] similarity of the tree edge to the parent.


def bipartition(similarity: jax.Array, members: jax.Array):
  """Optimal 2-way split of a group by a similarity matrix.

  Minimises `max_{i in c1, j in c2} similarity[i, j]` over bipartitions
  `c1 u c2 = members` (single-linkage / maximum-spacing cut): Prim's maximum
  spanning tree over the members, cut at its weakest edge.

  Args:
    similarity: `[N, N]` symmetric similarities (finite).
    members: `[N]` bool, the group to split (at least 2 members for a proper
      split).

  Returns:
    `(second [N] bool, cross)`: the members moved to the new group (the side
    of the cut not holding the first member) and the maximum cross-similarity
    of the split (+inf if fewer than 2 members).
  """
  n = similarity.shape[0]
  ids = jnp.arange(n)
  root = jnp.argmax(members)
  init = _PrimCarry(ids == root, jnp.where(members, similarity[root], -jnp.inf),
                    jnp.full((n,), root, jnp.int32),
                    jnp.full((n,), jnp.inf, similarity.dtype))

  def add_vertex(_, c: _PrimCarry) -> _PrimCarry:
    candidate = members & ~c.in_tree
    j = jnp.argmax(jnp.where(candidate, c.best, -jnp.inf))
    ok = candidate[j]
    in_tree = c.in_tree.at[j].set(c.in_tree[j] | ok)
    weight = c.weight.at[j].set(jnp.where(ok, c.best[j], c.weight[j]))
    closer = ok & members & ~in_tree & (similarity[j] > c.best)
    return _PrimCarry(in_tree, jnp.where(closer, similarity[j], c.best),
                      jnp.where(closer, j, c.parent).astype(jnp.int32), weight)

  tree = lax.fori_loop(0, n - 1, add_vertex, init)
  weight = jnp.where(members & (ids != root), tree.weight, jnp.inf)
  cut = jnp.argmin(weight)

  def grow(_, below):
    return below | (members & (ids != root) & below[tree.parent])

  second = lax.fori_loop(0, n, grow, ids == cut) & members
  return second, weight[cut]


class CflState(NamedTuple):
  """State of Clustered Federated Learning."""
  params: PyTree  # leaves [N, ...]: model of each client (same in a cluster).
  clusters: jax.Array  # [N] int32: cluster id of each client.
  num_clusters: jax.Array  # [] int32: clusters in use (ids 0..num_clusters-1).
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("params", "clusters", "byzantine"))


def cfl(loss_fn, optimizer: optax.GradientTransformation, *, eps1: float,
        eps2: float, max_clusters: int, local_steps: int = 1,
        min_split_size: int = 3, warmup_rounds: int = 0,
        attack=None, true_clusters=None) -> base.Algorithm:
  """Clustered FL: FedAvg per cluster with recursive cosine bi-partitioning.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: the clients' local optimizer (state re-initialised every
      round); the update is the model change after `local_steps` steps.
    eps1: split a cluster only if the norm of its mean update is below eps1
      (FedAvg has reached a stationary point of the cluster's objective).
    eps2: ... and some member's update norm exceeds eps2 (the clients are not
      all at their own stationary points).
    max_clusters: static upper bound on the number of clusters.
    local_steps: local optimizer steps per round.
    min_split_size: clusters with fewer clients are never split (the
      reference code splits only clusters with more than 2 clients).
    warmup_rounds: no split before this many rounds have been done.
    attack: what Byzantine clients send instead of their update, or None.
    true_clusters: optional concrete `[N]` true cluster ids, known to the
      experimenter only: the step then also reports the diagnostics that
      need them (`prfl_jax.diagnostics.rounds`).

  Returns:
    `Algorithm(init, step)`; `init(params, *, byzantine=None)` takes params
    with leaves `[N, ...]`; every client starts from client 0's model.

  Raises:
    TypeError: if `loss_fn` is not callable or `optimizer` not an optax
      transformation.
    ValueError: on a bad `eps1`, `eps2`, `max_clusters`, `local_steps`,
      `min_split_size` or `warmup_rounds`.

  References:
    Sattler, Mueller and Samek, 2019, "Clustered Federated Learning:
    Model-Agnostic Distributed Multi-Task Optimization under Privacy
    Constraints", Algorithm 1; Werner et al., 2023, Section 2, Example 3.
  """
  cluster_models.check_callable(loss_fn, "loss_fn")
  base.check_optimizer(optimizer)
  cluster_models.check_non_negative(eps1, "eps1")
  cluster_models.check_non_negative(eps2, "eps2")
  base.check_positive_int(max_clusters, "max_clusters")
  base.check_positive_int(local_steps, "local_steps")
  base.check_positive_int(min_split_size, "min_split_size", minimum=2)
  base.check_positive_int(warmup_rounds, "warmup_rounds", minimum=0)
  truth = diagnostics.check_true_clusters(true_clusters)

  def init(params, *, byzantine=None) -> CflState:
    n = base.init_params(params)
    diagnostics.rounds.check_num_clients(truth, n)
    first = jax.tree.map(lambda p: p[0], params)
    return CflState(tree_lib.broadcast(first, n), jnp.zeros((n,), jnp.int32),
                    jnp.ones((), jnp.int32), base.byzantine_mask(byzantine, n),
                    jnp.zeros((), jnp.int32))

  def split(state: CflState, updates: PyTree):
    """New cluster ids after checking every cluster slot; `[N]` and `[]`."""
    norms = base.grad_norms(updates)
    means, sizes = cluster_models.segment_mean(updates, state.clusters,
                                               max_clusters)
    mean_norms = base.grad_norms(means)
    max_norms = jax.ops.segment_max(jnp.nan_to_num(norms, nan=jnp.inf),
                                    state.clusters, max_clusters)
    want = ((sizes >= min_split_size) & (mean_norms < eps1) &
            (max_norms > eps2) & (state.round >= warmup_rounds))
    similarity = cluster_models.cosine_similarity(updates)
    slots = jnp.arange(max_clusters)
    second, _ = jax.vmap(bipartition, in_axes=(None, 0))(
        similarity, state.clusters[None, :] == slots[:, None])
    new_id = state.num_clusters + jnp.cumsum(want) - 1
    want = want & (new_id < max_clusters)
    own = state.clusters
    move = want[own] & second[own, jnp.arange(own.shape[0])]
    clusters = jnp.where(move, new_id[own], own).astype(jnp.int32)
    return clusters, state.num_clusters + jnp.sum(want).astype(jnp.int32)

  def step(state: CflState, batch: PyTree, key: jax.Array):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    updates, losses = local_updates(loss_fn, optimizer, state.params, batch,
                                    local_steps)
    honest_norm = base.benign_mean(base.grad_norms(updates), state.byzantine)
    updates = base.attacked(attack, updates, state.byzantine, key)
    clusters, num_clusters = split(state, updates)
    means, _ = cluster_models.segment_mean(updates, clusters, max_clusters)
    params = jax.tree.map(jnp.add, state.params,
                          tree_lib.take(means, clusters))
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "update_norm": honest_norm,
        "num_clusters": num_clusters.astype(jnp.float32),
        "split": (num_clusters > state.num_clusters).astype(jnp.float32),
    }
    metrics.update(diagnostics.rounds.assignment_stats(
        clusters, max_clusters, state.byzantine, truth))
    return state._replace(params=params, clusters=clusters,
                          num_clusters=num_clusters,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
