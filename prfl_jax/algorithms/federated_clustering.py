"""Federated-Clustering (Werner et al., 2023, Algorithm 1).

Every round, every client j computes its gradient `g_j(x_i)` at every client
i's model; client i clusters the N gradients it receives with
Threshold-Clustering (one centre, started at its own gradient `g_i(x_i)`) and
updates its model with the cluster estimate. Optionally:

* `num_groups=G`: clients are re-shuffled into G random groups every round and
  each group is clustered separately (the paper's MNIST setting, Section 5.2),
  which costs `(N/G)^2 * G` instead of `N^2` gradients. When N is not divisible
  by G the groups are padded with weight-0 clients that never move a centre.
  `grouping=fc_groups.cluster_aware()` forms the groups from the models
  instead, so that a group holds more of its members' cluster (beyond the
  paper; see `prfl_jax.algorithms.fc_groups`).
* `local_steps=s`: s plain local optimizer steps between two clustering rounds
  (the paper's CIFAR-10 experiment, Section 5.3): rounds `t` with
  `t % (s + 1) == 0` cluster, the others take a local step.

Memory: groups run one after another under a chunked plan (`lax.scan`
with the params and optimizer state as the carry), and each group's new rows
are written into the params as soon as the group is done (`clustered_update`),
so a round holds the state once plus one group's work. Jit the step with
`jax.jit(alg.step, donate_argnums=0)` (as `prfl.train` does) and the new
params are written over the old ones instead of into a second `[N, ...]` copy.
"""

from typing import Any, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import optax

from prfl_jax import clustering
from prfl_jax import diagnostics
from prfl_jax import gradients
from prfl_jax import kernels
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base
from prfl_jax.algorithms import fc_defence
from prfl_jax.algorithms import fc_groups

PyTree = Any


class FederatedClusteringState(NamedTuple):
  """State of Federated-Clustering."""
  params: PyTree  # leaves [N, ...]: personalized models x_i.
  opt_state: PyTree  # leaves [N, ...]: per-client optimizer state.
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("params", "opt_state", "byzantine"))


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


def _group_directions(loss_fn, gparams: PyTree, gbatch: PyTree,
                      gbyz: jax.Array, weight: jax.Array, key: jax.Array, *,
                      radius, num_iters: int, plan: kernels.ResolvedPlan,
                      attack=None, pre_aggregator=None, ball_cap=None
                      ) -> kernels.PairsOutput:
  """Threshold-Clustering estimate for the S clients of one group.

  Args:
    loss_fn: loss for one client.
    gparams: the group's models, leaves `[S, ...]`.
    gbatch: the group's batches, leaves `[S, B, ...]`.
    gbyz: `[S]` bool, Byzantine group members (False on padding slots).
    weight: `[S]` 1.0 for real clients, 0.0 for padding.
    key: PRNG key of the attack noise.
    radius, num_iters, attack, pre_aggregator, ball_cap: as in
      `federated_clustering`.
    plan: the round's `kernels.ResolvedPlan` (not resolved again).

  Returns:
    `kernels.PairsOutput` with leading axis S (slot order).
  """
  cluster = lambda message_fn: kernels.cluster_at_models(
      loss_fn, gparams, gbatch, radius=radius, num_iters=num_iters,
      weights=weight, plan=plan, message_fn=message_fn, key=key)
  return fc_defence.defended_clustering(cluster, attack, pre_aggregator, gbyz,
                                        weight, key, ball_cap)


def _to_client_order(per_slot: PyTree, groups: _Groups) -> PyTree:
  """Leaves `[G, S, ...]` in group-slot order -> `[N, ...]` in client order."""
  flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), per_slot)
  return jax.tree.map(lambda x: x[groups.slot], flat)


class RoundStats(NamedTuple):
  """Per-client by-products of one clustering round (client order)."""
  own_loss: jax.Array  # [N]: f_i(x_i) on client i's batch.
  own_grad_norm: jax.Array  # [N]: ||g_i(x_i)||.
  update_norm: jax.Array  # [N]: ||v_i||, the norm of the cluster estimate.
  inside: jax.Array  # [N, S] bool: group slot j inside client i's final ball.
  coefs: jax.Array  # [N, S]: weight of group slot j in client i's estimate.


