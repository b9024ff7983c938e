"""Federated-Clustering (Werner et al., 2023, Algorithm 1).

Every round, every client j computes its gradient `g_j(x_i)` at every client
i's model; client i clusters the N gradients it receives with
Threshold-Clustering (one centre, started at its own gradient `g_i(x_i)`) and
updates its model with the cluster estimate. Optionally:

* `num_groups=G`: clients are re-shuffled into G random groups every round and
  each group is clustered separately (the paper's MNIST setting, Section 5.2),
  which costs `(N/G)^2 * G` instead of `N^2` gradients. When N is not divisible
  by G the groups are padded with weight-0 clients that never move a centre.
* `local_steps=s`: s plain local optimizer steps between two clustering rounds
  (the paper's CIFAR-10 experiment, Section 5.3): rounds `t` with
  `t % (s + 1) == 0` cluster, the others take a local step.
"""

from typing import Any, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import optax

from prfl_jax import clustering
from prfl_jax import gradients
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base

PyTree = Any


class FederatedClusteringState(NamedTuple):
  """State of Federated-Clustering."""
  params: PyTree  # leaves [N, ...]: personalized models x_i.
  opt_state: PyTree  # leaves [N, ...]: per-client optimizer state.
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.


class _Groups(NamedTuple):
  index: jax.Array  # [G, S] int32 client index of each group slot.
  weight: jax.Array  # [G, S] 1.0 for real clients, 0.0 for padding.
  slot: jax.Array  # [N] int32 position of client i in index.ravel().


def random_groups(key: jax.Array, num_clients: int, num_groups: int) -> _Groups:
  """Random partition of N clients into G groups of `ceil(N/G)` slots.

  Padding slots point at client 0 with weight 0. With G=1 the order is kept.
  """
  size = -(-num_clients // num_groups)
  pad = num_groups * size - num_clients
  perm = (jnp.arange(num_clients) if num_groups == 1 else
          jax.random.permutation(key, num_clients))
  index = jnp.concatenate([perm, jnp.zeros((pad,), perm.dtype)])
  weight = jnp.concatenate([jnp.ones((num_clients,), jnp.float32),
                            jnp.zeros((pad,), jnp.float32)])
  slot = jnp.zeros((num_clients,), jnp.int32).at[perm].set(
      jnp.arange(num_clients, dtype=jnp.int32))
  return _Groups(index.reshape(num_groups, size).astype(jnp.int32),
                 weight.reshape(num_groups, size), slot)


def clustered_directions(loss_fn, params: PyTree, batch: PyTree,
                         byzantine: jax.Array, key: jax.Array, *, radius,
                         num_iters: int, num_groups: int,
                         schedule: gradients.Schedule, attack=None):
  """Threshold-Clustering estimate `v_i` for every client (Alg. 1, line 7).

  Args:
    loss_fn: loss for one client.
    params: leaves `[N, ...]`.
    batch: leaves `[N, B, ...]`.
    byzantine: `[N]` bool.
    key: PRNG key (group shuffle and attack noise).
    radius, num_iters: Threshold-Clustering arguments.
    num_groups: number of random groups G.
    schedule: execution schedule of the all-pairs gradients.
    attack: optional Byzantine attack.

  Returns:
    `gradients.PairsOutput` with leading axis N in the original client order
    (`inside` is `[N, S]` over the client's group slots).
  """
  n = byzantine.shape[0]
  group_key, attack_key = jax.random.split(key)
  groups = random_groups(group_key, n, num_groups)

  def one_group(index, weight, gkey):
    gparams = tree_lib.take(params, index)
    gbatch = tree_lib.take(batch, index)
    gbyz = byzantine[index] & (weight > 0)
    message_fn = None
    if attack is not None:
      message_fn = lambda grads, i, k: attack(grads, gbyz, k)
    return gradients.cluster_at_models(
        loss_fn, gparams, gbatch, radius=radius, num_iters=num_iters,
        weights=weight, schedule=schedule, message_fn=message_fn, key=gkey)

  gkeys = jax.random.split(attack_key, num_groups)
  xs = (groups.index, groups.weight, gkeys)
  if schedule.chunk_size is None:
    out = jax.vmap(one_group)(*xs)
  else:  # Groups one after another: memory of one group at a time.
    out = lax.map(lambda a: one_group(*a), xs)
  flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out)
  return jax.tree.map(lambda x: x[groups.slot], flat), groups


