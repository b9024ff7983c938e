"""Ditto (Li, Hu, Beirami and Smith, 2021).

Every client keeps a personal model `v_i` regularised towards a global model
`w`, and `w` is trained by FedAvg on the same rounds. Every round, with the
batch split into `local_steps` micro-batches:

* global part (FedAvg): every client runs `local_steps` steps of
  `global_optimizer` from `w` (fresh state) and sends its model change;
  `w <- w + mean_i (w_i' - w)` (Byzantine clients send `attack`'s message);
* personal part: every client takes `local_steps` steps of `optimizer` on
  `f_i(v) + lam / 2 ||v - w||^2`, with the round's starting `w`, i.e.
  `v <- v - eta (grad f_i(v) + lam (v - w))` for `optax.sgd(eta)`.

`lam = 0` is local training, large `lam` pulls every personal model to the
global model. The personal models start at the stacked `params` of `init`, the
global model at client 0's params.
"""

from typing import Any, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import optax

from prfl_jax import gradients
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models
from prfl_jax.algorithms.fedavg import local_updates

PyTree = Any


class DittoState(NamedTuple):
  """State of Ditto."""
  params: PyTree  # leaves [N, ...]: personal models v_i.
  opt_state: PyTree  # leaves [N, ...]: personal optimizer state.
  global_params: PyTree  # leaves [...]: the global model w (unstacked).
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("params", "opt_state", "byzantine"))


def personal_steps(loss_fn, optimizer: optax.GradientTransformation,
                   params: PyTree, opt_state: PyTree, anchor: PyTree,
                   batch: PyTree, *, lam, local_steps: int):
  """`local_steps` optimizer steps on `f_i(v) + lam / 2 ||v - anchor_i||^2`.

  Args:
    loss_fn: loss for one client.
    optimizer: personal optimizer.
    params: personal models, leaves `[N, ...]`.
    opt_state: their optimizer state, leaves `[N, ...]`.
    anchor: the global model copied to every client, leaves `[N, ...]`.
    batch: leaves `[N, B, ...]`, split into `local_steps` micro-batches.
    lam: regularisation strength (>= 0).
    local_steps: number of steps.

  Returns:
    `(params, opt_state, first_losses [N])`: first_losses is `f_i(v_i)` on
    the first micro-batch.
  """
  micro = base.split_batch(batch, local_steps)

  def body(carry, mb):
    v, s = carry
    losses, grads = gradients.client_grads(loss_fn, v, mb)
    grads = jax.tree.map(lambda g, p, a: g + lam * (p - a), grads, v, anchor)
    v, s = base.apply_updates(optimizer, grads, s, v)
    return (v, s), losses

  (params, opt_state), losses = lax.scan(body, (params, opt_state), micro)
  return params, opt_state, losses[0]


def ditto(loss_fn, optimizer: optax.GradientTransformation, *, lam: float,
          local_steps: int = 1,
          global_optimizer: Optional[optax.GradientTransformation] = None,
          attack=None) -> base.Algorithm:
  """Ditto: personal models regularised towards a FedAvg global model.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: optimizer of the personal models (state kept across rounds).
    lam: regularisation strength lambda >= 0 (Werner et al., 2023 use 1).
    local_steps: local steps per round, for both parts.
    global_optimizer: clients' local optimizer of the FedAvg part (fresh state
      every round); default `optimizer`.
    attack: what Byzantine clients send instead of their global-model change,
      or None.

  Returns:
    `Algorithm(init, step)`; `init(params, *, byzantine=None)`.

  Raises:
    TypeError: if `loss_fn` is not callable or an optimizer is not an optax
      transformation.
    ValueError: on a bad `lam` or `local_steps`.

  References:
    Li, Hu, Beirami and Smith, 2021, "Ditto: Fair and Robust Federated
    Learning Through Personalization", Algorithm 1.
  """
  cluster_models.check_callable(loss_fn, "loss_fn")
  base.check_optimizer(optimizer)
  if global_optimizer is None:
    global_optimizer = optimizer
  elif not isinstance(global_optimizer, optax.GradientTransformation):
    raise TypeError(
        "`global_optimizer` must be an optax.GradientTransformation or None, "
        f"got {type(global_optimizer)}.")
  cluster_models.check_non_negative(lam, "lam")
  base.check_positive_int(local_steps, "local_steps")

  def init(params, *, byzantine=None) -> DittoState:
    n = base.init_params(params)
    return DittoState(params, jax.vmap(optimizer.init)(params),
                      jax.tree.map(lambda p: p[0], params),
                      base.byzantine_mask(byzantine, n),
                      jnp.zeros((), jnp.int32))

  def step(state: DittoState, batch: PyTree, key: jax.Array):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    n = state.byzantine.shape[0]
    anchor = tree_lib.broadcast(state.global_params, n)
    deltas, global_losses = local_updates(loss_fn, global_optimizer, anchor,
                                          batch, local_steps)
    messages = base.attacked(attack, deltas, state.byzantine, key)
    mean = tree_lib.weighted_mean(messages, jnp.ones((n,), jnp.float32))
    global_params = jax.tree.map(jnp.add, state.global_params, mean)
    params, opt_state, losses = personal_steps(
        loss_fn, optimizer, state.params, state.opt_state, anchor, batch,
        lam=lam, local_steps=local_steps)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "global_loss": base.benign_mean(global_losses, state.byzantine),
        "distance_to_global": base.benign_mean(
            jnp.sqrt(tree_lib.sq_distances(
                state.params, jax.tree.map(lambda w: w[None],
                                           state.global_params))[:, 0]),
            state.byzantine),
    }
    return state._replace(params=params, opt_state=opt_state,
                          global_params=global_params,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
