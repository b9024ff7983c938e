"""How an option's values are read and written, from its annotation.

`int`, `float`, `str`, `bool`, `Optional[T]` (None written `auto`),
`tuple[T, ...]` (comma-separated on a command line, an array in files),
`Union[int, str]` (an integer or a keyword) and `dict` (per-algorithm
settings, checked entry by entry by `experiments.options`).
"""

import typing

AUTO = "auto"


class Kind:
  """How values of one annotation are read and written."""

  def __init__(self, annotation):
    self.annotation = annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    self.optional = origin is typing.Union and type(None) in args
    if self.optional:
      (annotation,) = [a for a in args if a is not type(None)]
      origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    self.union = origin is typing.Union  # Union[int, str]: int or keyword.
    self.item = annotation
    self.tuple = origin is tuple
    self.mapping = annotation is dict
    if self.tuple:
      self.item = args[0]
    if self.union:
      self.item = int

  def parse(self, text: str):
    """A command-line value."""
    if self.optional and text == AUTO:
      return None
    if self.tuple:
      parts = [p.strip() for p in text.split(",")] if text.strip() else []
      return tuple(self._scalar(p) for p in parts)
    if self.union and not _is_int(text):
      return text
    return self._scalar(text)

  def _scalar(self, text: str):
    if self.item is bool:
      if text.lower() not in ("true", "false"):
        raise ValueError(f"must be true or false, got {text!r}")
      return text.lower() == "true"
    if self.item is int:
      if not _is_int(text):
        raise ValueError(f"must be an integer, got {text!r}")
      return int(text)
    if self.item is float:
      try:
        return float(text)
      except ValueError:
        raise ValueError(f"must be a number, got {text!r}") from None
    return text

  def coerce(self, value):
    """A value from a file or from code."""
    if self.optional and value in (None, AUTO):
      return None
    if self.mapping:
      if not isinstance(value, dict):
        raise ValueError(f"must be a table, got {value!r}")
      return value
    if self.tuple:
      if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"must be a list, got {value!r}")
      return tuple(self._coerce_scalar(v) for v in value)
    if self.union and isinstance(value, str):
      return value
    return self._coerce_scalar(value)

  def _coerce_scalar(self, value):
    want = self.item
    if want is float and isinstance(value, int) and not isinstance(value,
                                                                   bool):
      return float(value)
    if isinstance(value, bool) != (want is bool) or not isinstance(value,
                                                                   want):
      raise ValueError(f"must be {_article(want)}, got {value!r}")
    return value

  def format(self, value) -> str:
    """A value as typed on a command line."""
    if value is None:
      return AUTO
    if self.tuple:
      return ",".join(self._format_scalar(v) for v in value)
    return self._format_scalar(value)

  @staticmethod
  def _format_scalar(value) -> str:
    if isinstance(value, bool):
      return str(value).lower()
    if isinstance(value, float):
      return repr(value)
    return str(value)


def _is_int(text: str) -> bool:
  try:
    int(text)
  except ValueError:
    return False
  return True


def _article(kind) -> str:
  return {int: "an integer", float: "a number", str: "a string",
          bool: "true or false"}[kind]
