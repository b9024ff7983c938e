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
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models

PyTree = Any


class OracleState(NamedTuple):
  """State of the ground-truth oracle."""
  params: PyTree  # leaves [N, ...]: model of each client (same within a cluster).
  opt_state: PyTree  # leaves [N, ...]: per-client optimizer state.
  byzantine: jax.Array  # [N] bool: malicious clients, excluded from the means.
  round: jax.Array  # [] int32: rounds done.
  clusters: jax.Array  # [N] int32: true cluster of each client.
  layout = base.Layout(clients=("params", "opt_state", "byzantine",
                                "clusters"))


def oracle(loss_fn, optimizer: optax.GradientTransformation, *,
           clusters) -> base.Algorithm:
  """Training with the ground-truth clusters.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: optax optimizer, applied per client to its cluster's mean
      gradient.
    clusters: `[N]` int true cluster of every client (concrete), N >= 1.

  Returns:
    `Algorithm(init, step)`.

  Raises:
    ValueError: if `clusters` is empty (no clients), not a 1-D integer
      array, or has a negative id; from `init`, if `params` has other than
      N clients.
  """
  base.check_optimizer(optimizer)
  clusters = np.asarray(clusters)
  if clusters.size == 0:
    raise ValueError(
        "`clusters` is empty: the oracle needs at least one client (one "
        "cluster id per client).")
  if clusters.ndim != 1 or not np.issubdtype(clusters.dtype, np.integer):
    raise ValueError(
        f"`clusters` must be a 1-D integer array, got {clusters.dtype} of shape "
        f"{clusters.shape}.")
  if clusters.min() < 0:
    raise ValueError("`clusters` must be non-negative cluster ids.")
  num_clusters = int(clusters.max()) + 1
  clusters = jnp.asarray(clusters, jnp.int32)

  def init(params, *, byzantine=None) -> OracleState:
    n = base.init_params(params)
    if n != clusters.shape[0]:
      raise ValueError(
          f"`clusters` has {clusters.shape[0]} entries but `params` has {n} "
          "clients.")
    return OracleState(params, jax.vmap(optimizer.init)(params),
                       base.byzantine_mask(byzantine, n),
                       jnp.zeros((), jnp.int32), clusters)

  def step(state: OracleState, batch, key):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    del key  # Unused.
    losses, grads = gradients.client_grads(loss_fn, state.params, batch)
    weights = (~state.byzantine).astype(jnp.float32)
    means, _ = cluster_models.segment_mean(grads, state.clusters,
                                           num_clusters, weights)
    directions = tree_lib.take(means, state.clusters)
    params, opt_state = base.apply_updates(optimizer, directions,
                                           state.opt_state, state.params)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "grad_norm": base.benign_mean(base.grad_norms(grads), state.byzantine),
    }
    return state._replace(params=params, opt_state=opt_state,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
