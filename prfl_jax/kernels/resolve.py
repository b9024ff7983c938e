"""Resolving an `ExecutionPlan` for one round: checked and traced once.

`resolve_plan` turns the `"auto"` fields of a plan into concrete ones (see
`kernels.plan`) and keeps the loss's `trace.Analysis` when it had to trace
the loss (for the automatic kernel, the ghost kernel or the automatic chunk
size), so that the kernel's `prepare` reuses it. A `ResolvedPlan` passed on
to `cluster_at_models` is neither checked nor resolved again.
"""

import warnings
import weakref
from typing import NamedTuple, Optional, Union

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax.kernels import base
from prfl_jax.kernels import ghost
from prfl_jax.kernels import plan as plan_lib
from prfl_jax.kernels import trace


class ResolvedPlan(NamedTuple):
  """An `ExecutionPlan` with concrete fields, and what resolving it traced."""
  chunk_size: Optional[int]  # None: every model in one vmap.
  kernel: Union[str, base.Kernel]  # a registered name or a Kernel.
  analysis: Optional[trace.Analysis] = None  # of the loss, for one client.

  @property
  def plan(self) -> plan_lib.ExecutionPlan:
    """The concrete `ExecutionPlan` (without the analysis)."""
    return plan_lib.ExecutionPlan(self.chunk_size, self.kernel)


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
  warnings.warn(message, stacklevel=5)


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
  extra, covered = 0, 0
  for g, use in zip(analysis.groups, ghost.layer_choices(analysis, n)):
    if use:
      rows = n * g.num_tokens
      extra += 4 * g.layer.groups * (3 * rows * rows +
                                     rows * (g.width + g.layer.q))
      covered += _nbytes([analysis.param_avals[g.weight.leaf]])
  return n * (2 * acts + 3 * (params - covered)) + extra


def _uses(analysis: trace.Analysis, primitive) -> bool:
  """Whether the loss's jaxpr has an equation of `primitive` (at any depth
  of call-like equations)."""
  def walk(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
      if eqn.primitive is primitive:
        return True
      inner = trace.inner_jaxpr(eqn)
      if inner is not None and walk(inner[0]):
        return True
    return False
  return walk(analysis.closed.jaxpr)


def _auto_kernel(loss_fn, analysis: trace.Analysis, messages: bool) -> str:
  """`"ghost"` for a loss with a recognised layer and no attack, else Gram."""
  if messages:
    return "gram"
  if analysis.groups:
    return "ghost"
  _warn_once(loss_fn, (
      "prfl_jax: found no dense (dot_general) or convolution layer with a "
      "parameter operand in `loss_fn`"
      + (f" ({'; '.join(analysis.notes)})" if analysis.notes else "")
      + "; using the Gram kernel (materialised per-client gradients)."))
  return "gram"


def resolve_plan(plan: Union[plan_lib.ExecutionPlan, ResolvedPlan], loss_fn,
                 params, batch, *, messages: bool = False,
                 num_models: Optional[int] = None) -> ResolvedPlan:
  """The concrete plan `"auto"` stands for (see `kernels.plan`), checked.

  Args:
    plan: an `ExecutionPlan`, possibly with `"auto"` fields (checked here),
      or a `ResolvedPlan` (returned as it is).
    loss_fn: loss for one client.
    params: stacked models, leaves `[M, ...]` (arrays or abstract values).
    batch: stacked client batches, leaves `[N, B, ...]`.
    messages: whether an attack replaces the messages (needs them
      materialised: the ghost kernel is never picked, and asking for it
      raises).
    num_models: models run at once by the caller (default M).

  Returns:
    a `ResolvedPlan` with an integer or None `chunk_size`, a registered
    kernel name or a `Kernel`, and the loss's analysis when it was traced.
    A loss in which the automatic analysis finds no dense or convolution
    layer gets the Gram kernel, with a warning (once per loss).

  Raises:
    TypeError, ValueError: as `check_plan`.
  """
  if isinstance(plan, ResolvedPlan):
    return plan
  plan_lib.check_plan(plan, base.KERNELS, messages=messages)
  kernel, chunk = plan.kernel, plan.chunk_size
  auto_kernel = kernel == plan_lib.AUTO
  needs_analysis = (
      (auto_kernel and not messages) or chunk == plan_lib.AUTO or
      (not auto_kernel and plan_lib.lookup(kernel,
                                           base.KERNELS).needs_analysis))
  analysis = (trace.analyse(loss_fn, _one(params), _one(batch))
              if needs_analysis else None)
  if auto_kernel:
    kernel = _auto_kernel(loss_fn, analysis, messages)
  if chunk == plan_lib.AUTO:
    n = tree_lib.num_leading(batch, "batch")
    m = num_models or tree_lib.num_leading(params, "params")
    chunk = plan_lib.default_chunk_size(
        estimate_model_bytes(analysis, kernel, n), m,
        convolutions=_uses(analysis, lax.conv_general_dilated_p))
  return ResolvedPlan(chunk, kernel, analysis)
