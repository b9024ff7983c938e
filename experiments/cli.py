"""The command line every experiment shares: checked options, run records.

Every option is validated by its argparse `type`, cross-option rules by the
experiment's `check`, and the output directory by writing a probe file, all
before any data load or compile; a bad value exits with status 2 and a
message naming the option (`argument --rounds: must be an integer >= 1, got
'-5'`). `write_config` records the resolved configuration, the seed, the
package versions and the backend as `config.json` beside the results.

  p = cli.parser(__doc__, out="results/mnist", smoke={"rounds": "3"})
  p.add_argument("--rounds", type=cli.positive_int, default=200)
  p.add_argument("--lrs", type=cli.list_of(cli.real(0, low_open=True)),
                 default="0.1,0.05")
  p.add_argument("--algorithms", type=cli.choices(("fc", "ifca")),
                 default="fc,ifca")
  args = cli.parse(p, argv, check=validate)
  cli.write_config(args.out, args)
"""

import argparse
import dataclasses
import datetime
import importlib.metadata
import math
import os
import platform
import sys
import tempfile
from typing import Callable, Optional, Sequence

from experiments import common


def integer(minimum: Optional[int] = None, maximum: Optional[int] = None):
  """Option type: an integer in `[minimum, maximum]` (either bound optional)."""
  def parse(text: str) -> int:
    try:
      value = int(text)
    except (TypeError, ValueError):
      raise argparse.ArgumentTypeError(
          f"must be an integer, got {text!r}") from None
    if (minimum is not None and value < minimum) or (
        maximum is not None and value > maximum):
      raise argparse.ArgumentTypeError(
          f"must be an integer {_bounds(minimum, maximum, False, False)}, "
          f"got {text!r}")
    return value
  parse.__name__ = "integer"
  return parse


positive_int = integer(minimum=1)


def real(low: Optional[float] = None, high: Optional[float] = None, *,
         low_open: bool = False, high_open: bool = False):
  """Option type: a finite float in the given range (NaN and inf rejected).

  Args:
    low, high: optional bounds.
    low_open, high_open: whether the bound itself is excluded.
  """
  def parse(text: str) -> float:
    try:
      value = float(text)
    except (TypeError, ValueError):
      raise argparse.ArgumentTypeError(
          f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
      raise argparse.ArgumentTypeError(
          f"must be a finite number, got {text!r}")
    if low is not None and (value < low or (low_open and value == low)) or (
        high is not None and (value > high or (high_open and value == high))):
      raise argparse.ArgumentTypeError(
          f"must be a number {_bounds(low, high, low_open, high_open)}, got "
          f"{text!r}")
    return value
  parse.__name__ = "real"
  return parse


def _bounds(low, high, low_open, high_open) -> str:
  if low is not None and high is not None:
    return (f"in {'(' if low_open else '['}{low:g}, {high:g}"
            f"{')' if high_open else ']'}")
  if low is not None:
    return f"{'>' if low_open else '>='} {low:g}"
  if high is not None:
    return f"{'<' if high_open else '<='} {high:g}"
  return ""


def list_of(item: Callable[[str], object]):
  """Option type: a non-empty comma-separated list, each item of type `item`.

  Returns a tuple. Empty lists and empty items (`"0.1,,0.2"`) are rejected.
  """
  def parse(text: str) -> tuple:
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
      raise argparse.ArgumentTypeError("must be a non-empty comma-separated "
                                       f"list, got {text!r}")
    if not all(parts):
      raise argparse.ArgumentTypeError(f"has an empty item in {text!r}")
    values = []
    for part in parts:
      try:
        values.append(item(part))
      except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"item {part!r}: {e}") from None
    return tuple(values)
  parse.__name__ = "list"
  return parse


def choices(allowed: Sequence[str], *, multiple: bool = True):
  """Option type: names from `allowed`.

  Args:
    allowed: the valid names.
    multiple: True: a non-empty comma-separated list without repeats (a
      tuple); False: exactly one name (a str).
  """
  allowed = tuple(allowed)
  def parse(text: str):
    names = [p.strip() for p in str(text).split(",")]
    if not any(names) or not all(names):
      raise argparse.ArgumentTypeError(
          f"must name {'at least one' if multiple else 'one'} of "
          f"{', '.join(allowed)}; got {text!r}")
    unknown = [n for n in names if n not in allowed]
    if unknown:
      raise argparse.ArgumentTypeError(
          f"unknown {', '.join(map(repr, unknown))}; allowed: "
          f"{', '.join(allowed)}")
    if not multiple:
      if len(names) != 1:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(allowed)}, got {text!r}")
      return names[0]
    if len(set(names)) != len(names):
      raise argparse.ArgumentTypeError(f"names repeated in {text!r}")
    return tuple(names)
  parse.__name__ = "choice"
  return parse


