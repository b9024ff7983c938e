"""Shared helpers of the experiment scripts: output files and plotting."""

import csv
import json
import os
import tempfile

import numpy as np


def to_jsonable(obj):
  """Converts numpy/jax values inside dicts and lists to plain Python."""
  if isinstance(obj, dict):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if hasattr(obj, "tolist"):
    return to_jsonable(np.asarray(obj).tolist())
  if isinstance(obj, float) and not np.isfinite(obj):
    return str(obj)
  return obj


def _atomic_write(path: str, write):
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
  try:
    with os.fdopen(fd, "w", newline="") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def write_json(path: str, obj):
  """Writes `obj` as indented JSON, atomically (no half-written file)."""
  _atomic_write(path, lambda f: json.dump(to_jsonable(obj), f, indent=1))


def write_csv(path: str, rows: list):
  """Writes a non-empty list of flat dicts as CSV, atomically."""
  if not rows:
    raise ValueError(f"no rows to write to {path!r}.")
  def write(f):
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  _atomic_write(path, write)


def save_figure(fig, path: str):
  """Saves a matplotlib figure as PNG, atomically."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".png")
  os.close(fd)
  try:
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def format_table(header: list, rows: list) -> str:
  """A plain-text table with aligned columns."""
  cells = [header] + [[str(c) for c in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
  line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))
  return "\n".join([line(cells[0]), line(["-" * w for w in widths])] +
                   [line(r) for r in cells[1:]])
