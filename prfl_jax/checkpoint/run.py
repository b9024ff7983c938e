"""What a resumed run must repeat, recorded in every checkpoint.

A resumed run continues the uninterrupted one bit for bit only if it repeats
the key, the batch size, the data's shapes and the algorithm with all its
settings (FC's groups and radius, the optimizer and its learning rate, the
loss function, ...). `describe_run` writes them as JSON; `check_same_run`
compares two descriptions and names every difference.

An `Algorithm` is a pair of closures, so its settings are read from them: the
free variables of `init` and `step` (e.g. `num_groups`, `radius`,
`optimizer`), recursively through functions, `functools.partial`s,
NamedTuples, dataclasses, tuples and dicts. Numbers and strings are recorded
as they are, arrays by dtype, shape and SHA-256, functions by their qualified
name and their own free variables, other objects by their type.
"""

import dataclasses
import functools
import hashlib
import math
import numbers
import os
import types
from typing import Any, Optional

from etils import epath
import jax
import numpy as np

from prfl_jax import sharding
from prfl_jax.checkpoint import manifest

_MAX_DEPTH = 8
_MAX_HASH_BYTES = 1 << 26  # Larger arrays: dtype and shape only.


def _qualname(obj) -> str:
  return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _array(x) -> dict:
  out = {"dtype": str(x.dtype), "shape": list(np.shape(x))}
  if isinstance(x, jax.core.Tracer):
    return out
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  x = np.ascontiguousarray(sharding.to_host(x))
  if x.nbytes <= _MAX_HASH_BYTES:
    out["sha256"] = hashlib.sha256(x.tobytes()).hexdigest()
  return out


def describe_value(value: Any, depth: int = 0, seen: frozenset = frozenset()):
  """A JSON description of `value` that equal settings share (see module)."""
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, numbers.Number) and not isinstance(value, complex):
    value = value.item() if hasattr(value, "item") else value
    return value if math.isfinite(value) else repr(value)
  if isinstance(value, (np.ndarray, jax.Array, np.generic)):
    return {"array": _array(value)}
  if depth >= _MAX_DEPTH or id(value) in seen:
    return {"type": _qualname(type(value))}
  seen = seen | {id(value)}
  sub = lambda v: describe_value(v, depth + 1, seen)
  if isinstance(value, functools.partial):
    return {"partial": sub(value.func), "args": sub(value.args),
            "keywords": sub(value.keywords)}
  wrapped = getattr(value, "__wrapped__", None)  # jax.jit, functools.wraps.
  if wrapped is not None and callable(value):
    return sub(wrapped)
  if isinstance(value, types.MethodType):
    return {"method": _qualname(value.__func__), "of": sub(value.__self__)}
  if isinstance(value, types.FunctionType):
    cells = value.__closure__ or ()
    free = {}
    for name, cell in zip(value.__code__.co_freevars, cells):
      try:
        free[name] = sub(cell.cell_contents)
      except ValueError:  # An empty cell (a name assigned later).
        free[name] = None
    return {"function": _qualname(value), "free": free}
  if isinstance(value, tuple) and hasattr(value, "_fields"):
    return {"type": _qualname(type(value)),
            "fields": {f: sub(getattr(value, f)) for f in value._fields}}
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {"type": _qualname(type(value)),
            "fields": {f.name: sub(getattr(value, f.name, None))
                       for f in dataclasses.fields(value)}}
  if isinstance(value, (tuple, list)):
    return [sub(v) for v in value]
  if isinstance(value, dict):
    return {str(k): sub(v) for k, v in sorted(value.items(), key=str)}
  return {"type": _qualname(type(value))}


def describe_run(algorithm, *, key, batch_size: Optional[int],
                 train: Any, counts=None) -> dict:
  """What a resume of this run must repeat, as JSON.

  Args:
    algorithm: the `Algorithm(init, step)` or cohort algorithm.
    key: the run's PRNG key.
    batch_size: examples per client per round (None: all).
    train: the training data, leaves `[N, M, ...]` or a `prfl.data.Ragged`
      (shapes and dtypes only).
    counts: `[N]` real examples per client (`FederatedData.num_examples`,
      `Ragged.counts`), or None when every row is real; recorded by SHA-256,
      since they decide which rows a client's batches draw.

  Returns:
    `{"algorithm", "key", "batch_size", "train"}`, and `"counts"` when given.
  """
  out = {
      "algorithm": {"init": describe_value(algorithm.init),
                    "step": describe_value(algorithm.step)},
      "key": np.asarray(sharding.to_host(
          jax.random.key_data(key) if jax.dtypes.issubdtype(
              key.dtype, jax.dtypes.prng_key) else key)).tolist(),
      "batch_size": batch_size,
      "train": {jax.tree_util.keystr(path): _array_shape(x) for path, x in
                jax.tree_util.tree_flatten_with_path(train)[0]},
  }
  if counts is not None:
    out["counts"] = describe_value(np.asarray(sharding.to_host(counts)))
  return out


def _array_shape(x) -> str:
  return f"{np.dtype(x.dtype)}{list(np.shape(x))}"


def _flatten(tree, prefix: str, out: dict) -> dict:
  if isinstance(tree, dict) and tree:
    for k, v in tree.items():
      _flatten(v, f"{prefix}.{k}" if prefix else k, out)
  elif isinstance(tree, list) and tree:
    for i, v in enumerate(tree):
      _flatten(v, f"{prefix}[{i}]", out)
  else:
    out[prefix] = tree
  return out


def differences(saved: dict, now: dict) -> list:
  """`["<path>: saved <a>, now <b>", ...]` for every setting that differs."""
  a, b = _flatten(saved, "", {}), _flatten(now, "", {})
  return [f"{k}: saved {a.get(k, '(absent)')!r}, now {b.get(k, '(absent)')!r}"
          for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def check_same_run(saved: Optional[dict], now: dict, where: str):
  """Raises ValueError naming every difference between two `describe_run`s.

  Args:
    saved: the description recorded in a checkpoint (None: checkpoints written
      before runs were recorded; nothing is checked).
    now: the resumed run's description.
    where: the checkpoint's path, for the message.
  """
  if saved is None:
    return
  diffs = differences(saved, now)
  if diffs:
    shown = "; ".join(diffs[:8]) + (f"; ... ({len(diffs)} in all)"
                                    if len(diffs) > 8 else "")
    raise ValueError(
        f"this run does not repeat the run checkpointed in {where!r}, so it "
        f"would not continue it: {shown}. Resume with the same key, "
        "batch_size, data and algorithm settings, or start a new run in "
        "another directory.")


def recorded_run(directory, at_round: int) -> Optional[dict]:
  """The run `describe_run` recorded with round `at_round` in `directory`.

  Returns:
    the description, or None if that round is not in `directory` or was
    saved without one.

  Raises:
    CheckpointError: if the round's checkpoint is not intact.
  """
  step_dir = epath.Path(os.fspath(directory)) / str(at_round)
  if not step_dir.is_dir():
    return None
  return manifest.verify(step_dir).get("run")