def existing_dir(text: str) -> str:
  """Option type: a readable existing directory."""
  if not os.path.isdir(text) or not os.access(text, os.R_OK | os.X_OK):
    raise argparse.ArgumentTypeError(
        f"must be a readable directory, got {text!r}")
  return text


def check_writable(path: str):
  """Makes directory `path` and checks a file can be written and removed there.

  Raises:
    ValueError: naming `path` and the reason, if not.
  """
  try:
    os.makedirs(path, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-")
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    raise ValueError(f"output directory {path!r} is not writable: "
                     f"{e.strerror or e}") from None


def parser(description: Optional[str], *, out: str,
           smoke: Optional[dict] = None) -> argparse.ArgumentParser:
  """An ArgumentParser with the options every experiment has.

  Args:
    description: the experiment's docstring (its first paragraph is shown).
    out: default of `--out`, the output directory.
    smoke: option dest -> value (as typed on a command line) used as the
      default under `--smoke`; explicit options still win.

  Returns:
    `argparse.ArgumentParser` with `--out`, `--seed` (integer >= 0) and
    `--smoke`; add the experiment's options, then call `parse`.
  """
  p = argparse.ArgumentParser(
      description=(description or "").split("\n\n")[0], allow_abbrev=False)
  p.add_argument("--out", default=out, help="output directory (must be "
                 "writable; checked before anything runs)")
  p.add_argument("--seed", type=integer(minimum=0), default=0,
                 help="seed of every random draw")
  p.add_argument("--smoke", action="store_true",
                 help="a run of seconds on tiny sizes" + (
                     f" ({', '.join(f'{k}={v}' for k, v in smoke.items())})"
                     if smoke else ""))
  p.set_defaults(_smoke_defaults=dict(smoke or {}))
  return p


def add_dataset_options(p: argparse.ArgumentParser, datasets: Sequence[str],
                        default: str = "digits"):
  """Adds `--dataset`, `--data-dir` and `--source` (MNIST-type experiments).

  Args:
    p: a parser from `parser`.
    datasets: the names `--dataset` accepts.
    default: `--dataset`'s default.
  """
  from prfl_jax.data import datasets as sources  # pylint: disable=import-outside-toplevel
  p.add_argument("--dataset", type=choices(datasets, multiple=False),
                 default=default,
                 help=f"one of {', '.join(datasets)} (default {default})")
  p.add_argument("--data-dir", type=existing_dir, default=None,
                 help="directory of MNIST-format IDX files (else auto)")
  p.add_argument("--source", default="auto",
                 type=choices(sources.SOURCES, multiple=False),
                 help=" | ".join(sources.SOURCES))


def check_dataset(dataset: str, source: str, datasets: Sequence[str]):
  """A config's `--dataset` / `--source` (for configs built without argparse).

  Raises:
    ValueError: naming the option and the values it accepts.
  """
  from prfl_jax.data import datasets as sources  # pylint: disable=import-outside-toplevel
  if dataset not in datasets:
    raise ValueError(f"--dataset must be one of {', '.join(datasets)}, got "
                     f"{dataset!r}.")
  if source not in sources.SOURCES:
    raise ValueError(f"--source must be one of {', '.join(sources.SOURCES)}, "
                     f"got {source!r}.")


def parse(p: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None,
          *, check: Optional[Callable[[argparse.Namespace], None]] = None
          ) -> argparse.Namespace:
  """Parses and validates `argv`; exits with a usage error on a bad value.

  Order: every option's type; `--smoke` defaults; `check(args)` (a ValueError
  becomes a usage error with its message); `--out` made and probed.

  Args:
    p: a parser from `parser`.
    argv: arguments (default `sys.argv[1:]`).
    check: optional cross-option validation raising ValueError.

  Returns:
    the `argparse.Namespace`.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  smoke = p.get_default("_smoke_defaults") or {}
  if "--smoke" in argv and smoke:
    p.set_defaults(**smoke)
  args = p.parse_args(argv)
  del args._smoke_defaults
  if check is not None:
    try:
      check(args)
    except ValueError as e:
      p.error(str(e))
  try:
    check_writable(args.out)
  except ValueError as e:
    p.error(f"argument --out: {e}")
  enable_compile_cache()
  return args


def run_main(module: str, build_parser: Callable[[], argparse.ArgumentParser],
             config_from_args: Callable, resolve: Callable, run: Callable,
             argv: Optional[Sequence[str]] = None):
  """The `main` of an experiment with a typed config.

  Parses `argv` (every option typed, then `resolve(config_from_args(args))`
  as the cross-option check, once, before any data load or compile), writes
  `config.json` into the resolved `out`, then calls `run(cfg, log, command=)`
  with the command line as typed (`sys.argv` when `argv` is None).

  Args:
    module: the experiment's module, e.g. "experiments.mnist" (for the
      recorded command).
    build_parser: returns the experiment's parser (`parser`).
    config_from_args: `argparse.Namespace -> Config`.
    resolve: `Config -> Config` with defaults filled in; raises ValueError on
      a bad combination of options (a usage error naming it).
    run: `run(cfg, log, command=...)`.
    argv: arguments (default `sys.argv[1:]`).

  Returns:
    what `run` returns.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  resolved = {}

  def check(args):
    resolved["cfg"] = resolve(config_from_args(args))
    args.out = resolved["cfg"].out  # Filled in, for `parse`'s writable probe.

  parse(build_parser(), argv, check=check)
  cfg = resolved["cfg"]
  write_config(cfg.out, cfg)
  return run(cfg, lambda s: print(s, flush=True),
             command=" ".join([f"python -m {module}"] + argv))