def federated_clustering(loss_fn, optimizer: optax.GradientTransformation, *,
                         radius: clustering.Radius, num_iters: int = 10,
                         num_groups: int = 1, local_steps: int = 0,
                         attack=None,
                         schedule: gradients.Schedule = gradients.Schedule()
                         ) -> base.Algorithm:
  """Federated-Clustering: personalized, Byzantine-robust training.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: optax optimizer applied per client to the cluster estimate
      (`optax.sgd(eta)` is the paper's update `x <- x - eta * v`).
    radius: Threshold-Clustering radius: scalar, or a rule such as
      `prfl.quantile_radius(0.2)`.
    num_iters: Threshold-Clustering steps per round (the paper uses 10).
    num_groups: number of random groups clustered separately each round.
    local_steps: plain local steps between two clustering rounds.
    attack: what Byzantine clients send (a `prfl.attacks` function), or None.
    schedule: execution schedule of the all-pairs gradients (same results).

  Returns:
    `Algorithm(init, step)`; `init(params, *, byzantine=None)` takes params
    with leaves `[N, ...]` and an optional `[N]` bool mask.

  References:
    Werner et al., 2023, Algorithm 1 (Federated-Clustering) and Algorithm 2.
  """
  base.check_optimizer(optimizer)
  base.check_positive_int(num_iters, "num_iters")
  base.check_positive_int(num_groups, "num_groups")
  base.check_positive_int(local_steps, "local_steps", minimum=0)
  gradients.check_schedule(schedule)
  if not callable(radius):
    clustering.check_radius(radius, 1)

  def init(params, *, byzantine=None) -> FederatedClusteringState:
    n = base.init_params(params)
    if num_groups > n:
      raise ValueError(
          f"`num_groups`={num_groups} exceeds the number of clients N={n}.")
    opt_state = jax.vmap(optimizer.init)(params)
    return FederatedClusteringState(params, opt_state,
                                    base.byzantine_mask(byzantine, n),
                                    jnp.zeros((), jnp.int32))

  def cluster_round(state, batch, key):
    out, groups = clustered_directions(
        loss_fn, state.params, batch, state.byzantine, key, radius=radius,
        num_iters=num_iters, num_groups=num_groups, schedule=schedule,
        attack=attack)
    params, opt_state = base.apply_updates(optimizer, out.centers,
                                           state.opt_state, state.params)
    # Share of each client's group inside its final ball, and the share of
    # the group that is both Byzantine and inside.
    group_of = groups.slot // groups.index.shape[1]  # [N]
    slot_w = groups.weight[group_of]  # [N, S]
    slot_byz = (state.byzantine[groups.index] & (groups.weight > 0))[group_of]
    inside = out.inside & (slot_w > 0)
    gsize = jnp.sum(slot_w, axis=1)
    in_ball = jnp.sum(inside, axis=1) / gsize
    byz_in = jnp.sum(inside & slot_byz, axis=1) / gsize
    metrics = {
        "loss": base.benign_mean(out.own_loss, state.byzantine),
        "grad_norm": base.benign_mean(out.own_grad_norm, state.byzantine),
        "update_norm": base.benign_mean(base.grad_norms(out.centers),
                                        state.byzantine),
        "ball_fraction": base.benign_mean(in_ball, state.byzantine),
        "byzantine_in_ball": base.benign_mean(byz_in, state.byzantine),
        "clustered": jnp.ones((), jnp.float32),
    }
    return params, opt_state, metrics

  def local_round(state, batch, key):
    del key  # Unused.
    losses, grads = gradients.client_grads(loss_fn, state.params, batch)
    params, opt_state = base.apply_updates(optimizer, grads, state.opt_state,
                                           state.params)
    norms = base.benign_mean(base.grad_norms(grads), state.byzantine)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "grad_norm": norms,
        "update_norm": norms,
        "ball_fraction": jnp.zeros((), jnp.float32),
        "byzantine_in_ball": jnp.zeros((), jnp.float32),
        "clustered": jnp.zeros((), jnp.float32),
    }
    return params, opt_state, metrics

  def step(state: FederatedClusteringState, batch: PyTree, key: jax.Array):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    if local_steps == 0:
      params, opt_state, metrics = cluster_round(state, batch, key)
    else:
      params, opt_state, metrics = lax.cond(
          state.round % (local_steps + 1) == 0, cluster_round, local_round,
          state, batch, key)
    return state._replace(params=params, opt_state=opt_state,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
