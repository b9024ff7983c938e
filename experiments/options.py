"""Experiment options, each declared once.

An option is a field of a frozen dataclass, made with `option(default, help,
...)`; an option group is such a dataclass, and an experiment's configuration
is a dataclass of groups (`group(Federation, clients_per_cluster=75)`) and of
its own options. From that one declaration come:

- the command-line flag: field `clients_per_cluster` is `--clients-per-cluster`,
  typed from the annotation, checked against the bounds / choices, with the
  help text and the experiment's default;
- the key in a config file (TOML, or a saved `config.json`) and in the saved
  `config.json`: the field name itself. Names are unique within an
  experiment, so files are flat (`rounds = 300`), whatever group holds them;
- the validation of a value from any of these, with a message naming the flag.

  @dataclasses.dataclass(frozen=True)
  class Optim:
    lr: float = option(0.1, "learning rate", low=0, low_open=True)

  @dataclasses.dataclass(frozen=True)
  class Config:
    optim: Optim = group(Optim)
    tasks: tuple[str, ...] = option(("rotation",), "tasks", choices=TASKS)

  cfg = options.apply(Config(), {"lr": 0.05, "tasks": ["rotation"]}, "code")

`experiments.cli` builds the command line and reads config files from the
same declarations.

Annotations: `int`, `float`, `str`, `bool` (`--x` / `--no-x`), `Optional[T]`
(None is written `auto`), `tuple[T, ...]` (comma-separated on the command
line, an array in files), `Union[int, str]` (an integer or one of
`keywords`), and `dict` for per-algorithm settings (`--per-algorithm
fc.rounds=300`, `[per_algorithm.fc]` in TOML; the settings are the options
of `Spec.groups`).
"""

import dataclasses
import functools
import math
import typing
from typing import Any, Optional

from experiments import option_types

@dataclasses.dataclass(frozen=True)
class Spec:
  """What an option accepts, besides its type."""
  help: str
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  choices: Optional[tuple] = None  # For str options and items.
  keywords: tuple = ()  # Strings a `Union[int, str]` option accepts.
  allow_empty: bool = False  # Tuples: may be empty.
  groups: tuple = ()  # `dict` options: the groups holding the settings.
  grid: bool = False  # `dict` options: {setting: [values]}, not per algorithm.


