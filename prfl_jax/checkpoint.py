"""Saving and restoring algorithm states (checkpoint / resume) with orbax.

A checkpoint directory holds one orbax step per saved round:

  <directory>/<round>/state/...         the state's arrays (orbax, OCDBT)
  <directory>/<round>/meta/metadata     JSON: algorithm state type, round,
                                        tree structure, every leaf's path,
                                        shape and dtype, versions
  <directory>/<round>/prfl_sha256.json  SHA-256 of every file above

orbax writes every array (also a sharded one, from every process of a
`jax.distributed` run) and makes each step appear atomically; on top of it,
`save` records the SHA-256 of every file of the step once orbax has finished,
and `restore` verifies them before reading: a flipped byte, a truncated or a
missing file is found and named. The newest `keep` rounds are kept; when the
newest is corrupt or incomplete, `restore` warns, naming it, and falls back to
the newest intact one.

  prfl.checkpoint.save("runs/fc", state)            # after any round
  state = prfl.checkpoint.restore("runs/fc", alg.init(params))

`restore` refuses a target of another algorithm, structure, shape or dtype,
naming the checkpoint and the leaf.
"""

import hashlib
import json
import os
from typing import Any, Optional
import warnings

from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

PyTree = Any

FORMAT = "prfl_jax.checkpoint/1"
MANIFEST = "prfl_sha256.json"
_STATE, _META = "state", "meta"


class CheckpointError(ValueError):
  """A checkpoint is corrupt, incomplete or not a prfl_jax checkpoint."""


def state_type(state: Any) -> str:
  """`module.Class` of a state, e.g. `...FederatedClusteringState`."""
  cls = type(state)
  return f"{cls.__module__}.{cls.__qualname__}"


def describe(state: PyTree) -> dict:
  """The metadata `save` stores: state type, structure, leaf shapes, dtypes.

  Args:
    state: pytree of arrays (or `jax.ShapeDtypeStruct`s).

  Returns:
    `{"state_type", "treedef", "leaves": [{"path", "shape", "dtype"}]}`.
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
  return {
      "state_type": state_type(state),
      "treedef": str(treedef),
      "leaves": [{"path": jax.tree_util.keystr(path),
                  "shape": list(np.shape(x)),
                  "dtype": str(np.dtype(x.dtype) if hasattr(x, "dtype")
                               else np.asarray(x).dtype)}
                 for path, x in leaves],
  }


def _versions() -> dict:
  import prfl_jax  # pylint: disable=import-outside-toplevel
  return {"prfl_jax": prfl_jax.__version__, "jax": jax.__version__,
          "orbax_checkpoint": getattr(ocp, "__version__", "unknown")}


def _manager(directory: epath.Path, keep: int) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(
          max_to_keep=keep, enable_async_checkpointing=False, create=False))


def rounds(directory) -> list:
  """The rounds with a (finished, not necessarily intact) checkpoint, sorted.

  Args:
    directory: checkpoint directory; need not exist.

  Raises:
    CheckpointError: if `directory` is a file.
  """
  directory = epath.Path(directory)
  if not directory.exists():
    return []
  if not directory.is_dir():
    raise CheckpointError(
        f"checkpoint path {os.fspath(directory)!r} is a file, not a "
        "checkpoint directory (prfl_jax.checkpoint saves a directory with one "
        "orbax step per round).")
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit() and p.is_dir())


def _path(directory) -> epath.Path:
  """`directory` as an absolute local path, or as is for `gs://`-style URLs."""
  directory = os.fspath(directory)
  if "://" not in directory:
    directory = os.path.abspath(directory)
  return epath.Path(directory)


def check_writable(directory) -> None:
  """Creates `directory` if needed and checks a file can be written in it.

  Raises:
    CheckpointError: if `directory` is a file.
    OSError: naming `directory`, if it cannot be created or written.
  """
  rounds(directory)  # Rejects a file.
  path = _path(directory)
  probe = path / f".prfl-write-test-{os.getpid()}-{jax.process_index()}"
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe.write_text("")
    probe.unlink()
  except OSError as e:
    raise OSError(e.errno, f"checkpoint directory {os.fspath(directory)!r} "
                  f"is not writable: {e.strerror or e}") from e


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


def _write_manifest(step_dir: epath.Path):
  files = {}
  for p in _step_files(step_dir):
    digest, size = _sha256(p)
    files[os.fspath(p.relative_to(step_dir))] = {"sha256": digest,
                                                 "size": size}
  tmp = step_dir / f".{MANIFEST}.tmp"
  tmp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))
  tmp.replace(step_dir / MANIFEST)  # Atomic: the manifest is whole or absent.


def save(directory, state: PyTree, *, keep: int = 2) -> str:
  """Saves `state` as the checkpoint of round `state.round` in `directory`.

  Every process of a `jax.distributed` run must call it (each writes its own
  shards). Checkpoints of rounds >= this one are replaced first (a run resumed
  from an earlier round rewrites its future); then only the newest `keep`
  rounds are kept.

  Args:
    directory: checkpoint directory (created if needed).
    state: the algorithm state (a NamedTuple of arrays with a `round` field,
      e.g. `FederatedClusteringState`); leaves may be sharded `jax.Array`s.
    keep: number of newest rounds to keep (>= 2 lets `restore` fall back to
      the previous round when the newest is corrupt).

  Returns:
    the path of the round's checkpoint.

  Raises:
    ValueError: if `keep` < 1 or `state` has no integer `round`.
    CheckpointError: if `directory` is a file.
  """
  if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
    raise ValueError(f"`keep` must be an integer >= 1, got {keep!r}.")
  if not hasattr(state, "round") or np.shape(state.round) != ():
    raise ValueError(
        f"`state` must be an algorithm state with a scalar `round` field, got "
        f"{type(state).__name__}.")
  step = int(state.round)
  check_writable(directory)
  directory = _path(directory)
  meta = {"format": FORMAT, "round": step, **describe(state),
          "versions": _versions()}
  with _manager(directory, keep) as manager:
    for old in rounds(directory):
      if old >= step:
        manager.delete(old)
    manager.save(step, args=ocp.args.Composite(**{
        _STATE: ocp.args.StandardSave(state),
        _META: ocp.args.JsonSave(meta)}), force=True)
    manager.wait_until_finished()
  step_dir = directory / str(step)
  if jax.process_index() == 0:
    _write_manifest(step_dir)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"prfl_checkpoint_save_{step}")
  return os.fspath(step_dir)


def verify(step_dir) -> dict:
  """Checks every file of one saved round against its SHA-256 manifest.

  Args:
    step_dir: `<directory>/<round>`.

  Returns:
    the round's metadata (see `describe`, plus `"round"` and `"versions"`).

  Raises:
    CheckpointError: naming the file, if the manifest is missing or garbage,
      or a file is missing, truncated, altered or not listed.
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
  meta_path = step_dir / _META / "metadata"
  try:
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
      raise ValueError(f"format {meta.get('format')!r}")
  except (OSError, ValueError, UnicodeDecodeError) as e:
    raise CheckpointError(
        f"{os.fspath(meta_path)!r} is not prfl_jax checkpoint metadata "
        f"({e}).") from e
  return meta


