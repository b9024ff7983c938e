"""Ground-truth oracle: distributed training within the true clusters.

The "GT" baseline of Werner et al., 2023 (Section 5): the clustering is known,
so every client updates with the mean gradient of the benign members of its
true cluster. It is the reference Federated-Clustering should approach.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from prfl_jax import gradients
from prfl_jax.algorithms import base

PyTree = Any


class OracleState(NamedTuple):
  """State of the ground-truth oracle."""
  params: PyTree  # leaves [N, ...]: model of each client (same within a cluster).
  opt_state: PyTree  # leaves [N, ...]: per-client optimizer state.
  byzantine: jax.Array  # [N] bool: malicious clients, excluded from the means.
  round: jax.Array  # [] int32: rounds done.


def cluster_means(values: PyTree, clusters: jax.Array, weights: jax.Array,
                  num_clusters: int) -> PyTree:
  """Weighted mean of `values` within each cluster, gathered back per client.

  Args:
    values: leaves `[N, ...]`.
    clusters: `[N]` int cluster ids in `[0, num_clusters)`.
    weights: `[N]` non-negative weights.
    num_clusters: number of clusters K.

  Returns:
    leaves `[N, ...]`: row i is the mean over client i's cluster (0 for an
    empty cluster).
  """
  totals = jax.ops.segment_sum(weights, clusters, num_clusters)
  def mean(v):
    w = weights.reshape((-1,) + (1,) * (v.ndim - 1)).astype(v.dtype)
    sums = jax.ops.segment_sum(w * v, clusters, num_clusters)
    t = totals.reshape((-1,) + (1,) * (v.ndim - 1)).astype(v.dtype)
    return (sums / jnp.where(t > 0, t, 1.0))[clusters]
  return jax.tree.map(mean, values)


def oracle(loss_fn, optimizer: optax.GradientTransformation, *,
           clusters) -> base.Algorithm:
  """Training with the ground-truth clusters.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: optax optimizer, applied per client to its cluster's mean
      gradient.
    clusters: `[N]` int true cluster of every client (concrete).

  Returns:
    `Algorithm(init, step)`.
  """
  base.check_optimizer(optimizer)
  clusters = np.asarray(clusters)
  if clusters.ndim != 1 or not np.issubdtype(clusters.dtype, np.integer):
    raise ValueError(
        f"`clusters` must be a 1-D integer array, got {clusters.dtype} of shape "
        f"{clusters.shape}.")
  if clusters.size and clusters.min() < 0:
    raise ValueError("`clusters` must be non-negative cluster ids.")
  num_clusters = int(clusters.max()) + 1 if clusters.size else 0
  clusters = jnp.asarray(clusters, jnp.int32)

  def init(params, *, byzantine=None) -> OracleState:
    n = base.init_params(params)
    if n != clusters.shape[0]:
      raise ValueError(
          f"`clusters` has {clusters.shape[0]} entries but `params` has {n} "
          "clients.")
    return OracleState(params, jax.vmap(optimizer.init)(params),
                       base.byzantine_mask(byzantine, n),
                       jnp.zeros((), jnp.int32))

  def step(state: OracleState, batch, key):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    del key  # Unused.
    losses, grads = gradients.client_grads(loss_fn, state.params, batch)
    weights = (~state.byzantine).astype(jnp.float32)
    directions = cluster_means(grads, clusters, weights, num_clusters)
    params, opt_state = base.apply_updates(optimizer, directions,
                                           state.opt_state, state.params)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "grad_norm": base.benign_mean(base.grad_norms(grads), state.byzantine),
    }
    return state._replace(params=params, opt_state=opt_state,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
