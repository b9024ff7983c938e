"""Per-client and all-pairs gradients, and clustering at every client's model.

Notation (Werner et al., 2023, Algorithm 1): client `j`'s stochastic gradient at
client `i`'s model is `g_j(x_i)`. Federated-Clustering needs, for every model
`i`, the N gradients `{g_j(x_i)}_j`, clustered with one centre started at the
owner's own gradient `g_i(x_i)`.

`loss_fn(params, batch) -> scalar` is written for ONE client: unstacked params
and that client's batch (leaves `[B, ...]`). Batching over clients and models is
done here, with `jax.vmap`, in one place.

The execution schedule is a tuning knob with fixed semantics (DESIGN.md):
* `Schedule(chunk_size=None)`: one nested vmap over all models and clients,
  materialising all `N^2` gradients (`[N, N, P]`) before clustering.
* `Schedule(chunk_size=1)`: `lax.map` over models, one model's `[N, P]`
  gradients at a time (the fastest schedule measured on CPU, see
  `benchmarks/bench_round.py`).
* `Schedule(chunk_size=c)`: `lax.map` over chunks of `c` models, each chunk a
  nested vmap whose `[c, N, P]` gradients are clustered at once, so peak memory
  is `O(c * N * P)`.
`kernel` picks the clustering kernel (`"gram"` or `"direct"`, see
`prfl_jax.clustering`), or `"ghost"`: the Gram kernel fed by
`prfl_jax.ghost`, which never materialises the per-client gradients of dense
layers (the loss must be a `ghost.GhostLoss`). The default, `"auto"`, is
`"ghost"` for a `GhostLoss` without attack and `"gram"` otherwise.

With the Gram kernel, one model's work is: N gradients, their differences
`y_j = g_j(x_i) - g_i(x_i)` (one elementwise pass), the `[N, N]` Gram matrix of
the `y_j` (one GEMM per leaf), Threshold-Clustering on that `[N, N]` matrix
(independent of the model size) and one `[N] x [N, P]` product for the centre.
A message that is not finite shows up as a non-finite diagonal entry of the
Gram matrix, so no separate finiteness pass over the gradients is needed.
"""

import numbers
from typing import Any, Callable, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import clustering
from prfl_jax import ghost
from prfl_jax import tree as tree_lib

PyTree = Any
LossFn = Callable[[PyTree, PyTree], jax.Array]
# message_fn(honest_messages [N, ...], model_index, key) -> messages [N, ...]
MessageFn = Callable[[PyTree, jax.Array, jax.Array], PyTree]


class Schedule(NamedTuple):
  """How all-pairs gradients are computed and clustered (same results)."""
  # Models per lax.map step; None: all at once. 1 was fastest and smallest on
  # CPU (benchmarks/bench_round.py); accelerators may prefer larger chunks.
  chunk_size: Optional[int] = 1
  # Threshold-Clustering kernel: "gram", "direct", "ghost" (the Gram kernel on
  # Gram matrices built by prfl_jax.ghost; needs a ghost.GhostLoss), or
  # "auto": "ghost" where it applies (a GhostLoss and no message_fn), else
  # "gram".
  kernel: str = "auto"


KERNELS = ("auto", "gram", "direct", "ghost")


def resolve_kernel(kernel: str, loss_fn, message_fn=None) -> str:
  """The kernel `"auto"` stands for, given the loss and the message function."""
  if kernel != "auto":
    return kernel
  if isinstance(loss_fn, ghost.GhostLoss) and message_fn is None:
    return "ghost"
  return "gram"


def check_schedule(schedule: Schedule):
  """Raises TypeError / ValueError unless `schedule` is a valid `Schedule`."""
  if not isinstance(schedule, Schedule):
    raise TypeError(
        f"`schedule` must be a prfl_jax.Schedule, got {type(schedule)}.")
  c = schedule.chunk_size
  if c is not None and (not isinstance(c, numbers.Integral) or c < 1):
    raise ValueError(
        f"`schedule.chunk_size` must be None or an integer >= 1, got {c!r}.")
  if schedule.kernel not in KERNELS:
    raise ValueError(
        f"`schedule.kernel` must be one of {KERNELS}, got "
        f"{schedule.kernel!r}.")


