"""Myopic-Clustering (Werner et al., 2023, Section 2, Algorithm Myopic-Clustering).

Every round, each client sends its gradient at its own model `g_i(x_{i,t-1})`
to the server; the server clusters the N gradients into (at most) K clusters
and sends each client the centre of its cluster, which the client applies:
`x_{i,t} = x_{i,t-1} - eta * v_{k_i,t}`. It needs only O(N) communication but
never re-checks a past clustering decision, and once the models converge all
gradients approach 0 and every client falls into one cluster (the paper's
failure-mode Example 1, reproduced in `experiments/failure_modes.py`).

The server's clustering, every round:
1. initial centres by farthest-first traversal (Gonzalez, 1985) over the
   received gradients: the first centre is a uniformly random client's
   gradient (from `key`), each next one the gradient farthest from the centres
   chosen so far. A new centre is opened only if that distance exceeds
   `separation`; otherwise the remaining centres repeat the first one and
   receive no client, so gradients that are all within `separation` of each
   other form a single cluster. Non-finite gradients are never chosen.
2. Threshold-Clustering (Algorithm 2) with these K centres and `radius`.
3. each client takes the nearest centre (`prfl_jax.clustering.assign`; ties go
   to the lowest index, so repeated centres stay empty).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from prfl_jax import clustering
from prfl_jax import diagnostics
from prfl_jax import gradients
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models

PyTree = Any


class MyopicClusteringState(NamedTuple):
  """State of Myopic-Clustering."""
  params: PyTree  # leaves [N, ...]: personalized models x_i.
  opt_state: PyTree  # leaves [N, ...]: per-client optimizer state.
  assignment: jax.Array  # [N] int32: cluster of every client, last round.
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("params", "opt_state", "assignment",
                                "byzantine"))


def myopic_clustering(loss_fn, optimizer: optax.GradientTransformation, *,
                      num_clusters: int, radius: clustering.Radius,
                      num_iters: int = 10, separation=None,
                      attack=None, method: str = "direct",
                      true_clusters=None) -> base.Algorithm:
  """Myopic-Clustering: cluster the clients' own gradients, apply the centre.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: optax optimizer applied per client to its cluster centre
      (`optax.sgd(eta)` is the paper's `x <- x - eta * v`).
    num_clusters: number of clusters K (<= N).
    radius: Threshold-Clustering radius: a scalar, `[K]` array or a rule such
      as `prfl.quantile_radius(q)`.
    num_iters: Threshold-Clustering steps per round.
    separation: minimum distance between the farthest-first initial centres
      (see the module docstring). None: `radius` when it is a scalar, else 0.
    attack: what Byzantine clients send instead of their gradient, or None.
    method: Threshold-Clustering kernel, "direct" or "gram". "gram" computes
      one `[N, N]` Gram matrix of the messages per round and reads the
      farthest-first, clustering and assignment distances off it
      (`clustering.cluster_and_assign`): much faster when the model is large
      (same result up to float rounding of the distances).
    true_clusters: optional concrete `[N]` true cluster ids, known to the
      experimenter only: the step then also reports the diagnostics that
      need them (`prfl_jax.diagnostics.rounds`).

  Returns:
    `Algorithm(init, step)`; `init(params, *, byzantine=None)` takes params
    with leaves `[N, ...]`.

  Raises:
    TypeError: if `loss_fn` is not callable or `optimizer` not an optax
      transformation.
    ValueError: on a bad `num_clusters`, `radius`, `num_iters`,
      `separation` or `method`; at `init`, if K > N.

  References:
    Werner et al., 2023, Section 2, Algorithm Myopic-Clustering; Algorithm 2.
  """
  cluster_models.check_callable(loss_fn, "loss_fn")
  base.check_optimizer(optimizer)
  base.check_positive_int(num_clusters, "num_clusters")
  base.check_positive_int(num_iters, "num_iters")
  clustering.check_radius(radius, num_clusters)
  if separation is None:
    scalar = not callable(radius) and jnp.ndim(radius) == 0
    separation = float(radius) if scalar else 0.0
  cluster_models.check_non_negative(separation, "separation")
  clustering.check_method(method)
  truth = diagnostics.check_true_clusters(true_clusters)

  def init(params, *, byzantine=None) -> MyopicClusteringState:
    n = base.init_params(params)
    base.check_at_most_clients(num_clusters, "num_clusters", n)
    diagnostics.rounds.check_num_clients(truth, n)
    return MyopicClusteringState(
        params, jax.vmap(optimizer.init)(params),
        jnp.zeros((n,), jnp.int32), base.byzantine_mask(byzantine, n),
        jnp.zeros((), jnp.int32))

  def step(state: MyopicClusteringState, batch: PyTree, key: jax.Array):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    base.check_at_most_clients(num_clusters, "num_clusters",
                               state.byzantine.shape[0])
    attack_key, start_key = jax.random.split(key)
    losses, grads = gradients.client_grads(loss_fn, state.params, batch)
    messages = base.attacked(attack, grads, state.byzantine, attack_key)
    gram = tree_lib.gram(messages) if method == "gram" else None
    index = clustering.farthest_first(messages, num_clusters, start_key,
                                      separation=separation, gram=gram)
    centers, assignment, directions, info = (
        clustering.cluster_and_assign_with_info(
            messages, tree_lib.take(messages, index), radius=radius,
            num_iters=num_iters, method=method, gram=gram))
    # Centre k started at message index[k], which keeps 1 - sum_i a_ki.
    coefs = info.coefs + jax.nn.one_hot(index, assignment.shape[0]) * (
        1.0 - jnp.sum(info.coefs, axis=1, keepdims=True))
    params, opt_state = base.apply_updates(optimizer, directions,
                                           state.opt_state, state.params)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "grad_norm": base.benign_mean(base.grad_norms(grads), state.byzantine),
        "num_clusters": cluster_models.count_nonempty(assignment,
                                                      num_clusters),
    }
    metrics.update(diagnostics.rounds.assignment_stats(
        assignment, num_clusters, state.byzantine, truth, coefs=coefs,
        centers=centers))
    return state._replace(params=params, opt_state=opt_state,
                          assignment=assignment,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