def clustered_update(loss_fn, optimizer: optax.GradientTransformation,
                     params: PyTree, opt_state: PyTree, batch: PyTree,
                     byzantine: jax.Array, key: jax.Array, *, radius,
                     num_iters: int, num_groups: int,
                     plan: kernels.ExecutionPlan, attack=None,
                     cluster=True, pre_aggregator=None, ball_cap=None,
                     grouping=None, round_index=0):
  """One clustering round: every client steps with its estimate `v_i`.

  Every client's group is clustered (Algorithm 1, line 7) and the client
  steps with its estimate; each group's rows of `params` and `opt_state` are
  updated as soon as the group is clustered. Under a chunked plan the groups run
  one after another (`lax.scan`) with `params` and `opt_state` as the carry,
  so XLA updates them in place: the round never holds an `[N, ...]` array of
  estimates or a permuted copy of the models, only one group's `[S, ...]`
  rows at a time (with the step's state donated, the new params reuse the old
  params' buffers). Groups are disjoint and a group's clustering reads only
  its own members' models, so updating them before the next group runs
  changes nothing. With `chunk_size=None` all groups are one `vmap`.

  With `cluster` False (Federated-Clustering's `local_steps`), every client
  instead steps with its own gradient `g_i(x_i)`, group by group in the same
  way (the groups then change nothing but the order of the work); the choice
  is made inside each group, so a traced `cluster` costs no copy of `params`.

  Args:
    loss_fn: loss for one client.
    optimizer: per-client optax optimizer.
    params: leaves `[N, ...]`.
    opt_state: per-client optimizer state, leaves `[N, ...]`.
    batch: leaves `[N, B, ...]`.
    byzantine: `[N]` bool.
    key: PRNG key (group shuffle and attack noise).
    radius, num_iters, num_groups, plan, attack, pre_aggregator, ball_cap:
      as in `federated_clustering`; `"auto"` fields of `plan` are resolved here,
      for the group size (`kernels.resolve_plan`).
    cluster: `[]` bool, possibly traced: cluster (True) or take a plain local
      step (False; `RoundStats.inside` is then all False).
    grouping: None (uniformly random groups) or a rule
      `grouping(key, params, num_groups, round_index) -> groups` such as
      `fc_groups.cluster_aware()`.
    round_index: `[]` int rounds done (read by `grouping`).

  Returns:
    `(params, opt_state, stats, groups)`: the updated params and optimizer
    state (leaves `[N, ...]`), a `RoundStats` in client order and the round's
    `_Groups`.
  """
  n = byzantine.shape[0]
  group_key, attack_key = jax.random.split(key)
  groups = (random_groups(group_key, n, num_groups) if grouping is None else
            grouping(group_key, params, num_groups, round_index))
  if getattr(grouping, "radius", None) is not None:  # This round's radius.
    radius = grouping.radius(radius, round_index)
  size = groups.index.shape[1]
  group_shape = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      (size,) + x.shape[1:], x.dtype), t)
  plan = kernels.resolve_plan(plan, loss_fn, group_shape(params),
                              group_shape(batch),
                              messages=(attack is not None or
                                        pre_aggregator is not None or
                                        ball_cap is not None),
                              num_models=n)
  gkeys = jax.random.split(attack_key, num_groups)

  def group_update(params, opt_state, index, weight, gkey):
    """Steps one group's S clients; returns their new rows and their stats."""
    gparams = tree_lib.take(params, index)
    gbatch = tree_lib.take(batch, index)

    def clustered(_):
      out = _group_directions(
          loss_fn, gparams, gbatch, byzantine[index] & (weight > 0), weight,
          gkey, radius=radius, num_iters=num_iters, plan=plan,
          attack=attack, pre_aggregator=pre_aggregator, ball_cap=ball_cap)
      coefs = (jnp.full(out.inside.shape, jnp.nan) if out.coefs is None
               else out.coefs)
      return out.centers, RoundStats(out.own_loss, out.own_grad_norm,
                                     base.grad_norms(out.centers), out.inside,
                                     coefs)

    def local(_):
      losses, grads = gradients.client_grads(loss_fn, gparams, gbatch)
      norms = base.grad_norms(grads)
      size = index.shape[0]
      return grads, RoundStats(losses, norms, norms,
                               jnp.zeros((size, size), bool),
                               jnp.eye(size, dtype=jnp.float32))

    if cluster is True:
      directions, stats = clustered(None)
    else:
      directions, stats = lax.cond(cluster, clustered, local, None)
    new_params, new_opt = base.apply_updates(
        optimizer, directions, tree_lib.take(opt_state, index), gparams)
    return new_params, new_opt, stats

  def put(full, rows, index, weight):
    """`full[index] = rows` (rows `[R, ...]`, index `[R]`) but for padding."""
    dest = jnp.where(weight > 0, index, n)  # Out of bounds: dropped.
    return jax.tree.map(lambda x, r: x.at[dest].set(r, mode="drop"),
                        full, rows)

  xs = (groups.index, groups.weight, gkeys)
  if plan.chunk_size is None:
    new_params, new_opt, stats = jax.vmap(
        group_update, in_axes=(None, None, 0, 0, 0))(params, opt_state, *xs)
    flat = lambda t: jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), t)
    index, weight = groups.index.ravel(), groups.weight.ravel()
    params = put(params, flat(new_params), index, weight)
    opt_state = put(opt_state, flat(new_opt), index, weight)
  else:
    def body(carry, x):
      params, opt_state = carry
      index, weight, _ = x
      new_params, new_opt, stats = group_update(params, opt_state, *x)
      return (put(params, new_params, index, weight),
              put(opt_state, new_opt, index, weight)), stats
    (params, opt_state), stats = lax.scan(body, (params, opt_state), xs)
  return params, opt_state, _to_client_order(stats, groups), groups


