"""The execution plan of the all-pairs engine, and its default from the backend.

An `ExecutionPlan` says how the all-pairs gradients of a round are computed;
every plan gives the same numbers (up to float32 rounding of a different
summation order):

* `chunk_size`: models per `lax.map` step. `None`: one nested vmap over all
  models and clients; `1`: one model at a time (a plain `lax.map`); `c`: chunks
  of c models, each a nested vmap, so peak memory is `O(c)` models' work.
  `"auto"` (the default) picks it from the backend and the loss,
  deterministically. On a GPU or TPU: the full vmap if the estimated work
  of all models fits in `MEMORY_FRACTION` of the device's memory
  (`bytes_limit` of `jax.devices()[0].memory_stats()`, or
  `DEFAULT_BUDGET_BYTES` where the backend does not report it), else the
  largest power-of-two chunk that fits (at least 1). On CPU: chunk 1 for a
  loss with a convolution, since a vmap over models turns a convolution
  with a per-model kernel into a grouped convolution, which XLA:CPU runs
  several times slower than one model at a time; otherwise (dense layers,
  whose per-model products batch into larger GEMMs) `CPU_CHUNK` models, or
  fewer if their estimated work does not fit in the budget
  (`benchmarks/README.md` has the measurements).
* `kernel`: `"gram"`, `"direct"`, `"ghost"` (see `prfl_jax.kernels`), a
  `kernels.Kernel` (e.g. `ghost.kernel(split=True)`, a variant of a
  registered kernel), or `"auto"`: the ghost kernel when the loss has a
  recognised layer and no attack replaces the messages, else the Gram
  kernel.
"""

import numbers
from typing import NamedTuple, Optional, Union

import jax

from prfl_jax.kernels import base

AUTO = "auto"
# Share of the device's memory the round's per-model work may take; the rest
# is for the stacked params, optimizer state, batch and XLA's own buffers.
MEMORY_FRACTION = 0.4
# Budget on a device that does not report its memory (XLA:CPU does not).
DEFAULT_BUDGET_BYTES = 4 * 2**30
# Models per chunk on CPU for a loss without convolutions.
CPU_CHUNK = 4


class ExecutionPlan(NamedTuple):
  """How a round's all-pairs gradients are computed (same results)."""
  chunk_size: Union[int, None, str] = AUTO
  kernel: Union[str, base.Kernel] = AUTO


def check_plan(plan: ExecutionPlan, kernels, *, messages: bool = False):
  """Raises TypeError / ValueError unless `plan` is a valid `ExecutionPlan`.

  Args:
    plan: the plan.
    kernels: the registered kernels, `{name: Kernel}`.
    messages: whether the messages are needed (an attack replaces them, a
      pre-aggregator or FC's ball cap reads them): then a kernel that never
      builds them (`accepts_messages` False) is refused.
  """
  if not isinstance(plan, ExecutionPlan):
    raise TypeError(
        f"`plan` must be a prfl_jax.ExecutionPlan, got {type(plan)}.")
  c = plan.chunk_size
  if c != AUTO and c is not None and (
      isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1):
    raise ValueError(
        f"`plan.chunk_size` must be 'auto', None or an integer >= 1, got "
        f"{c!r}.")
  names = (AUTO,) + tuple(kernels)
  if not isinstance(plan.kernel, base.Kernel) and plan.kernel not in names:
    raise ValueError(
        f"`plan.kernel` must be one of {names} or a kernels.Kernel, got "
        f"{plan.kernel!r}.")
  if messages and plan.kernel != AUTO and not lookup(
      plan.kernel, kernels).accepts_messages:
    raise ValueError(
        f"an attack, a pre-aggregator or a ball cap (`attack`, "
        f"`pre_aggregator`, `ball_cap`, `message_fn`) needs the materialised "
        f"messages, which "
        f"ExecutionPlan(kernel={plan.kernel!r}) never builds; use "
        "kernel='gram'.")


def lookup(kernel, kernels) -> base.Kernel:
  """The `Kernel` a plan's `kernel` field names (or is)."""
  return kernel if isinstance(kernel, base.Kernel) else kernels[kernel]


def memory_budget(device=None) -> int:
  """Bytes the per-model work of a round may take on `device` (see above)."""
  device = device or jax.devices()[0]
  stats = None
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except
    stats = None
  limit = (stats or {}).get("bytes_limit")
  return int(MEMORY_FRACTION * limit) if limit else DEFAULT_BUDGET_BYTES


def default_chunk_size(per_model_bytes: int, num_models: int, device=None,
                       *, convolutions: bool = False) -> Optional[int]:
  """The `chunk_size` that `"auto"` stands for (see module docstring).

  Args:
    per_model_bytes: estimated memory of one model's work.
    num_models: models in the round.
    device: the device (default: `jax.devices()[0]`).
    convolutions: whether the loss has a convolution.

  Returns:
    None (all models at once) or a positive integer: on an accelerator a
    power of two; on CPU 1 with `convolutions`, else at most `CPU_CHUNK`.
  """
  device = device or jax.devices()[0]
  budget = memory_budget(device)
  if device.platform == "cpu":
    if convolutions:
      return 1
    chunk = min(CPU_CHUNK, num_models)
    while chunk > 1 and chunk * per_model_bytes > budget:
      chunk //= 2
    return None if chunk >= num_models else chunk
  if num_models * per_model_bytes <= budget:
    return None
  chunk = 1
  while 2 * chunk < num_models and 2 * chunk * per_model_bytes <= budget:
    chunk *= 2
  return chunk
