"""The command line of every experiment, from its declared options.

`main(experiment, argv)` runs an experiment in this order, and nothing is
written to disk before step 5:

1. every option typed and checked (`experiments.options`): its flag, the
   `--config` files, the presets (`--smoke`); a bad value exits with status 2
   and a message naming the option;
2. `experiment.resolve(cfg)`: the rules that tie options together, and the
   automatic values filled in (a ValueError is a usage error, as above);
3. `--out` checked writable (a probe file in its nearest existing directory,
   removed again);
4. `experiment.prepare(cfg)`: the data loaded (a missing or malformed data
   set is a clear error, not a traceback);
5. `config.json` written into `--out` (options, command, versions, backend),
   then `experiment.run(cfg, prepared, tracker)`.

  python -m experiments.mnist --config experiments/configs/mnist/paper.toml \\
      --rounds 100 --per-algorithm fc.groups=4
"""

import argparse
import functools
import json
import os
import sys
import tempfile
from typing import Any, Callable, NamedTuple, Optional, Sequence

from experiments import files
from experiments import options
from experiments import tracking

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


class Experiment(NamedTuple):
  """What `main` needs from an experiment module."""
  name: str  # e.g. "mnist": `python -m experiments.mnist`, configs/mnist/.
  doc: str  # The module docstring (help).
  config: type  # The configuration dataclass.
  resolve: Callable  # cfg -> cfg; ValueError on a bad combination.
  prepare: Callable  # cfg -> what `run` needs (the data); before any write.
  run: Callable  # run(cfg, prepared, tracker, command=) -> result.

  def main(self, argv: Optional[Sequence[str]] = None) -> Any:
    """`python -m experiments.<name>` (`main(experiment, argv)`)."""
    return main(self, argv)


def preset(experiment: str, name: str) -> str:
  """A committed config file: `experiments/configs/<experiment>/<name>.toml`."""
  return os.path.join(CONFIGS, experiment, f"{name}.toml")


def load_file(path: str) -> dict:
  """Option values from a TOML file or a JSON file (a saved `config.json`:
  its `config` entry).

  Raises:
    ValueError: naming the file, if it cannot be read or parsed.
  """
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise ValueError(f"--config {path}: {e.strerror or e}.") from None
  is_json = path.endswith(".json")
  try:
    values = json.loads(raw) if is_json else _toml().loads(raw.decode())
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"--config {path}: not valid "
                     f"{'JSON' if is_json else 'TOML'}: {e}.") from None
  if is_json and isinstance(values, dict) and "config" in values:
    values = values["config"]
  if not isinstance(values, dict):
    raise ValueError(f"--config {path}: must hold a table of options.")
  return values


def _toml():
  try:
    import tomllib  # pylint: disable=import-outside-toplevel
  except ModuleNotFoundError:  # Python 3.10.
    import tomli as tomllib  # pylint: disable=import-outside-toplevel
  return tomllib


def build_parser(config_cls, description: str, defaults=None,
                 prog: Optional[str] = None) -> argparse.ArgumentParser:
  """A parser with one flag per option of `config_cls`, plus `--config`.

  Flags default to "not given" (`argparse.SUPPRESS`), so that only the
  options typed override the config files; the help shows `defaults`.
  """
  p = argparse.ArgumentParser(
      prog=prog, description=(description or "").split("\n\n")[0],
      allow_abbrev=False)
  p.add_argument("--config", action="append", default=[], metavar="FILE",
                 help="TOML or JSON file of option values (a saved "
                 "config.json works); repeatable, later files win; options "
                 "typed here win over files")
  instance = config_cls() if defaults is None else defaults
  for o in options.walk(config_cls, instance):
    kwargs = dict(dest=o.name, default=argparse.SUPPRESS,
                  help=o.help_text().replace("%", "%%"))
    if o.kind.mapping and o.spec.grid:
      kwargs.update(action="append", type=_typed(options.grid_text),
                    metavar="SETTING=VALUE,VALUE")
    elif o.kind.mapping:
      kwargs.update(action="append", type=_typed(options.setting_text),
                    metavar="ALG.SETTING=VALUE")
    elif o.kind.item is bool and not o.kind.tuple:
      kwargs.update(action=argparse.BooleanOptionalAction)
    else:
      kwargs.update(type=_typed(o.read_text), metavar=o.name.upper())
    p.add_argument(o.flag, **kwargs)
  return p


