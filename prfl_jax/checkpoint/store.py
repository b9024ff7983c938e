"""Saving and restoring states with orbax (see `prfl_jax.checkpoint`)."""

import errno
import os
import shutil
from typing import Any, Optional
import warnings

from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from prfl_jax.checkpoint import manifest
from prfl_jax.checkpoint.manifest import CheckpointError
from prfl_jax.checkpoint.manifest import FORMAT
from prfl_jax.checkpoint.manifest import META

PyTree = Any

_STATE = "state"
_TMP = ".orbax-checkpoint-tmp"  # orbax's suffix for a step being written.


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


def _disk_full(error: BaseException) -> bool:
  """Whether `error` (or an error it was raised from) is "no space left"."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC,
                                                      errno.EDQUOT):
      return True
    text = str(error)
    if ("No space left on device" in text or "RESOURCE_EXHAUSTED" in text or
        "os_error_code='28'" in text):
      return True
    error = error.__cause__ or error.__context__
  return False


def _remove_unfinished(directory: epath.Path):
  """Removes steps orbax left half-written (`<round>.orbax-checkpoint-tmp*`:
  a save killed or failed before its atomic rename; never read)."""
  if jax.process_index() != 0 or not directory.exists():
    return
  for p in directory.iterdir():
    if _TMP in p.name:
      shutil.rmtree(os.fspath(p), ignore_errors=True)


def save(directory, state: PyTree, *, keep: int = 2,
         run: Optional[dict] = None) -> str:
  """Saves `state` as the checkpoint of round `state.round` in `directory`.

  Every process of a `jax.distributed` run must call it (each writes its own
  shards). Checkpoints of rounds >= this one are replaced first (a run resumed
  from an earlier round, e.g. after falling back from a corrupt newest round,
  rewrites its future); then only the newest `keep` rounds are kept. Steps
  left half-written by a save that was killed are removed first.

  Args:
    directory: checkpoint directory (created if needed).
    state: the algorithm state (a NamedTuple of arrays with a `round` field,
      e.g. `FederatedClusteringState`); leaves may be sharded `jax.Array`s.
    keep: number of newest rounds to keep (>= 2 lets `restore` fall back to
      the previous round when the newest is corrupt).
    run: JSON what a resume must repeat (`prfl.checkpoint.describe_run`;
      `prfl.train` records it), returned by `run_settings`.

  Returns:
    the path of the round's checkpoint.

  Raises:
    ValueError: if `keep` < 1 or `state` has no integer `round`.
    CheckpointError: if `directory` is a file.
    OSError: `errno.ENOSPC` when the disk (or quota) is full: the round's
      partial files are removed and the earlier rounds are left intact.
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
          "versions": _versions(), "run": run}
  _remove_unfinished(directory)
  step_dir = directory / str(step)
  try:
    with _manager(directory, keep) as manager:
      for old in rounds(directory):
        if old >= step:
          manager.delete(old)
      manager.save(step, args=ocp.args.Composite(**{
          _STATE: ocp.args.StandardSave(state),
          META: ocp.args.JsonSave(meta)}), force=True)
      manager.wait_until_finished()
    if jax.process_index() == 0:
      manifest.write_manifest(step_dir)
  except Exception as e:  # pylint: disable=broad-except
    if not _disk_full(e):
      raise
    _remove_unfinished(directory)
    if jax.process_index() == 0:  # Written, but never verified: not kept.
      shutil.rmtree(os.fspath(step_dir), ignore_errors=True)
    raise OSError(
        errno.ENOSPC, f"no space left to save the checkpoint of round {step} "
        f"in {os.fspath(directory)!r} (disk or quota full: "
        f"{str(e).splitlines()[0][:300]}). Its partial "
        f"files were removed; the rounds still there, {rounds(directory)}, "
        "are intact.") from e
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"prfl_checkpoint_save_{step}")
  return os.fspath(step_dir)


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
      meta = manifest.verify(step_dir)
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