CACHE_ENV = "PRFL_JAX_COMPILE_CACHE"


def enable_compile_cache() -> Optional[str]:
  """Turns on JAX's persistent compilation cache for this process.

  An experiment compiles one `train` program per (algorithm, attack, shape);
  grids repeat the same programs across Byzantine fractions, tasks and seeds,
  and on a CPU compiling (~12 s for an FC run on the digits MLP) can cost more
  than the rounds. With the cache, a repeated program is read from disk. The
  results are unchanged: the cache key is the program, its compile options
  and the backend.

  The directory is `$PRFL_JAX_COMPILE_CACHE`, or `~/.cache/prfl_jax/xla` if
  unset; `PRFL_JAX_COMPILE_CACHE=off` (or `0`) disables it (the tests do).

  Returns:
    the cache directory, or None when disabled or not creatable.
  """
  import jax  # pylint: disable=import-outside-toplevel
  setting = os.environ.get(CACHE_ENV, "")
  if setting.strip().lower() in ("0", "off", "false", "no", "none"):
    return None
  path = setting or os.path.join(os.path.expanduser("~"), ".cache",
                                 "prfl_jax", "xla")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError:
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  return path


def versions() -> dict:
  """Versions of Python and of the packages a result depends on."""
  out = {"python": platform.python_version()}
  for name in ("jax", "jaxlib", "flax", "optax", "numpy"):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def platform_info() -> dict:
  """The JAX backend and devices, the OS, and the precision settings."""
  import jax  # pylint: disable=import-outside-toplevel
  devices = jax.devices()
  return {
      "backend": jax.default_backend(),
      "devices": [str(d) for d in devices],
      "device_kind": devices[0].device_kind if devices else None,
      "process_count": jax.process_count(),
      "os": platform.platform(),
      "default_matmul_precision": jax.config.jax_default_matmul_precision,
      "compile_cache": jax.config.jax_compilation_cache_dir,
      "x64": bool(jax.config.jax_enable_x64),
  }


def _as_dict(config) -> dict:
  if isinstance(config, argparse.Namespace):
    return dict(vars(config))
  if dataclasses.is_dataclass(config) and not isinstance(config, type):
    return dataclasses.asdict(config)
  if isinstance(config, dict):
    return dict(config)
  raise TypeError("`config` must be an argparse.Namespace, a dataclass or a "
                  f"dict, got {type(config)}.")


def write_config(out: str, config, *, seed: Optional[int] = None,
                 extra: Optional[dict] = None) -> str:
  """Writes `<out>/config.json`: what a run was, for reproducing it.

  Args:
    out: output directory.
    config: the resolved configuration (Namespace, dataclass or dict).
    seed: the run's seed (default: `config`'s `seed` entry).
    extra: more entries for the record.

  Returns:
    the path written.
  """
  resolved = _as_dict(config)
  record = {
      "config": resolved,
      "seed": resolved.get("seed") if seed is None else seed,
      "command": [os.path.basename(sys.executable)] + list(sys.argv),
      "versions": versions(),
      "platform": platform_info(),
      "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }
  record.update(extra or {})
  path = os.path.join(out, "config.json")
  common.write_json(path, record)
  return path


__all__ = [
    "add_dataset_options", "check_writable", "choices", "enable_compile_cache", "existing_dir", "integer", "list_of",
    "parse", "parser", "platform_info", "positive_int", "real", "versions",
    "write_config",
]
