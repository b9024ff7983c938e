"""The all-pairs engine: clustering every client's gradient at every model.

Notation (Werner et al., 2023, Algorithm 1): client `j`'s stochastic gradient
at client `i`'s model is `g_j(x_i)`. Federated-Clustering needs, for every
model `i`, the N gradients `{g_j(x_i)}_j`, clustered with one centre started at
the owner's own gradient `g_i(x_i)`. `cluster_at_models` does that for all
models of a round, under an `ExecutionPlan` (how many models at once, which
kernel); every plan gives the same result.

Layout (adding a kernel or a layer rule is one module):
  plan.py     `ExecutionPlan` and the default plan from the backend.
  base.py     the kernel interface (`Kernel`, `Problem`, `PairsOutput`) and
              registry.
  gram.py     materialised gradients, Threshold-Clustering on their Gram matrix.
  direct.py   materialised gradients, distances from the gradients.
  ghost.py    Gram matrices from layer tokens, no per-client weight gradients.
  trace.py    finds a loss's layers in its jaxpr; the tapped interpreter.
  rules.py    the layer-rule protocol; dense.py and conv.py implement it;
              pool.py registers a faster max-pooling for the interpreter.

`loss_fn(params, batch) -> scalar` is written for ONE client: unstacked params
and that client's batch (leaves `[B, ...]`); any Flax, Equinox or plain-JAX
loss works, and the ghost kernel finds its dense and convolution layers.
"""

import warnings
import weakref
from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import clustering
from prfl_jax import tree as tree_lib
from prfl_jax.kernels import base
from prfl_jax.kernels import dense  # noqa: F401  (registers its rule)
from prfl_jax.kernels import direct  # noqa: F401  (registers its kernel)
from prfl_jax.kernels import ghost
from prfl_jax.kernels import gram  # noqa: F401  (registers its kernel)
from prfl_jax.kernels import plan as plan_lib
from prfl_jax.kernels import rules
from prfl_jax.kernels import trace
from prfl_jax.kernels import conv  # noqa: F401  (registers its rule)
try:  # Max-pooling with a fast gradient, once it lands.
  from prfl_jax.kernels import pool  # noqa: F401
except ImportError:
  pool = None

ExecutionPlan = plan_lib.ExecutionPlan
PairsOutput = base.PairsOutput
KERNELS = base.KERNELS
MessageFn = base.MessageFn


def check_plan(plan: ExecutionPlan):
  """Raises TypeError / ValueError unless `plan` is a valid `ExecutionPlan`."""
  plan_lib.check_plan(plan, KERNELS)


_WARNED = weakref.WeakSet()
_WARNED_IDS = set()


def _warn_once(loss_fn, message: str):
  """Warns the first time `message` concerns `loss_fn`."""
  try:
    if loss_fn in _WARNED:
      return
    _WARNED.add(loss_fn)
  except TypeError:  # Not weak-referenceable.
    if id(loss_fn) in _WARNED_IDS:
      return
    _WARNED_IDS.add(id(loss_fn))
  warnings.warn(message, stacklevel=4)


