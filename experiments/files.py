"""What experiments write: atomic files, JSON/CSV/markdown, figures, versions.

Every writer goes through `atomic_write`: the file appears complete or not at
all (a crash leaves at most a `.tmp-*` file, never a half-written result).
"""

import csv
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Callable, Optional

import numpy as np


def atomic_write(path: str, write: Callable, *, binary: bool = False):
  """Writes `path` through `write(file)` into a temporary file, then renames.

  Args:
    path: the file; its directory is made if missing.
    write: `write(f)` writes the content to the open file `f`.
    binary: open the temporary file in binary mode.
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-",
                             suffix=os.path.splitext(path)[1])
  try:
    with os.fdopen(fd, "wb" if binary else "w",
                   **({} if binary else {"newline": ""})) as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def to_jsonable(obj):
  """numpy / jax values inside dicts, lists and tuples as plain Python."""
  if isinstance(obj, dict):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if hasattr(obj, "tolist"):
    return to_jsonable(np.asarray(obj).tolist())
  if isinstance(obj, float) and not np.isfinite(obj):
    return str(obj)
  return obj


def write_json(path: str, obj):
  """`obj` as indented JSON."""
  atomic_write(path, lambda f: json.dump(to_jsonable(obj), f, indent=1))


def write_text(path: str, text: str):
  atomic_write(path, lambda f: f.write(text))


def write_csv(path: str, rows: list):
  """A non-empty list of flat dicts as CSV (columns: the first row's keys)."""
  if not rows:
    raise ValueError(f"no rows to write to {path!r}.")

  def write(f):
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  atomic_write(path, write)


def save_figure(fig, path: str):
  """A matplotlib figure as PNG."""
  atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120,
                                           bbox_inches="tight"), binary=True)


def pyplot():
  """matplotlib's pyplot on the file-only Agg backend."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def markdown_table(header: list, rows: list) -> str:
  """A markdown table; columns after the first are right-aligned."""
  lines = ["| " + " | ".join(map(str, header)) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
  lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def text_table(header: list, rows: list) -> str:
  """A plain-text table with aligned columns."""
  cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
  line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))
  return "\n".join([line(cells[0]), line(["-" * w for w in widths])] +
                   [line(r) for r in cells[1:]])


def git_commit() -> Optional[str]:
  """The checkout's commit, or None outside a git checkout."""
  try:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True,
        check=True, cwd=os.path.dirname(os.path.abspath(__file__))
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def versions() -> dict:
  """Python, the packages a result depends on, and the commit."""
  out = {"python": platform.python_version()}
  for name in ("prfl_jax", "jax", "jaxlib", "flax", "optax", "numpy",
               "scikit-learn"):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  out["git_commit"] = git_commit()
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
      "cpus": os.cpu_count(),
      "default_matmul_precision": jax.config.jax_default_matmul_precision,
      "compile_cache": jax.config.jax_compilation_cache_dir,
      "x64": bool(jax.config.jax_enable_x64),
  }


def run_record(config: dict, command: str) -> dict:
  """What `config.json` holds: the options, command, versions, platform."""
  return {
      "config": config,
      "seed": config.get("seed"),
      "command": command,
      "python": sys.executable,
      "versions": versions(),
      "platform": platform_info(),
      "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }
