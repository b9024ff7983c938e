"""Backend-aware tolerances, and a check that a program's matmuls are exact.

Two kinds of numbers appear in the tests:

* Library numerics (distances, Gram matrices, Threshold-Clustering centres,
  weighted means): the library computes their contractions at
  `lax.Precision.HIGHEST` (see `prfl_jax/tree.py`), so they are float32-exact
  on every backend and tests compare them with `LIBRARY` (or tighter).
* Numbers that pass through the user's model (its forward/backward, e.g.
  gradients of an MLP, a regression residual `a @ x`, a trained model's
  error): those matmuls follow `jax_default_matmul_precision`, which by
  default is TF32 on NVIDIA GPUs (10-bit mantissa, unit roundoff 2^-11 ~
  4.9e-4) and bf16 on TPUs (8-bit mantissa, 2^-9 ~ 2.0e-3); CPUs always
  compute float32. `model()` widens a float32 tolerance to what that
  precision can promise.
"""

import jax

# float32 roundoff is 6e-8; a few hundred accumulated operations stay < 1e-5.
LIBRARY = {"rtol": 1e-5, "atol": 1e-6}

# Relative error one can promise for a result that went through a few model
# matmuls (forward and backward) at each precision: about 10x the unit
# roundoff of the matmul's input rounding (2^-11 for TF32, 2^-9 for bf16),
# since a handful of roundings accumulate and the inputs are rounded before
# products of length up to a few hundred are summed in float32.
_FLOOR = {"float32": 0.0, "tensorfloat32": 5e-3, "bfloat16": 4e-2}


def matmul_precision(backend=None) -> str:
  """The precision default float32 matmuls actually run at here.

  Args:
    backend: "cpu", "gpu" or "tpu" (default: JAX's default backend).

  Returns:
    "float32", "tensorfloat32" or "bfloat16".
  """
  backend = backend or jax.default_backend()
  setting = jax.config.jax_default_matmul_precision
  if backend == "cpu" or setting in ("highest", "float32"):
    return "float32"
  if setting in ("bfloat16", "fastest"):
    return "bfloat16"
  if setting in ("tensorfloat32", "high", "bfloat16_3x"):
    return "tensorfloat32"
  return "bfloat16" if backend == "tpu" else "tensorfloat32"


def model(rtol: float = 1e-5, atol: float = 0.0, *, scale: float = 1.0,
          backend=None) -> dict:
  """`assert_allclose` tolerances for results of the model's own matmuls.

  Args:
    rtol, atol: the float32 tolerances (returned unchanged on CPU).
    scale: typical magnitude of the compared values, for the absolute floor.
    backend: as in `matmul_precision`.

  Returns:
    `{"rtol": ..., "atol": ...}`, widened to the floor of the precision
    default matmuls run at on this backend.
  """
  floor = _FLOOR[matmul_precision(backend)]
  return {"rtol": max(rtol, floor), "atol": max(atol, floor * scale)}


def dot_precisions(fn, *args) -> list:
  """Precisions of every `dot_general` in the lowered program of `fn(*args)`.

  Read from the StableHLO text, after JAX applied the current
  `jax_default_matmul_precision` (a dot without an explicit precision shows
  `DEFAULT`), so it checks what an accelerator would run even on a CPU,
  which ignores the setting.

  Returns:
    list of precision strings, one per dot, e.g. `["HIGHEST, HIGHEST"]`.
  """
  text = jax.jit(fn).lower(*args).as_text()
  out = []
  for line in text.splitlines():
    if "dot_general" in line:
      start = line.find("precision = [")
      out.append(line[start + 13:line.index("]", start)] if start >= 0
                 else "none")
  return out


def all_highest(fn, *args) -> bool:
  """Whether `fn(*args)` has dots and all of them run at HIGHEST precision."""
  precisions = dot_precisions(fn, *args)
  return bool(precisions) and all(
      p == "HIGHEST, HIGHEST" for p in precisions)



def default_chunk(num_models: int, convolutions: bool = False):
  """The `chunk_size` that `ExecutionPlan()` resolves to for the tests' small
  problems of `num_models` models: on CPU 1 for a loss with a convolution,
  else 4 models (None, every model at once, when N <= 4); None on an
  accelerator, where they fit in memory
  (`prfl_jax.kernels.plan.default_chunk_size`)."""
  if jax.default_backend() != "cpu":
    return None
  if convolutions:
    return 1
  return None if num_models <= 4 else 4
