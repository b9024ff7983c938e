"""The SHA-256 manifest of a saved round, and its verification.

`save` (see `prfl_jax.checkpoint`) writes `<round>/prfl_sha256.json` once
orbax has finished the step: the SHA-256 and size of every file of the step.
`verify` checks them before anything is read, so a flipped byte, a truncated,
missing or stray file is found and named, and checks that the round recorded
in the metadata is the round the directory is named after.
"""

import hashlib
import json
import os

from etils import epath

FORMAT = "prfl_jax.checkpoint/1"
MANIFEST = "prfl_sha256.json"
META = "meta"


class CheckpointError(ValueError):
  """A checkpoint is corrupt, incomplete or not a prfl_jax checkpoint."""


def _step_files(step_dir: epath.Path) -> list:
  """Every file under `step_dir` (recursively) but the manifest, sorted."""
  out, todo = [], [step_dir]
  while todo:
    for p in todo.pop().iterdir():
      if p.is_dir():
        todo.append(p)
      elif p.name != MANIFEST:
        out.append(p)
  return sorted(out)


def _sha256(path: epath.Path) -> tuple:
  """`(hex SHA-256, size in bytes)` of a file."""
  digest, size = hashlib.sha256(), 0
  with path.open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
      size += len(block)
  return digest.hexdigest(), size


def write_manifest(step_dir: epath.Path):
  files = {}
  for p in _step_files(step_dir):
    digest, size = _sha256(p)
    files[os.fspath(p.relative_to(step_dir))] = {"sha256": digest,
                                                 "size": size}
  tmp = step_dir / f".{MANIFEST}.tmp"
  tmp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))
  tmp.replace(step_dir / MANIFEST)  # Atomic: the manifest is whole or absent.


def verify(step_dir) -> dict:
  """Checks every file of one saved round against its SHA-256 manifest.

  Args:
    step_dir: `<directory>/<round>`.

  Returns:
    the round's metadata (see `describe`, plus `"round"` and `"versions"`).

  Raises:
    CheckpointError: naming the file, if the manifest is missing or garbage,
      a file is missing, truncated, altered or not listed, or the metadata's
      round is not the directory's name.
  """
  step_dir = epath.Path(step_dir)
  manifest_path = step_dir / MANIFEST
  if not manifest_path.exists():
    raise CheckpointError(
        f"{os.fspath(step_dir)!r} has no {MANIFEST}: the save did not finish, "
        "or it is not a prfl_jax checkpoint.")
  try:
    manifest = json.loads(manifest_path.read_text())
    files = manifest["files"]
    if manifest.get("format") != FORMAT or not isinstance(files, dict):
      raise ValueError(f"format {manifest.get('format')!r}")
  except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
    raise CheckpointError(
        f"{os.fspath(manifest_path)!r} is not a valid checkpoint manifest "
        f"({e}).") from e
  present = {os.fspath(p.relative_to(step_dir)) for p in _step_files(step_dir)}
  for name in sorted(present - set(files)):
    raise CheckpointError(
        f"{os.fspath(step_dir / name)!r} is not listed in the checkpoint's "
        "manifest.")
  for name, expected in sorted(files.items()):
    path = step_dir / name
    if name not in present:
      raise CheckpointError(f"{os.fspath(path)!r} is missing.")
    digest, size = _sha256(path)
    if size != expected["size"]:
      raise CheckpointError(
          f"{os.fspath(path)!r} has {size} bytes, {expected['size']} were "
          "saved (truncated or overwritten).")
    if digest != expected["sha256"]:
      raise CheckpointError(
          f"{os.fspath(path)!r} is corrupt: its SHA-256 differs from the one "
          "recorded when it was saved.")
  meta_path = step_dir / META / "metadata"
  try:
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
      raise ValueError(f"format {meta.get('format')!r}")
  except (OSError, ValueError, UnicodeDecodeError) as e:
    raise CheckpointError(
        f"{os.fspath(meta_path)!r} is not prfl_jax checkpoint metadata "
        f"({e}).") from e
  if step_dir.name.isdigit() and meta.get("round") != int(step_dir.name):
    raise CheckpointError(
        f"{os.fspath(step_dir)!r} holds the checkpoint of round "
        f"{meta.get('round')}, not of round {step_dir.name} (a step directory "
        "copied or renamed?).")
  return meta