def _one(tree):
  """One client's abstract leaves (drops the leading axis)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      np.shape(x)[1:], jnp.result_type(x)), tree)


def _nbytes(avals) -> int:
  return sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize
             for a in avals)


def estimate_model_bytes(analysis: trace.Analysis, kernel: str,
                         num_clients: int) -> int:
  """Rough peak memory of one model's work in a round (for the default plan).

  The loss's intermediate values (forward and backward) for N clients, plus
  three copies of the materialised gradients (Gram and direct kernels: all
  parameters; ghost kernel: those outside (*)), plus, per (*) layer, its
  tokens and three `[N M, N M]` matrices per group.
  """
  n = num_clients
  acts = sum(_nbytes(v.aval for v in eqn.outvars)
             for eqn in analysis.closed.jaxpr.eqns)
  params = _nbytes(analysis.param_avals)
  if kernel != "ghost":
    return n * (2 * acts + 3 * params)
  n_groups = len(analysis.groups)
  use = ghost.uses_ghost
  extra, covered = 0, 0
  for g in analysis.groups:
    if n_groups and use(n, g.num_tokens, g.width, g.layer.q, g.shared_input,
                        g.layer.groups):
      rows = n * g.num_tokens
      extra += 4 * g.layer.groups * (3 * rows * rows +
                                     rows * (g.width + g.layer.q))
      covered += _nbytes([analysis.param_avals[g.weight.leaf]])
  return n * (2 * acts + 3 * (params - covered)) + extra


def resolve_plan(plan: ExecutionPlan, loss_fn, params, batch, *,
                 messages: bool = False,
                 num_models: Optional[int] = None,
                 analysis: Optional[trace.Analysis] = None) -> ExecutionPlan:
  """The concrete plan `"auto"` stands for (see `kernels.plan`).

  Args:
    plan: an `ExecutionPlan`, possibly with `"auto"` fields.
    loss_fn: loss for one client.
    params: stacked models, leaves `[M, ...]` (arrays or abstract values).
    batch: stacked client batches, leaves `[N, B, ...]`.
    messages: whether an attack replaces the messages (needs them
      materialised: the ghost kernel is never picked, and asking for it
      raises).
    num_models: models run at once by the caller (default M).
    analysis: `trace.analyse` of `loss_fn`, if already done.

  Returns:
    an `ExecutionPlan` with an integer or None `chunk_size` and a registered
    kernel name. A loss in which the automatic analysis finds no dense or
    convolution layer gets the Gram kernel, with a warning (once per loss).

  Raises:
    ValueError: if `messages` and `plan.kernel` does not accept them.
  """
  check_plan(plan)
  kernel = plan.kernel
  if kernel != plan_lib.AUTO and messages and not KERNELS[
      kernel].accepts_messages:
    raise ValueError(
        f"an attack (`attack` / `message_fn`) needs the materialised "
        f"messages, which ExecutionPlan(kernel={kernel!r}) never builds; use "
        "kernel='gram'.")
  needs_trace = kernel == plan_lib.AUTO and not messages
  if plan.chunk_size == plan_lib.AUTO and jax.devices()[0].platform != "cpu":
    needs_trace = True
  if needs_trace and analysis is None:
    analysis = trace.analyse(loss_fn, _one(params), _one(batch))
  if kernel == plan_lib.AUTO:
    kernel = "gram"
    if not messages:
      if analysis.groups:
        kernel = "ghost"
      else:
        _warn_once(loss_fn, (
            "prfl_jax: found no dense (dot_general) or convolution layer "
            "with a parameter operand in `loss_fn`"
            + (f" ({'; '.join(analysis.notes)})" if analysis.notes else "")
            + "; using the Gram kernel (materialised per-client gradients)."))
  chunk = plan.chunk_size
  if chunk == plan_lib.AUTO:
    n = tree_lib.num_leading(batch, "batch")
    m = num_models or tree_lib.num_leading(params, "params")
    per_model = (0 if analysis is None else
                 estimate_model_bytes(analysis, kernel, n))
    chunk = plan_lib.default_chunk_size(per_model, m)
  return ExecutionPlan(chunk, kernel)


def cluster_at_models(loss_fn, params, batch, *, radius: clustering.Radius,
                      num_iters: int, weights: Optional[jax.Array] = None,
                      plan: ExecutionPlan = ExecutionPlan(),
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
    plan: execution plan; all plans give the same result.
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
  check_plan(plan)
  n = tree_lib.num_leading(params, "params")
  if weights is None:
    weights = jnp.ones((n,), jnp.float32)
  elif np.shape(weights) != (n,):
    raise ValueError(
        f"`weights` must have shape [{n}] (one per client), got "
        f"{np.shape(weights)}.")
  if message_fn is not None and key is None:
    raise ValueError("`key` is required when `message_fn` is given.")
  plan = resolve_plan(plan, loss_fn, params, batch,
                      messages=message_fn is not None)
  problem = base.Problem(loss_fn, batch, radius, num_iters, weights,
                         message_fn, key)
  kernel = KERNELS[plan.kernel]
  ctx = kernel.prepare(problem, params)
  fn = lambda args: kernel.cluster(problem, ctx, *args)
  xs = (jnp.arange(n), params)
  if plan.chunk_size is None or plan.chunk_size >= n:
    return jax.vmap(fn)(xs)
  if plan.chunk_size == 1:
    # A plain scan over models: XLA:CPU lays out the body's dots without the
    # transposes and copies that a size-1 vmap inside lax.map introduces.
    return lax.map(fn, xs)
  return lax.map(fn, xs, batch_size=plan.chunk_size)


__all__ = [
    "ExecutionPlan", "KERNELS", "PairsOutput", "check_plan",
    "cluster_at_models", "estimate_model_bytes", "resolve_plan",
    "base", "conv", "dense", "direct", "ghost", "gram", "plan", "rules",
    "trace",
]
