"""Saving and restoring algorithm states (checkpoint / resume).

States are NamedTuples of arrays, serialised with `flax.serialization`
(msgpack). Files are written atomically: a crash never leaves a half-written
checkpoint behind.
"""

import os
import tempfile
from typing import Any

from flax import serialization
import jax
import numpy as np


def save(path: str, state: Any):
  """Writes `state` (any pytree of arrays) to `path` atomically."""
  data = serialization.to_bytes(jax.device_get(state))
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-ckpt-")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def restore(path: str, target: Any) -> Any:
  """Reads a state saved by `save` into the structure of `target`.

  Args:
    path: checkpoint file.
    target: a state of the same algorithm and shapes (e.g. `alg.init(params)`).

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError: if the saved shapes differ from `target`'s.
  """
  with open(path, "rb") as f:
    state = serialization.from_bytes(target, f.read())
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(target)):
    if np.shape(a) != np.shape(b):
      raise ValueError(
          f"checkpoint {path!r} does not match `target`: leaf shape "
          f"{np.shape(a)} vs {np.shape(b)}.")
  return state