def check_loss_fn(loss_fn: LossFn, params: PyTree, batch: PyTree):
  """Checks, without compiling, that `loss_fn` maps one client to a scalar.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    params: stacked params, leaves `[N, ...]`.
    batch: stacked batch, leaves `[N, B, ...]`.

  Raises:
    TypeError: if `loss_fn` is not callable or does not return a real scalar.
    ValueError: if `params` and `batch` disagree on the number of clients.
  """
  if not callable(loss_fn):
    raise TypeError(f"`loss_fn` must be callable, got {type(loss_fn)}.")
  n = tree_lib.num_leading(params, "params")
  nb = tree_lib.num_leading(batch, "batch")
  if n != nb:
    raise ValueError(
        f"`params` has {n} clients but `batch` has {nb}; their leading axes "
        "must match.")
  one = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      np.shape(x)[1:], jnp.result_type(x)), t)
  try:
    out = jax.eval_shape(loss_fn, one(params), one(batch))
  except Exception as e:  # pylint: disable=broad-except
    raise TypeError(
        f"`loss_fn(params, batch)` failed on one client's params and batch: "
        f"{e}") from e
  if (not isinstance(out, jax.ShapeDtypeStruct) or out.shape != () or
      not jnp.issubdtype(out.dtype, jnp.floating)):
    raise TypeError(
        "`loss_fn(params, batch)` must return a real scalar for one client, "
        f"got {out}.")


def client_grads(loss_fn: LossFn, params: PyTree, batch: PyTree):
  """Every client's loss and gradient at its own model.

  Args:
    loss_fn: loss for one client.
    params: leaves `[N, ...]`.
    batch: leaves `[N, B, ...]`.

  Returns:
    `(losses [N], grads)`, grads leaves `[N, ...]`: `g_i(x_i)`.
  """
  return jax.vmap(jax.value_and_grad(loss_fn))(params, batch)


def all_pairs_grads(loss_fn: LossFn, params: PyTree, batch: PyTree):
  """`g_j(x_i)` for every model i and client j, as one nested vmap.

  Args:
    loss_fn: loss for one client.
    params: leaves `[M, ...]` (models).
    batch: leaves `[N, B, ...]` (clients).

  Returns:
    `(losses [M, N], grads)`, grads leaves `[M, N, ...]`, entry `[i, j]` is
    client j's loss / gradient at model i.
  """
  per_client = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0))
  return jax.vmap(per_client, in_axes=(0, None))(params, batch)


class PairsOutput(NamedTuple):
  """What `cluster_at_models` returns for every model i."""
  centers: PyTree  # leaves [M, ...]: Threshold-Clustering estimate v_i.
  own_loss: jax.Array  # [M]: f_i(x_i) on client i's batch.
  own_grad_norm: jax.Array  # [M]: ||g_i(x_i)||.
  inside: jax.Array  # [M, N] bool: client j inside model i's final ball.


def _cluster_one_model(loss_fn, radius, num_iters, kernel, weights, batch,
                       message_fn, key, index, x_i):
  """Clusters `{g_j(x_i)}_j` with one centre started at `g_i(x_i)`."""
  losses, grads = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0))(
      x_i, batch)
  own = jax.tree.map(lambda g: g[index], grads)
  if message_fn is not None:
    grads = message_fn(grads, index, jax.random.fold_in(key, index))
  if kernel == "gram":
    centred, gram, ok = clustering.centred_gram(grads, own)
    coefs, info = clustering.gram_clustering_coefs(gram[None], radius,
                                                   num_iters, weights)
    center = clustering.combine_centred(coefs[0], centred, ok, own)
  else:
    init = jax.tree.map(lambda g: g[None], own)
    center, info = clustering.threshold_clustering_with_info(
        grads, init, radius=radius, num_iters=num_iters, weights=weights)
    center = jax.tree.map(lambda c: c[0], center)
  own_norm = jnp.sqrt(tree_lib.sq_norms(jax.tree.map(lambda g: g[None], own)))
  return PairsOutput(center, losses[index], own_norm[0], info.inside[0])