def check_target(meta: dict, target: PyTree, where: str):
  """Raises ValueError unless `target` matches the saved state exactly.

  Args:
    meta: metadata returned by `verify`.
    target: state or abstract state (`jax.ShapeDtypeStruct` leaves).
    where: the checkpoint's path, for the message.
  """
  want = describe(target)
  if meta["state_type"] != want["state_type"]:
    raise ValueError(
        f"checkpoint {where!r} holds a {meta['state_type']} (another "
        f"algorithm's state), but `target` is a {want['state_type']}.")
  saved = {leaf["path"]: leaf for leaf in meta["leaves"]}
  wanted = {leaf["path"]: leaf for leaf in want["leaves"]}
  if saved.keys() != wanted.keys() or meta["treedef"] != want["treedef"]:
    raise ValueError(
        f"checkpoint {where!r} has another tree structure than `target`: "
        f"leaves only in the checkpoint {sorted(saved.keys() - wanted)}, only "
        f"in `target` {sorted(wanted.keys() - saved)}; saved structure "
        f"{meta['treedef']}, target {want['treedef']}.")
  for path, leaf in wanted.items():
    got = saved[path]
    if (got["shape"], got["dtype"]) != (leaf["shape"], leaf["dtype"]):
      raise ValueError(
          f"checkpoint {where!r} does not match `target` at leaf {path}: saved "
          f"{got['dtype']}{got['shape']}, target {leaf['dtype']}"
          f"{leaf['shape']}.")


def _abstract(target: PyTree) -> PyTree:
  """ShapeDtypeStructs with the target's sharding (one device if none)."""
  default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

  def one(x):
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
      sharding = default
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
  return jax.tree.map(one, target)


def restore(directory, target: PyTree, *,
            at_round: Optional[int] = None) -> PyTree:
  """Reads the newest intact checkpoint in `directory` into `target`'s form.

  Args:
    directory: a directory written by `save`.
    target: a state of the same algorithm, structure, shapes and dtypes (e.g.
      `alg.init(params)`), or its `jax.ShapeDtypeStruct`s; leaves that carry a
      sharding (e.g. a state placed with `prfl.sharding.shard_clients`) are
      restored with it, others onto one local device.
    at_round: restore exactly this round (no fall-back); default the newest
      intact one.

  Returns:
    the state, of `target`'s type.

  Warns:
    UserWarning: naming every newer checkpoint skipped because it is corrupt
      or incomplete.

  Raises:
    FileNotFoundError: if `directory` holds no checkpoint (of `at_round`).
    CheckpointError: if no candidate checkpoint is intact (every one named),
      or `directory` is a file.
    ValueError: if the checkpoint holds another algorithm's state or another
      structure, shape or dtype than `target` (naming the leaf).
  """
  path = os.fspath(directory)
  saved = rounds(directory)
  if at_round is not None:
    if at_round not in saved:
      raise FileNotFoundError(
          f"no checkpoint of round {at_round} in {path!r} (rounds: {saved}).")
    saved = [at_round]
  if not saved:
    raise FileNotFoundError(f"no checkpoint in {path!r}.")
  directory = _path(directory)
  problems = []
  for step in reversed(saved):
    step_dir = directory / str(step)
    try:
      meta = verify(step_dir)
    except CheckpointError as e:
      problems.append(str(e))
      continue
    check_target(meta, target, os.fspath(step_dir))
    try:
      with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as reader:
        out = reader.restore(step_dir / _STATE,
                             args=ocp.args.StandardRestore(_abstract(target)))
    except Exception as e:  # pylint: disable=broad-except
      problems.append(f"orbax could not read {os.fspath(step_dir)!r}: {e}")
      continue
    for problem in problems:
      warnings.warn(f"skipping a corrupt checkpoint: {problem} Restoring "
                    f"round {step} instead.", stacklevel=2)
    return jax.tree.unflatten(jax.tree.structure(target),
                              jax.tree.leaves(out))
  raise CheckpointError(f"no intact checkpoint in {path!r}: " +
                        " ".join(problems))


__all__ = ["CheckpointError", "check_target", "check_writable", "describe",
           "restore", "rounds", "save", "state_type", "verify"]
