"""Argument checks shared by every layer, raised before anything compiles.

Each check names the offending argument, so a bad call fails with a message a
user can act on, e.g. "`num_iters` must be an integer >= 1, got 0."
"""

import numbers


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