def _cluster_one_model_ghost(loss_fn, radius, num_iters, weights, batch, shared,
                             index, x_i):
  """`_cluster_one_model` with the Gram matrix of `prfl_jax.ghost`."""
  grads = ghost.ghost_grads(loss_fn, x_i, batch, shared)
  gram, ok = ghost.centred(grads.gram, index)
  coefs, info = clustering.gram_clustering_coefs(gram[None], radius, num_iters,
                                                 weights)
  # v = g_i + sum_j a_j (g_j - g_i) = sum_j c_j g_j.
  a = jnp.where(ok, coefs[0], 0.0)
  c = a + jax.nn.one_hot(index, a.shape[0], dtype=a.dtype) * (1.0 - a.sum())
  center = ghost.combine(c, grads, ok | (jnp.arange(a.shape[0]) == index))
  own_norm = jnp.sqrt(grads.gram[index, index])
  return PairsOutput(center, grads.losses[index], own_norm, info.inside[0])


def cluster_at_models(loss_fn: LossFn, params: PyTree, batch: PyTree, *,
                      radius: clustering.Radius, num_iters: int,
                      weights: Optional[jax.Array] = None,
                      schedule: Schedule = Schedule(),
                      message_fn: Optional[MessageFn] = None,
                      key: Optional[jax.Array] = None) -> PairsOutput:
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
    schedule: execution schedule; all schedules give the same result.
    message_fn: optional `message_fn(grads [N, ...], i, key)` that replaces the
      honest gradients sent to model i (Byzantine attacks).
    key: PRNG key for `message_fn`.

  Returns:
    `PairsOutput` with leading axis N.

  Raises:
    ValueError: if `weights` is not `[N]`, or `message_fn` comes without `key`.
    TypeError: if `schedule` is not a `Schedule`.
  """
  check_schedule(schedule)
  n = tree_lib.num_leading(params, "params")
  if weights is None:
    weights = jnp.ones((n,), jnp.float32)
  elif np.shape(weights) != (n,):
    raise ValueError(
        f"`weights` must have shape [{n}] (one per client), got "
        f"{np.shape(weights)}.")
  if message_fn is not None and key is None:
    raise ValueError("`key` is required when `message_fn` is given.")
  kernel = resolve_kernel(schedule.kernel, loss_fn, message_fn)
  if kernel == "ghost":
    ghost.require_ghost_loss(
        loss_fn, None if message_fn is None else "message_fn")
    ghost.check_ghost_loss(loss_fn, jax.tree.map(lambda x: x[0], params),
                           jax.tree.map(lambda x: x[0], batch))
    shared = ghost.shared_inputs(loss_fn, params, batch)
    fn = lambda args: _cluster_one_model_ghost(
        loss_fn, radius, num_iters, weights, batch, shared, *args)
  else:
    fn = lambda args: _cluster_one_model(
        loss_fn, radius, num_iters, kernel, weights, batch,
        message_fn, key, *args)
  xs = (jnp.arange(n), params)
  if schedule.chunk_size is None or schedule.chunk_size >= n:
    return jax.vmap(fn)(xs)
  if schedule.chunk_size == 1:
    # A plain scan over models: XLA:CPU lays out the body's dots without the
    # transposes and copies that a size-1 vmap inside lax.map introduces.
    return lax.map(fn, xs)
  return lax.map(fn, xs, batch_size=schedule.chunk_size)