def federated_clustering(loss_fn, optimizer: optax.GradientTransformation, *,
                         radius: clustering.Radius, num_iters: int = 10,
                         num_groups: int = 1, local_steps: int = 0,
                         attack=None,
                         plan: kernels.ExecutionPlan = kernels.ExecutionPlan(),
                         pre_aggregator=None, ball_cap=None,
                         grouping=None,
                         true_clusters=None) -> base.Algorithm:
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
    plan: execution plan of the all-pairs gradients (same results; the
      default picks chunk and kernel from the backend and the loss, see
      `prfl_jax.kernels`). `kernel="ghost"` cannot apply an `attack`.
    pre_aggregator: optional defence applied at every model to the N
      gradients (after the attack) before Threshold-Clustering: a
      `prfl.aggregators` pre-aggregator keeping one row per client, e.g.
      `cap_duplicates()` (see `algorithms.fc_defence`).
    ball_cap: optional defence across models: each round, a client's
      message takes part in at most `ceil(ball_cap * m)` of the balls, m the
      median number of balls a client joins (`fc_defence.cap_balls`; a second
      clustering pass per round). None: no cap.
    grouping: how the `num_groups` groups are formed: None (uniformly at
      random every round, the paper's setting) or a rule such as
      `prfl.algorithms.fc_groups.cluster_aware()`.
    true_clusters: optional concrete `[N]` true cluster ids, known to the
      experimenter only: the step then also reports purity and Byzantine
      weight (`prfl_jax.diagnostics.rounds.group_stats`).

  Returns:
    `Algorithm(init, step)`; `init(params, *, byzantine=None)` takes params
    with leaves `[N, ...]` and an optional `[N]` bool mask. Jitted with
    `donate_argnums=0`, `step` writes the new state over the old one.

  References:
    Werner et al., 2023, Algorithm 1 (Federated-Clustering) and Algorithm 2.
  """
  base.check_optimizer(optimizer)
  base.check_positive_int(num_iters, "num_iters")
  base.check_positive_int(num_groups, "num_groups")
  base.check_positive_int(local_steps, "local_steps", minimum=0)
  if pre_aggregator is not None and not callable(pre_aggregator):
    raise TypeError("`pre_aggregator` must be a prfl.aggregators "
                    f"pre-aggregator, got {type(pre_aggregator)}.")
  fc_defence.check_ball_cap(ball_cap)
  kernels.check_plan(plan, messages=(attack is not None or
                                     pre_aggregator is not None or
                                     ball_cap is not None))
  if not callable(radius):
    clustering.check_radius(radius, 1)
  if grouping is not None and not callable(grouping):
    raise TypeError(f"`grouping` must be None or a rule such as "
                    f"fc_groups.cluster_aware(), got {type(grouping)}.")
  if getattr(grouping, "radius", None) is not None:
    grouping.radius(radius, 0)  # Raises on a radius it cannot change.
  truth = diagnostics.check_true_clusters(true_clusters)

  def init(params, *, byzantine=None) -> FederatedClusteringState:
    n = base.init_params(params)
    base.check_at_most_clients(num_groups, "num_groups", n)
    diagnostics.rounds.check_num_clients(truth, n)
    opt_state = jax.vmap(optimizer.init)(params)
    return FederatedClusteringState(params, opt_state,
                                    base.byzantine_mask(byzantine, n),
                                    jnp.zeros((), jnp.int32))

  def step(state: FederatedClusteringState, batch: PyTree, key: jax.Array):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    base.check_at_most_clients(num_groups, "num_groups",
                               state.byzantine.shape[0])
    cluster = (True if local_steps == 0 else
               state.round % (local_steps + 1) == 0)
    params, opt_state, stats, groups = clustered_update(
        loss_fn, optimizer, state.params, state.opt_state, batch,
        state.byzantine, key, radius=radius, num_iters=num_iters,
        num_groups=num_groups, plan=plan, attack=attack,
        cluster=cluster, pre_aggregator=pre_aggregator, ball_cap=ball_cap,
        grouping=grouping, round_index=state.round)
    # Share of each client's group inside its final ball, and the share of
    # the group that is both Byzantine and inside (0 in local rounds).
    group_of = groups.slot // groups.index.shape[1]  # [N]
    slot_w = groups.weight[group_of]  # [N, S]
    slot_byz = (state.byzantine[groups.index] & (groups.weight > 0))[group_of]
    inside = stats.inside & (slot_w > 0)
    gsize = jnp.sum(slot_w, axis=1)
    in_ball = jnp.sum(inside, axis=1) / gsize
    byz_in = jnp.sum(inside & slot_byz, axis=1) / gsize
    metrics = {
        "loss": base.benign_mean(stats.own_loss, state.byzantine),
        "grad_norm": base.benign_mean(stats.own_grad_norm, state.byzantine),
        "update_norm": base.benign_mean(stats.update_norm, state.byzantine),
        "ball_fraction": base.benign_mean(in_ball, state.byzantine),
        "byzantine_in_ball": base.benign_mean(byz_in, state.byzantine),
        "clustered": jnp.asarray(cluster, jnp.float32),
    }
    metrics.update(diagnostics.rounds.group_stats(
        stats.coefs, groups.index[group_of], slot_w > 0, state.byzantine,
        truth))
    return state._replace(params=params, opt_state=opt_state,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
