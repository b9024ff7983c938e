"""FedAvg / Global training (McMahan et al., 2017).

One global model for everyone. With `local_steps=1` every client sends its
gradient at the global model and the server applies the optimizer to their
mean (the gradient-averaging "Global" baseline of Werner et al., 2023,
Section 5). With `local_steps=s > 1` every client runs s optimizer steps from
the global model on s micro-batches of its batch (fresh optimizer state each
round) and the server averages the resulting model changes.
"""

from typing import Any, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec
import optax

from prfl_jax import gradients
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base

PyTree = Any


class FedAvgState(NamedTuple):
  """State of FedAvg; every client holds a copy of the global model."""
  params: PyTree  # leaves [N, ...]: the global model, copied to every client.
  opt_state: PyTree  # leaves [N, ...]: optimizer state (copies, local_steps=1).
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  layout = base.Layout(clients=("byzantine",), shared=("params", "opt_state"))


def local_updates(loss_fn, optimizer, params: PyTree, batch: PyTree,
                  local_steps: int, clients_at_once: Optional[int] = None,
                  mesh: Optional[Mesh] = None):
  """Every client's model change after `local_steps` optimizer steps.

  Args:
    loss_fn: loss for one client.
    optimizer: client optimizer (fresh state).
    params: leaves `[N, ...]` starting models.
    batch: leaves `[N, B, ...]`, split into `local_steps` micro-batches.
    local_steps: number of local steps s.
    clients_at_once: None trains all N clients in one `vmap`; k trains them k
      at a time (`lax.map` with `batch_size=k`; 1: one after another, no
      `vmap`). Same results up to float summation order.
    mesh: None, or a one-dimensional mesh (`prfl.sharding.client_mesh()`):
      its devices train the clients in parallel (`jax.shard_map`), each its
      N / devices clients as `clients_at_once` says. N must be divisible by
      the number of devices.

  Returns:
    `(deltas, first_losses [N])`: deltas leaves `[N, ...]` (new - start) and
    the loss of the first local step.
  """
  micro = base.split_batch(batch, local_steps)

  def one_client(p, b):
    def body(carry, mb):
      q, s = carry
      loss, g = jax.value_and_grad(loss_fn)(q, mb)
      u, s = optimizer.update(g, s, q)
      return (optax.apply_updates(q, u), s), loss
    (q, _), losses = lax.scan(body, (p, optimizer.init(p)), b)
    return jax.tree.map(lambda a, b: a - b, q, p), losses[0]

  def train(params, micro):
    if clients_at_once is None:
      return jax.vmap(one_client)(params, micro)
    return lax.map(lambda a: one_client(*a), (params, micro),
                   batch_size=None if clients_at_once == 1 else
                   clients_at_once)

  micro = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), micro)  # [N, s, ...]
  if mesh is None:
    return train(params, micro)
  n, devices = jax.tree.leaves(params)[0].shape[0], mesh.devices.size
  if n % devices:
    raise ValueError(f"{n} clients do not divide over the {devices} devices "
                     "of `mesh`: pick a number of clients (a cohort size) "
                     "that is a multiple of it.")
  spec = PartitionSpec(mesh.axis_names[0])
  return jax.shard_map(train, mesh=mesh, in_specs=spec, out_specs=spec)(
      params, micro)


def fedavg(loss_fn, optimizer: optax.GradientTransformation, *,
           local_steps: int = 1, attack=None, aggregator=None,
           clients_at_once: Optional[int] = None,
           mesh: Optional[Mesh] = None) -> base.Algorithm:
  """FedAvg with gradient averaging (1 local step) or model averaging.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: with `local_steps=1`, the server optimizer applied to the mean
      gradient; otherwise the clients' local optimizer.
    local_steps: local steps per round; the batch size must be divisible by it.
    attack: what Byzantine clients send (gradients or model changes), or None.
    aggregator: how the server combines the N messages, a
      `prfl_jax.aggregators` rule such as `aggregators.median()`; None is the
      mean (bit-identical to `aggregators.mean()`).
    clients_at_once: with `local_steps > 1`, how many clients train at once
      (`local_updates`); None: all in one `vmap`. On XLA:CPU one at a time
      (1) keeps each client's convolutions ungrouped and its working set in
      cache: pfl's CIFAR CNN trained faster that way (`benchmarks/README.md`,
      peers section).
    mesh: with `local_steps > 1`, a one-dimensional mesh whose devices train
      the clients in parallel (`local_updates`); None: one device. On a CPU
      host, `XLA_FLAGS=--xla_force_host_platform_device_count=<cores>` and
      `prfl.sharding.client_mesh()` train one client per core: XLA:CPU
      spreads a small client's convolutions over the cores poorly
      (`benchmarks/README.md`, peers section).

  Returns:
    `Algorithm(init, step)`.

  References:
    McMahan et al., 2017, Algorithm 1 (FederatedAveraging).
  """
  base.check_optimizer(optimizer)
  base.check_positive_int(local_steps, "local_steps")
  if clients_at_once is not None:
    base.check_positive_int(clients_at_once, "clients_at_once")
    if local_steps == 1:
      raise ValueError("`clients_at_once` applies to local training "
                       "(`local_steps` > 1); got local_steps=1.")
  if mesh is not None:
    if not isinstance(mesh, Mesh) or len(mesh.axis_names) != 1:
      raise ValueError(f"`mesh` must be a one-dimensional jax.sharding.Mesh "
                       f"(prfl.sharding.client_mesh()), got {mesh!r}.")
    if local_steps == 1:
      raise ValueError("`mesh` applies to local training (`local_steps` > "
                       "1); got local_steps=1.")
  if aggregator is not None and not callable(aggregator):
    raise TypeError(f"`aggregator` must be a prfl_jax.aggregators rule or "
                    f"None, got {type(aggregator)}.")

  def init(params, *, byzantine=None) -> FedAvgState:
    n = base.init_params(params)
    first = jax.tree.map(lambda p: p[0], params)
    params = tree_lib.broadcast(first, n)
    return FedAvgState(params, jax.vmap(optimizer.init)(params),
                       base.byzantine_mask(byzantine, n),
                       jnp.zeros((), jnp.int32))

  def step(state: FedAvgState, batch, key):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    n = state.byzantine.shape[0]
    if local_steps == 1:
      losses, messages = gradients.client_grads(loss_fn, state.params, batch)
    else:
      messages, losses = local_updates(loss_fn, optimizer, state.params, batch,
                                       local_steps, clients_at_once, mesh)
    honest_norm = base.benign_mean(base.grad_norms(messages), state.byzantine)
    messages = base.attacked(attack, messages, state.byzantine, key)
    if aggregator is None:
      mean = tree_lib.weighted_mean(messages, jnp.ones((n,), jnp.float32))
    else:
      mean = aggregator(messages)
    direction = tree_lib.broadcast(mean, n)
    if local_steps == 1:
      params, opt_state = base.apply_updates(optimizer, direction,
                                             state.opt_state, state.params)
    else:
      params = jax.tree.map(jnp.add, state.params, direction)
      opt_state = state.opt_state
    metrics = {"loss": base.benign_mean(losses, state.byzantine),
               "grad_norm": honest_norm}
    return state._replace(params=params, opt_state=opt_state,
                          round=state.round + 1), metrics

  return base.Algorithm(init, step)