def _typed(read):
  def parse(text):
    try:
      return read(text)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None
  parse.__name__ = "value"
  return parse


def parse(config_cls, argv: Sequence[str], *, description: str = "",
          presets: Optional[dict] = None, prog: Optional[str] = None):
  """A configuration from defaults, presets, config files and flags.

  Later layers win: `config_cls()`'s defaults; the `presets` of boolean
  options that are true (`{"smoke": path}`: `--smoke` applies that file); the
  `--config` files in order; the flags typed.

  Returns:
    `(cfg, parser)`. A bad value exits with status 2 and a message naming
    the option (argparse's `error`).
  """
  p = build_parser(config_cls, description, prog=prog)
  args = vars(p.parse_args(list(argv)))
  try:
    layers = [(f, load_file(f)) for f in args.pop("config")]
    flags = {k: _merged(v) if isinstance(v, list) else v
             for k, v in args.items()}
    layers.append(("the command line", flags))
    cfg = config_cls()
    for name, path in (presets or {}).items():
      if [v for _, layer in layers for k, v in layer.items() if k == name
          ][-1:] == [True]:
        cfg = options.apply(cfg, load_file(path), os.path.relpath(path))
    for source, values in layers:
      cfg = options.apply(cfg, values, source)
  except ValueError as e:
    p.error(str(e))
  return cfg, p


def _merged(entries: list) -> dict:
  """The entries of a repeated `dict` flag as one mapping."""
  if all(isinstance(v, options.Text) for e in entries for v in e.values()):
    return {k: v for e in entries for k, v in e.items()}  # --grid.
  return functools.reduce(options.merge_settings, entries, {})


def check_writable(path: str):
  """Raises ValueError unless directory `path` can be made and written.

  Probes the nearest existing directory on the way with a temporary file
  (removed again), so nothing is left behind.
  """
  probe_dir = os.path.abspath(path)
  while not os.path.exists(probe_dir):
    probe_dir = os.path.dirname(probe_dir)
  if not os.path.isdir(probe_dir):
    raise ValueError(f"--out {path!r} is not writable: {probe_dir} is a "
                     "file.")
  try:
    fd, probe = tempfile.mkstemp(dir=probe_dir, prefix=".probe-")
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    raise ValueError(f"--out {path!r} is not writable: "
                     f"{e.strerror or e}.") from None


CACHE_ENV = "PRFL_JAX_COMPILE_CACHE"


def enable_compile_cache() -> Optional[str]:
  """Turns on JAX's persistent compilation cache for this process.

  A grid repeats the same programs across tasks, fractions and seeds, and on
  a CPU compiling (~12 s for an FC run on the digits MLP) can cost more than
  the rounds; with the cache a repeated program is read from disk. Results
  are unchanged (the key is the program, its options and the backend).

  The directory is `$PRFL_JAX_COMPILE_CACHE`, or `~/.cache/prfl_jax/xla`;
  `PRFL_JAX_COMPILE_CACHE=off` (or `0`) disables it (the tests do).

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


def main(experiment: Experiment, argv: Optional[Sequence[str]] = None) -> Any:
  """Runs `experiment` from the command line (the steps of the docstring)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  smoke = preset(experiment.name, "smoke")
  cfg, p = parse(experiment.config, argv, description=experiment.doc,
                 presets={"smoke": smoke} if os.path.exists(smoke) else None,
                 prog=f"python -m experiments.{experiment.name}")
  try:
    cfg = experiment.resolve(cfg)
    check_writable(cfg.run.out)
  except ValueError as e:
    p.error(str(e))
  try:
    prepared = experiment.prepare(cfg)
  except (ValueError, OSError, ImportError) as e:
    print(f"{p.prog}: cannot load the data: {e}", file=sys.stderr)
    raise SystemExit(1) from None
  enable_compile_cache()
  command = " ".join([f"python -m experiments.{experiment.name}"] + argv)
  files.write_json(os.path.join(cfg.run.out, "config.json"),
                   files.run_record(options.to_dict(cfg), command))
  with tracking.Tracker(cfg.run.out, progress=cfg.run.progress,
                        tensorboard=cfg.run.tensorboard) as tracker:
    return experiment.run(cfg, prepared, tracker, command=command)