def option(default, help: str,  # pylint: disable=redefined-builtin
           **spec) -> dataclasses.Field:
  """A dataclass field that is an option (see the module docstring)."""
  meta = {"option": Spec(help, **spec)}
  if isinstance(default, dict):
    return dataclasses.field(default_factory=functools.partial(dict, default),
                             metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


def group(cls, **defaults) -> dataclasses.Field:
  """A dataclass field holding option group `cls`, with other defaults."""
  for name in defaults:
    if name not in {f.name for f in dataclasses.fields(cls)}:
      raise TypeError(f"{cls.__name__} has no option {name!r}.")
  return dataclasses.field(default_factory=functools.partial(cls, **defaults))


# ----------------------------------------------------------------------------
# Options of a configuration class.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Option:
  """One option of a configuration class."""
  name: str  # The key in files and config.json.
  path: tuple  # Attribute path from the configuration root.
  owner: type  # The dataclass that declares it.
  kind: option_types.Kind
  spec: Spec
  value: Any  # In the configuration walked (its default if a class).

  @property
  def flag(self) -> str:
    return "--" + self.name.replace("_", "-")

  def problem(self, value) -> Optional[str]:
    """None if `value` (typed) is allowed, else what is wrong with it."""
    if value is None:
      return None if self.kind.optional else f"must be set, got {value!r}"
    if self.kind.mapping:
      return None  # Checked entry by entry (`check_settings`).
    items = value if self.kind.tuple else (value,)
    if self.kind.tuple:
      if not items and not self.spec.allow_empty:
        return "must be a non-empty list"
      if len(set(items)) != len(items):
        return f"repeats a value in {self.kind.format(value)!r}"
    for item in items:
      wrong = self._item_problem(item)
      if wrong:
        return wrong
    return None

  def _item_problem(self, item) -> Optional[str]:
    s = self.spec
    if isinstance(item, str):
      if self.kind.union:
        return (None if item in s.keywords else
                f"must be an integer or one of {', '.join(s.keywords)}, "
                f"got {item!r}")
      if not item:
        return "must not be empty"
      if s.choices is not None and item not in s.choices:
        return f"must be one of {', '.join(s.choices)}, got {item!r}"
      return None
    if isinstance(item, bool):
      return None
    if isinstance(item, float) and not math.isfinite(item):
      return f"must be a finite number, got {item!r}"
    if (s.low is not None and (item < s.low or (s.low_open and item == s.low))
        or s.high is not None and (item > s.high or
                                   (s.high_open and item == s.high))):
      return f"must be {_bounds_text(s)}, got {item!r}"
    return None

  def read_text(self, text: str):
    """Typed and checked command-line text; ValueError without the flag."""
    value = self.kind.parse(text)
    wrong = self.problem(value)
    if wrong:
      raise ValueError(wrong)
    return value

  def read_value(self, value, source: str):
    """Typed and checked value from `source`; ValueError naming the flag."""
    try:
      value = self.kind.coerce(value)
    except ValueError as e:
      raise ValueError(f"{self.flag} ({self.name} in {source}) {e}.") from None
    wrong = self.problem(value)
    if wrong:
      raise ValueError(f"{self.flag} ({self.name} in {source}) {wrong}.")
    return value

  def help_text(self) -> str:
    what = _bounds_text(self.spec) if self.spec.low is not None or (
        self.spec.high is not None) else ""
    if self.spec.choices is not None and not self.kind.mapping:
      what = "from " + ", ".join(self.spec.choices)
    text = self.spec.help + (f"; {what}" if what else "")
    if self.kind.item is bool and not self.kind.tuple:
      return f"{text} (default: {self.kind.format(self.value)})"
    return f"{text} (default: {self.kind.format(self.value) or chr(39) * 2})"


def _bounds_text(s: Spec) -> str:
  if s.low is not None and s.high is not None:
    return (f"in {'(' if s.low_open else '['}{s.low:g}, {s.high:g}"
            f"{')' if s.high_open else ']'}")
  if s.low is not None:
    return f"{'>' if s.low_open else '>='} {s.low:g}"
  if s.high is not None:
    return f"{'<' if s.high_open else '<='} {s.high:g}"
  return ""


def walk(config_cls, instance=None, path=()) -> list:
  """Every `Option` of `config_cls` (groups flattened), in declaration order.

  Raises:
    TypeError: if two options share a name or a field is neither an option
      nor a group.
  """
  instance = config_cls() if instance is None else instance
  hints = typing.get_type_hints(config_cls)
  found = []
  for f in dataclasses.fields(config_cls):
    value = getattr(instance, f.name)
    if "option" in f.metadata:
      found.append(Option(f.name, path + (f.name,), config_cls,
                          option_types.Kind(hints[f.name]),
                          f.metadata["option"], value))
    elif dataclasses.is_dataclass(hints[f.name]):
      found += walk(hints[f.name], value, path + (f.name,))
    else:
      raise TypeError(f"{config_cls.__name__}.{f.name} is neither an option "
                      "nor an option group.")
  names = [o.name for o in found]
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise TypeError(f"{config_cls.__name__} declares options {repeated} "
                    "twice; names must be unique within an experiment.")
  return found


def to_dict(cfg) -> dict:
  """Option name -> value of `cfg` (flat; the form of files and config.json)."""
  return {o.name: o.value for o in walk(type(cfg), cfg)}


def replace(cfg, **values):
  """`cfg` with options set by name (values checked, flags in messages)."""
  return apply(cfg, values, "code")


def apply(cfg, values: dict, source: str):
  """`cfg` with the options of mapping `values` set.

  Args:
    cfg: a configuration.
    values: option name -> value (as read from a file or given in code);
      `dict` options merge entry by entry.
    source: where the values come from, for messages (e.g. a file name).

  Raises:
    ValueError: naming the option (and `source`) on an unknown name or a bad
      value.
  """
  options = {o.name: o for o in walk(type(cfg), cfg)}
  for name, value in values.items():
    if name not in options:
      raise ValueError(f"unknown option {name!r} in {source}; options: "
                       f"{', '.join(options)}.")
    o = options[name]
    value = o.read_value(value, source)
    if o.kind.mapping and o.spec.grid:
      value = {**o.value, **check_grid(cfg, o, value, source)}
    elif o.kind.mapping:
      value = merge_settings(o.value, check_settings(cfg, o, value, source))
    cfg = _set(cfg, o.path, value)
  return cfg


def _set(obj, path: tuple, value):
  if len(path) == 1:
    return dataclasses.replace(obj, **{path[0]: value})
  return dataclasses.replace(
      obj, **{path[0]: _set(getattr(obj, path[0]), path[1:], value)})


# ----------------------------------------------------------------------------
# Per-algorithm settings (`dict` options).
# ----------------------------------------------------------------------------


def setting_options(cfg, mapping_option: Option) -> dict:
  """Name -> `Option` of the settings a `dict` option may set."""
  return {o.name: o for o in walk(type(cfg), cfg)
          if o.owner in mapping_option.spec.groups}


def check_settings(cfg, mapping_option: Option, value: dict,
                   source: str) -> dict:
  """`{algorithm: {setting: value}}` typed and checked (text or values)."""
  settings = setting_options(cfg, mapping_option)
  flag = mapping_option.flag
  out = {}
  for alg, entries in value.items():
    choices = mapping_option.spec.choices
    if choices is not None and alg not in choices:
      raise ValueError(f"{flag} ({source}): unknown algorithm {alg!r}; "
                       f"known: {', '.join(choices)}.")
    if not isinstance(entries, dict):
      raise ValueError(f"{flag} ({source}): {alg} must map settings to "
                       f"values, got {entries!r}.")
    out[alg] = {}
    for name, v in entries.items():
      if name not in settings:
        raise ValueError(f"{flag} ({source}): {alg}.{name} is not a "
                         f"per-algorithm setting; settings: "
                         f"{', '.join(settings)}.")
      o = settings[name]
      where = f"{flag} {alg}.{name}"
      try:
        out[alg][name] = (o.read_text(v) if isinstance(v, Text) else
                          o.read_value(v, source))
      except ValueError as e:
        raise ValueError(f"{where} ({source}): {e}") from None
  return out


def check_grid(cfg, grid_option: Option, value: dict, source: str) -> dict:
  """`{setting: [values]}` typed and checked (text or values)."""
  settings = setting_options(cfg, grid_option)
  out = {}
  for name, values in value.items():
    if name not in settings:
      raise ValueError(f"{grid_option.flag} ({source}): {name} is not a "
                       f"setting to sweep; settings: {', '.join(settings)}.")
    o = settings[name]
    if isinstance(values, Text):
      values = [Text(v) for v in values.split(",")]
    if not isinstance(values, (list, tuple)) or not values:
      raise ValueError(f"{grid_option.flag} {name} ({source}) must be a "
                       f"non-empty list of values, got {values!r}.")
    try:
      out[name] = [o.read_text(v) if isinstance(v, Text) else
                   o.read_value(v, source) for v in values]
    except ValueError as e:
      raise ValueError(f"{grid_option.flag} {name} ({source}): {e}") from None
    if len(set(map(repr, out[name]))) != len(out[name]):
      raise ValueError(f"{grid_option.flag} {name} ({source}) repeats a "
                       f"value: {out[name]}.")
  return out


def grid_text(text: str) -> dict:
  """`NAME=V1,V2` -> `{NAME: Text("V1,V2")}`."""
  name, sep, values = text.partition("=")
  if not sep or not name.strip() or not values.strip():
    raise ValueError(f"must look like SETTING=VALUE,VALUE (e.g. "
                     f"lr=0.05,0.1), got {text!r}")
  return {name.strip(): Text(values.strip())}


def merge_settings(old: dict, new: dict) -> dict:
  merged = {alg: dict(entries) for alg, entries in old.items()}
  for alg, entries in new.items():
    merged.setdefault(alg, {}).update(entries)
  return merged


class Text(str):
  """A setting value still in command-line form."""


def setting_text(text: str) -> dict:
  """`ALG.NAME=VALUE` -> `{ALG: {NAME: Text(VALUE)}}`."""
  head, sep, value = text.partition("=")
  alg, dot, name = head.strip().partition(".")
  if not sep or not dot or not alg or not name:
    raise ValueError(f"must look like ALGORITHM.SETTING=VALUE (e.g. "
                     f"fc.rounds=300), got {text!r}")
  return {alg: {name: Text(value.strip())}}
