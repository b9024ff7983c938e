"""`cluster_at_models`: Federated-Clustering's inner loop for every model.

For every model i of a round, Threshold-Clustering of the N clients'
gradients `{g_j(x_i)}_j` with one centre started at the owner's `g_i(x_i)`
(Werner et al., 2023, Algorithm 1, lines 6-7), by the kernel and with the
chunking of a resolved plan (`kernels.resolve`).
"""

from typing import Optional, Union

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import clustering
from prfl_jax import tree as tree_lib
from prfl_jax.kernels import base
from prfl_jax.kernels import plan as plan_lib
from prfl_jax.kernels import resolve


def cluster_at_models(
    loss_fn, params, batch, *, radius: clustering.Radius, num_iters: int,
    weights: Optional[jax.Array] = None,
    plan: Union[plan_lib.ExecutionPlan,
                resolve.ResolvedPlan] = plan_lib.ExecutionPlan(),
    message_fn: Optional[base.MessageFn] = None,
    key: Optional[jax.Array] = None) -> base.PairsOutput:
  """For every model i: Threshold-Clustering of `{g_j(x_i)}_j` from `g_i(x_i)`.

  This is the inner loop of Federated-Clustering (Werner et al., 2023,
  Algorithm 1, lines 6-7) for all N clients at once.

  Args:
    loss_fn: loss for one client.
    params: leaves `[N, ...]`; model i belongs to client i.
    batch: leaves `[N, B, ...]`.
    radius: clustering radius (scalar, or a rule such as `quantile_radius`).
    num_iters: Threshold-Clustering steps.
    weights: optional `[N]` client weights (0 = padding).
    plan: execution plan (all plans give the same result), or a
      `ResolvedPlan` from `resolve_plan` for this loss and these shapes
      (then used as it is: neither checked nor traced again).
    message_fn: optional `message_fn(grads [N, ...], i, key)` that replaces the
      honest gradients sent to model i (Byzantine attacks).
    key: PRNG key for `message_fn`.

  Returns:
    `PairsOutput` with leading axis N.

  Raises:
    ValueError: if `weights` is not `[N]`, `message_fn` comes without `key`,
      or `plan.kernel` cannot apply `message_fn`.
    TypeError: if `plan` is not an `ExecutionPlan`.
  """
  n = tree_lib.num_leading(params, "params")
  if weights is None:
    weights = jnp.ones((n,), jnp.float32)
  elif np.shape(weights) != (n,):
    raise ValueError(
        f"`weights` must have shape [{n}] (one per client), got "
        f"{np.shape(weights)}.")
  if message_fn is not None and key is None:
    raise ValueError("`key` is required when `message_fn` is given.")
  plan = resolve.resolve_plan(plan, loss_fn, params, batch,
                              messages=message_fn is not None)
  problem = base.Problem(loss_fn, batch, radius, num_iters, weights,
                         message_fn, key)
  kernel = plan_lib.lookup(plan.kernel, base.KERNELS)
  ctx = kernel.prepare(problem, params, plan.analysis)
  fn = lambda args: kernel.cluster(problem, ctx, *args)
  xs = (jnp.arange(n), params)
  if plan.chunk_size is None or plan.chunk_size >= n:
    return jax.vmap(fn)(xs)
  if plan.chunk_size == 1:
    # A plain scan over models: XLA:CPU lays out the body's dots without the
    # transposes and copies that a size-1 vmap inside lax.map introduces.
    return lax.map(fn, xs)
  return lax.map(fn, xs, batch_size=plan.chunk_size)
