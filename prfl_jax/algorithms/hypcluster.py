"""HypCluster (Mansour, Mohri, Ro and Suresh, 2020).

The server keeps K hypotheses (cluster models) and alternates two steps every
round:

* `expectation_step`: every client is assigned the hypothesis with the lowest
  loss on its batch (ties: lowest index).
* `maximization_step`: every hypothesis is trained on the pooled data of its
  members for `local_steps` steps: at each step all members compute their
  gradient at the *current* cluster model on one micro-batch, the server
  averages them over the cluster (equal client weights) and applies its
  optimizer (state kept per cluster across rounds). A hypothesis without
  members keeps its model and optimizer state.

Difference from IFCA (`prfl_jax.algorithms.ifca`): Werner et al. (2023,
Section 2) call HypCluster "a centralized version of Option II of IFCA". In
IFCA Option II each client drifts on its own copy for `local_steps` steps and
the server averages the final models once per round; here every one of the
`local_steps` steps is a synchronous (centralised) SGD step on the cluster's
pooled objective, so no client drifts. With `local_steps=1` HypCluster equals
IFCA Option I. Both assign clients by loss value, hence share the failure
mode of Example 2 (both clients stuck in cluster 2 at x = 0).
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
from prfl_jax.algorithms.ifca import check_init_scale
from prfl_jax.algorithms.ifca import check_init_source
from prfl_jax.algorithms.ifca import init_cluster_models

PyTree = Any


class HypClusterState(NamedTuple):
  """State of HypCluster."""
  params: PyTree  # leaves [N, ...]: each client's assigned hypothesis.
  models: PyTree  # leaves [K, ...]: the hypotheses (cluster models).
  opt_state: PyTree  # leaves [K, ...]: server optimizer state per hypothesis.
  assignment: jax.Array  # [N] int32: hypothesis of each client, last round.
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("params", "assignment", "byzantine"))


def expectation_step(loss_fn, models: PyTree, batch: PyTree):
  """Loss-based assignment.

  Args:
    loss_fn: loss for one client.
    models: leaves `[K, ...]`.
    batch: leaves `[N, B, ...]`.

  Returns:
    `(assignment [N] int32, losses [K, N])`.
  """
  losses = cluster_models.cluster_losses(loss_fn, models, batch)
  return cluster_models.loss_assignment(losses), losses


def maximization_step(loss_fn, optimizer: optax.GradientTransformation,
                      models: PyTree, opt_state: PyTree,
                      assignment: jax.Array, batch: PyTree,
                      byzantine: jax.Array, key: jax.Array, *,
                      local_steps: int, attack=None):
  """`local_steps` centralised optimizer steps per hypothesis on its members.

  Args:
    loss_fn: loss for one client.
    optimizer: server optimizer, applied to every hypothesis.
    models: leaves `[K, ...]`.
    opt_state: optimizer state, leaves `[K, ...]`.
    assignment: `[N]` int32 hypothesis of every client.
    batch: leaves `[N, B, ...]`, split into `local_steps` micro-batches.
    byzantine: `[N]` bool.
    key: PRNG key for the attack.
    local_steps: number of steps s.
    attack: optional Byzantine attack on the gradients.

  Returns:
    `(models, opt_state, grad_norms [s])`: grad_norms is the benign mean of
    the honest gradient norms at each step.
  """
  num_clusters = tree_lib.num_leading(models, "models")
  micro = base.split_batch(batch, local_steps)
  keys = jax.random.split(key, local_steps)

  def body(carry, xs):
    models, opt_state = carry
    mb, step_key = xs
    _, grads = gradients.client_grads(
        loss_fn, tree_lib.take(models, assignment), mb)
    norm = base.benign_mean(base.grad_norms(grads), byzantine)
    grads = base.attacked(attack, grads, byzantine, step_key)
    means, sizes = cluster_models.segment_mean(grads, assignment,
                                               num_clusters)
    new_models, new_state = base.apply_updates(optimizer, means, opt_state,
                                               models)
    nonempty = sizes > 0
    models = cluster_models.keep_where_empty(nonempty, new_models, models)
    opt_state = cluster_models.keep_where_empty(nonempty, new_state, opt_state)
    return (models, opt_state), norm

  (models, opt_state), norms = lax.scan(body, (models, opt_state),
                                        (micro, keys))
  return models, opt_state, norms


def hypcluster(loss_fn, optimizer: optax.GradientTransformation, *,
               num_clusters: int, key=None, init_models=None,
               local_steps: int = 1, init_scale: float = 0.1,
               attack=None, true_clusters=None) -> base.Algorithm:
  """HypCluster: alternate loss-based assignment and per-cluster training.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: server optimizer applied to every hypothesis with the mean
      gradient of its members.
    num_clusters: number of hypotheses K.
    key: PRNG key of the random initial hypotheses (see
      `ifca.init_cluster_models`: around the first finite client's params);
      give exactly one of `key` and `init_models`.
    init_models: the K initial hypotheses, leaves `[K, ...]`.
    local_steps: centralised steps per round (the batch is split into this
      many micro-batches).
    init_scale: noise scale of the random init (see
      `ifca.init_cluster_models`).
    attack: what Byzantine clients send instead of their gradients, or None.
    true_clusters: optional concrete `[N]` true cluster ids, known to the
      experimenter only: the step then also reports the diagnostics that
      need them (`prfl_jax.diagnostics.rounds`).

  Returns:
    `Algorithm(init, step)`; `init(params, *, byzantine=None)` takes params
    with leaves `[N, ...]`.

  Raises:
    TypeError: if `loss_fn` is not callable, `optimizer` not an optax
      transformation or `key` not a PRNG key.
    ValueError: on a bad `num_clusters`, `local_steps` or `init_scale`, or
      unless exactly one of `key` and `init_models` (with K finite models)
      is given.

  References:
    Mansour, Mohri, Ro and Suresh, 2020, "Three Approaches for
    Personalization with Applications to Federated Learning", Algorithm
    HypCluster; Werner et al., 2023, Section 2.
  """
  cluster_models.check_callable(loss_fn, "loss_fn")
  base.check_optimizer(optimizer)
  base.check_positive_int(num_clusters, "num_clusters")
  base.check_positive_int(local_steps, "local_steps")
  check_init_scale(init_scale)
  check_init_source(num_clusters, init_models, key)
  truth = diagnostics.check_true_clusters(true_clusters)

  def init(params, *, byzantine=None) -> HypClusterState:
    n = base.init_params(params)
    diagnostics.rounds.check_num_clients(truth, n)
    models = init_cluster_models(
        params, num_clusters, init_models=init_models, key=key,
        init_scale=init_scale)
    assignment = jnp.zeros((n,), jnp.int32)
    return HypClusterState(tree_lib.take(models, assignment), models,
                           jax.vmap(optimizer.init)(models), assignment,
                           base.byzantine_mask(byzantine, n),
                           jnp.zeros((), jnp.int32))

  def step(state: HypClusterState, batch: PyTree, key: jax.Array):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    assignment, losses = expectation_step(loss_fn, state.models, batch)
    models, opt_state, norms = maximization_step(
        loss_fn, optimizer, state.models, state.opt_state, assignment, batch,
        state.byzantine, key, local_steps=local_steps, attack=attack)
    own_loss = losses[assignment, jnp.arange(assignment.shape[0])]
    metrics = {
        "loss": base.benign_mean(own_loss, state.byzantine),
        "grad_norm": norms[0],
        "num_clusters": cluster_models.count_nonempty(assignment,
                                                      num_clusters),
    }
    metrics.update(diagnostics.rounds.assignment_stats(
        assignment, num_clusters, state.byzantine, truth, centers=models))
    return state._replace(params=tree_lib.take(models, assignment),
                          models=models, opt_state=opt_state,
                          assignment=assignment,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
