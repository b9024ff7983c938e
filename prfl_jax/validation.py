"""Argument checks shared by every layer, raised before anything compiles.

Each check names the offending argument, so a bad call fails with a message a
user can act on, e.g. "`num_iters` must be an integer >= 1, got 0."
"""

import numbers

import jax
import jax.numpy as jnp
import numpy as np


def check_positive_int(value, name: str, minimum: int = 1):
  """Raises ValueError unless `value` is an integer (not a bool) >= `minimum`.

  Args:
    value: the argument.
    name: its name, quoted in the message.
    minimum: the least allowed value.
  """
  if (not isinstance(value, numbers.Integral) or isinstance(value, bool) or
      value < minimum):
    raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")


def check_key(key, name: str = "key"):
  """Raises unless `key` is one PRNG key (traced keys are checked by shape).

  Accepts a typed key (`jax.random.key(0)`, shape `[]`) or a raw uint32 key
  (`jax.random.PRNGKey(0)`, shape `[2]`).

  Raises:
    TypeError: if `key` is not an array of keys or of uint32.
    ValueError: if it holds more or less than one key.
  """
  dtype = getattr(key, "dtype", None)
  if dtype is None:
    raise TypeError(
        f"`{name}` must be a PRNG key such as jax.random.key(0), got "
        f"{type(key).__name__} {key!r}.")
  if jnp.issubdtype(dtype, jax.dtypes.prng_key):
    if np.shape(key) != ():
      raise ValueError(
          f"`{name}` must be one key (shape []), got shape {np.shape(key)}.")
  elif dtype == jnp.uint32:
    if np.shape(key) != (2,):
      raise ValueError(
          f"`{name}` must be one raw key (uint32, shape [2]), got shape "
          f"{np.shape(key)}.")
  else:
    raise TypeError(
        f"`{name}` must be a PRNG key such as jax.random.key(0), got an "
        f"array of {dtype}.")
