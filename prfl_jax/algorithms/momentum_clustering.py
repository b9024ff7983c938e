"""Momentum-Clustering (Werner et al., 2023, Algorithm 3).

Every client sends its momentum `m_i = alpha * g_i(x_i) + (1 - alpha) * m_i`
(eq. (momentum-definition)); the server runs Threshold-Clustering on the N
momenta with K centres carried over from the previous round, assigns every
client to its nearest centre and sends it that centre, which the client uses as
its update direction. Communication is O(N) per round instead of O(N^2).

The K centres are initialised in the first round by farthest-first traversal of
the momenta (a random first client, then repeatedly the client farthest from
every chosen centre), so that well-separated clusters start with a centre each.
"""

from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import optax

from prfl_jax import clustering
from prfl_jax import gradients
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models

PyTree = Any


class MomentumClusteringState(NamedTuple):
  """State of Momentum-Clustering."""
  params: PyTree  # leaves [N, ...]: personalized models x_i.
  opt_state: PyTree  # leaves [N, ...]: per-client optimizer state.
  momentum: PyTree  # leaves [N, ...]: client momenta m_i.
  centers: PyTree  # leaves [K, ...]: server cluster centres v_k.
  assignment: jax.Array  # [N] int32: cluster of each client last round.
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("params", "opt_state", "momentum",
                                "assignment", "byzantine"))


def momentum_clustering(loss_fn, optimizer: optax.GradientTransformation, *,
                        num_clusters: int, radius: clustering.Radius,
                        num_iters: int = 10, alpha: float = 0.1,
                        attack=None, method: str = "direct"
                        ) -> base.Algorithm:
  """Momentum-Clustering: server-side clustering of client momenta.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: optax optimizer applied per client to its centre
      (`optax.sgd(eta)` is the paper's `x <- x - eta * v_{k_i}`).
    num_clusters: K, the number of centres (K <= N).
    radius: Threshold-Clustering radius (scalar, `[K]`, or a rule).
    num_iters: Threshold-Clustering steps per round.
    alpha: momentum weight of the new gradient, in (0, 1].
    attack: what Byzantine clients send instead of their momentum, or None.
    method: Threshold-Clustering kernel, "direct" or "gram". "gram" computes
      one `[N, N]` Gram matrix of the momenta per round (shared by the
      first round's farthest-first) and reads all distances off it
      (`clustering.cluster_and_assign`); the carried centres, which are not
      combinations of this round's momenta, enter through their `[N, K]`
      inner products with the momenta.

  Returns:
    `Algorithm(init, step)`.

  Raises:
    TypeError: if `optimizer` is not an optax transformation.
    ValueError: on a bad `num_clusters`, `num_iters`, `alpha`, `radius` or
      `method`; at `init`, if K > N.

  References:
    Werner et al., 2023, Algorithm 3 (Momentum-Clustering).
  """
  base.check_optimizer(optimizer)
  base.check_positive_int(num_clusters, "num_clusters")
  base.check_positive_int(num_iters, "num_iters")
  if not isinstance(alpha, jax.core.Tracer) and not 0.0 < float(alpha) <= 1.0:
    raise ValueError(f"`alpha` must be in (0, 1], got {alpha!r}.")
  clustering.check_radius(radius, num_clusters)
  clustering.check_method(method)

  def init(params, *, byzantine=None) -> MomentumClusteringState:
    n = base.init_params(params)
    base.check_at_most_clients(num_clusters, "num_clusters", n)
    zeros = jax.tree.map(jnp.zeros_like, params)
    centers = jax.tree.map(lambda p: jnp.zeros((num_clusters,) + p.shape[1:],
                                               p.dtype), params)
    return MomentumClusteringState(
        params, jax.vmap(optimizer.init)(params), zeros, centers,
        jnp.zeros((n,), jnp.int32), base.byzantine_mask(byzantine, n),
        jnp.zeros((), jnp.int32))

  def step(state: MomentumClusteringState, batch, key):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    base.check_at_most_clients(num_clusters, "num_clusters",
                               state.byzantine.shape[0])
    init_key, attack_key = jax.random.split(key)
    losses, grads = gradients.client_grads(loss_fn, state.params, batch)
    momentum = jax.tree.map(lambda g, m: alpha * g + (1.0 - alpha) * m,
                            grads, state.momentum)
    messages = base.attacked(attack, momentum, state.byzantine, attack_key)
    gram = tree_lib.gram(messages) if method == "gram" else None
    prev = lax.cond(state.round == 0,
                    lambda: tree_lib.take(messages, clustering.farthest_first(
                        messages, num_clusters, init_key, gram=gram)),
                    lambda: state.centers)
    centers, assignment, directions = clustering.cluster_and_assign(
        messages, prev, radius=radius, num_iters=num_iters, method=method,
        gram=gram)
    params, opt_state = base.apply_updates(optimizer, directions,
                                           state.opt_state, state.params)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "grad_norm": base.benign_mean(base.grad_norms(grads), state.byzantine),
        "update_norm": base.benign_mean(base.grad_norms(directions),
                                        state.byzantine),
        "num_active_clusters": cluster_models.count_nonempty(assignment,
                                                             num_clusters),
    }
    new_state = MomentumClusteringState(params, opt_state, momentum, centers,
                                        assignment, state.byzantine,
                                        state.round + 1)
    return new_state, metrics

  return base.Algorithm(init, step)
