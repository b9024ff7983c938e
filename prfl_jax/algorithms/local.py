"""Local training: every client optimises its own loss, no collaboration.

The "Local" baseline of Werner et al., 2023 (Section 5).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from prfl_jax import gradients
from prfl_jax.algorithms import base

PyTree = Any


class LocalState(NamedTuple):
  """State of local training."""
  params: PyTree  # leaves [N, ...]: one model per client.
  opt_state: PyTree  # leaves [N, ...]: per-client optimizer state.
  byzantine: jax.Array  # [N] bool: malicious clients (they only hurt themselves).
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("params", "opt_state", "byzantine"))


def local(loss_fn, optimizer: optax.GradientTransformation) -> base.Algorithm:
  """Standalone training: `x_i <- x_i + optimizer(g_i(x_i))`.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: optax optimizer, applied per client.

  Returns:
    `Algorithm(init, step)`.
  """
  base.check_optimizer(optimizer)

  def init(params, *, byzantine=None) -> LocalState:
    n = base.init_params(params)
    return LocalState(params, jax.vmap(optimizer.init)(params),
                      base.byzantine_mask(byzantine, n),
                      jnp.zeros((), jnp.int32))

  def step(state: LocalState, batch, key):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    del key  # Unused.
    losses, grads = gradients.client_grads(loss_fn, state.params, batch)
    params, opt_state = base.apply_updates(optimizer, grads, state.opt_state,
                                           state.params)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "grad_norm": base.benign_mean(base.grad_norms(grads), state.byzantine),
    }
    return state._replace(params=params, opt_state=opt_state,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
