"""IFCA, the Iterative Federated Clustering Algorithm (Ghosh et al., 2020).

The server keeps K cluster models `theta_k`. Every round each client evaluates
its loss at all K models on its batch and picks the best one,
`k_i = argmin_k f_i(theta_k)` (ties: lowest index). Then, with the members
`S_k = {i : k_i = k}` of every cluster:

* Option I (gradient averaging, `option=1`): client i sends its gradient at
  its chosen model, `g_i = grad f_i(theta_{k_i})`, and every cluster model
  moves by the mean gradient of its members, divided by the cluster's own
  size: `theta_k <- theta_k + optimizer(mean_{i in S_k} g_i)`
  (`optax.sgd(gamma)` is `theta_k - gamma / |S_k| sum_{i in S_k} g_i`).
* Option II (model averaging, `option=2`): client i runs `local_steps`
  optimizer steps from `theta_{k_i}` (fresh optimizer state, the batch split
  into `local_steps` micro-batches) and every cluster model becomes the
  average of its members' models, `theta_k <- theta_k + mean_{i in S_k}
  (theta_i' - theta_k)`.

A cluster with no member keeps its model (and optimizer state). Clients send
gradients (Option I) or model changes (Option II); Byzantine clients replace
them with `attack`. The paper's failure-mode Example 2 (Werner et al., 2023,
Section 2) shows both options staying at a wrong clustering for ever.

Initialisation: the factory takes exactly one of `init_models` (leaves
`[K, ...]`, the K models) and `key`; with a key, `init` draws the K models as
the initial params of the first client whose params are finite (client 0
unless it is broken, e.g. NaN: one such client must not make all K models
NaN) plus `init_scale` times standard Gaussian noise (one draw per cluster).
So `init(params, *, byzantine=None)` has the signature of every algorithm and
`prfl.train` and `prfl.sweep` run IFCA like any other method.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from prfl_jax import aggregators
from prfl_jax import diagnostics
from prfl_jax import gradients
from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models
from prfl_jax.algorithms.fedavg import local_updates

PyTree = Any


def check_init_source(num_clusters: int, init_models, key):
  """Checks the factory's `init_models` / `key` pair.

  Raises:
    ValueError: unless exactly one is given, if `init_models` does not hold
      `num_clusters` models or (when concrete) has a non-finite entry, or if
      `key` holds more than one key.
    TypeError: if `key` is not a PRNG key.
  """
  if (init_models is None) == (key is None):
    raise ValueError(
        "give the factory exactly one of `init_models` (the K initial "
        "models, leaves [K, ...]) and `key` (random models around a client's "
        "initial params), e.g. ifca(loss_fn, opt, num_clusters=K, "
        "key=jax.random.key(0)).")
  if key is not None:
    validation.check_key(key)
    return
  k = tree_lib.num_leading(init_models, "init_models")
  if k != num_clusters:
    raise ValueError(
        f"`init_models` has {k} models but `num_clusters`={num_clusters}.")
  for leaf in jax.tree.leaves(init_models):
    if not isinstance(leaf, jax.core.Tracer) and not np.all(
        np.isfinite(np.asarray(leaf))):
      raise ValueError("`init_models` has non-finite entries.")


def init_cluster_models(params: PyTree, num_clusters: int, *, init_models=None,
                        key=None, init_scale: float = 0.1) -> PyTree:
  """The K initial cluster models, leaves `[K, ...]`.

  Args:
    params: stacked client params, leaves `[N, ...]`.
    num_clusters: K.
    init_models: optional given models, leaves `[K, ...]`.
    key: PRNG key for the random init (used when `init_models` is None):
      the params of the first client whose params are all finite
      (`tree.usable`; client 0 if none is) plus `init_scale` times standard
      Gaussian noise, one draw per cluster.
    init_scale: standard deviation of that noise.

  Raises:
    ValueError: if neither or both of `init_models` and `key` are given, or
      `init_models` does not match `params` or K.
  """
  check_init_source(num_clusters, init_models, key)
  if init_models is not None:
    tree_lib.check_same_structure(params, init_models, "params",
                                  "init_models")
    return jax.tree.map(jnp.asarray, init_models)
  first = jnp.argmax(tree_lib.usable(params))  # 0 when no client is finite.
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  models = [
      leaf[first][None] + init_scale * jax.random.normal(
          k, (num_clusters,) + leaf.shape[1:], jnp.result_type(leaf))
      for k, leaf in zip(keys, leaves)]
  return jax.tree.unflatten(treedef, models)


def check_init_scale(init_scale):
  cluster_models.check_non_negative(init_scale, "init_scale")


class IfcaState(NamedTuple):
  """State of IFCA."""
  params: PyTree  # leaves [N, ...]: each client's chosen cluster model.
  models: PyTree  # leaves [K, ...]: the cluster models theta_k.
  opt_state: PyTree  # leaves [K, ...]: server optimizer state (Option I), else ().
  assignment: jax.Array  # [N] int32: cluster chosen by each client, last round.
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("params", "assignment", "byzantine"))


def ifca(loss_fn, optimizer: optax.GradientTransformation, *,
         num_clusters: int, key=None, init_models=None, option: int = 1,
         local_steps: int = 1, init_scale: float = 0.1,
         attack=None, aggregator=None,
         true_clusters=None) -> base.Algorithm:
  """IFCA with gradient averaging (Option I) or model averaging (Option II).

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: Option I: the server optimizer applied to every cluster model
      with its members' mean gradient. Option II: the clients' local
      optimizer (state re-initialised every round).
    num_clusters: number of cluster models K.
    key: PRNG key of the random initial models (see `init_cluster_models`);
      give exactly one of `key` and `init_models`.
    init_models: the K initial models, leaves `[K, ...]` (same structure as
      one client's params).
    option: 1 (gradient averaging) or 2 (model averaging).
    local_steps: Option II's local steps per round (must be 1 for Option I).
    init_scale: noise scale of the random init (see `init_cluster_models`).
    attack: what Byzantine clients send instead of their gradient / model
      change, or None.
    aggregator: how each cluster model combines its members' messages, a
      `prfl_jax.aggregators` rule (e.g. `aggregators.median()`, applied to
      the members only); None is the members' mean.
    true_clusters: optional concrete `[N]` true cluster ids, known to the
      experimenter only: the step then also reports the diagnostics that
      need them (`prfl_jax.diagnostics.rounds`).

  Returns:
    `Algorithm(init, step)`; `init(params, *, byzantine=None)` takes params
    with leaves `[N, ...]`.

  Raises:
    TypeError: if `loss_fn` is not callable, `optimizer` not an optax
      transformation or `key` not a PRNG key.
    ValueError: on a bad `num_clusters`, `option`, `local_steps` or
      `init_scale`, or unless exactly one of `key` and `init_models` (with K
      finite models) is given.

  References:
    Ghosh, Chung, Yin and Ramchandran, 2020, "An Efficient Framework for
    Clustered Federated Learning", Algorithm 1 (IFCA), Options I and II.
  """
  cluster_models.check_callable(loss_fn, "loss_fn")
  base.check_optimizer(optimizer)
  base.check_positive_int(num_clusters, "num_clusters")
  if option not in (1, 2) or isinstance(option, bool):
    raise ValueError(
        f"`option` must be 1 (gradient averaging) or 2 (model averaging), "
        f"got {option!r}.")
  base.check_positive_int(local_steps, "local_steps")
  if option == 1 and local_steps != 1:
    raise ValueError(
        f"`local_steps`={local_steps} needs option=2 (model averaging); "
        "Option I takes one gradient step per round.")
  check_init_scale(init_scale)
  check_init_source(num_clusters, init_models, key)
  if aggregator is not None and not callable(aggregator):
    raise TypeError(f"`aggregator` must be a prfl_jax.aggregators rule or "
                    f"None, got {type(aggregator)}.")
  truth = diagnostics.check_true_clusters(true_clusters)

  def init(params, *, byzantine=None) -> IfcaState:
    n = base.init_params(params)
    diagnostics.rounds.check_num_clients(truth, n)
    models = init_cluster_models(params, num_clusters,
                                 init_models=init_models, key=key,
                                 init_scale=init_scale)
    opt_state = jax.vmap(optimizer.init)(models) if option == 1 else ()
    assignment = jnp.zeros((n,), jnp.int32)
    return IfcaState(tree_lib.take(models, assignment), models, opt_state,
                     assignment, base.byzantine_mask(byzantine, n),
                     jnp.zeros((), jnp.int32))

  def step(state: IfcaState, batch: PyTree, key: jax.Array):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    losses = cluster_models.cluster_losses(loss_fn, state.models, batch)
    assignment = cluster_models.loss_assignment(losses)
    chosen = tree_lib.take(state.models, assignment)
    if option == 1:
      _, messages = gradients.client_grads(loss_fn, chosen, batch)
    else:
      messages, _ = local_updates(loss_fn, optimizer, chosen, batch,
                                  local_steps)
    honest_norm = base.benign_mean(base.grad_norms(messages), state.byzantine)
    messages = base.attacked(attack, messages, state.byzantine, key)
    if aggregator is None:
      means, sizes = cluster_models.segment_mean(messages, assignment,
                                                 num_clusters)
    else:
      means, sizes = aggregators.per_segment(aggregator, messages, assignment,
                                             num_clusters)
    nonempty = sizes > 0
    if option == 1:
      models, opt_state = base.apply_updates(optimizer, means,
                                             state.opt_state, state.models)
      models = cluster_models.keep_where_empty(nonempty, models, state.models)
      opt_state = cluster_models.keep_where_empty(nonempty, opt_state,
                                                  state.opt_state)
    else:
      models = jax.tree.map(jnp.add, state.models, means)
      opt_state = state.opt_state
    own_loss = jnp.take_along_axis(losses, assignment[None], axis=0)[0]
    metrics = {
        "loss": base.benign_mean(own_loss, state.byzantine),
        "update_norm": honest_norm,
        "num_clusters": jnp.sum(nonempty).astype(jnp.float32),
    }
    metrics.update(diagnostics.rounds.assignment_stats(
        assignment, num_clusters, state.byzantine, truth, centers=models))
    return state._replace(params=tree_lib.take(models, assignment),
                          models=models, opt_state=opt_state,
                          assignment=assignment,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
