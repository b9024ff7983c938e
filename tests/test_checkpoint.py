"""Tests of prfl_jax.checkpoint: orbax steps, checksums, fall-back, targets."""

import dataclasses
import hashlib
import json
import os
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import checkpoint
from prfl_jax.checkpoint import run as run_lib

LOSS = prfl.data.regression_loss


def _fc(optimizer=None):
  return prfl.algorithms.federated_clustering(
      LOSS, optimizer or optax.adam(1e-2), radius=prfl.quantile_radius(0.5))


def _state(round_, alg=None):
  """A state whose every leaf depends on `round_` (so rounds differ)."""
  alg = alg or _fc()
  params = jnp.arange(24, dtype=jnp.float32).reshape(6, 4) + round_
  state = alg.init(params, byzantine=np.arange(6) == 5)
  opt = jax.tree.map(lambda x: x + round_ if x.ndim else x, state.opt_state)
  return state._replace(opt_state=opt, round=jnp.int32(round_))


def _assert_equal(a, b):
  assert type(a) is type(b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    np.testing.assert_array_equal(x, y)


def _array_files(step_dir):
  """The OCDBT data files that hold the state's arrays (read by restore)."""
  files = sorted((pathlib.Path(step_dir) / "state" / "d").iterdir())
  assert files
  return files


@pytest.fixture(name="saved")
def fixture_saved(tmp_path):
  directory = tmp_path / "ckpt"
  for r in (3, 6, 9):
    checkpoint.save(directory, _state(r))
  return directory


def test_save_restore_roundtrip_and_metadata(saved):
  assert checkpoint.rounds(saved) == [6, 9]  # keep=2: round 3 was dropped.
  _assert_equal(checkpoint.restore(saved, _state(0)), _state(9))
  _assert_equal(checkpoint.restore(saved, _state(0), at_round=6), _state(6))
  # An abstract target (ShapeDtypeStructs) works as well.
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          _state(0))
  _assert_equal(checkpoint.restore(saved, abstract), _state(9))
  meta = json.loads((saved / "9" / "meta" / "metadata").read_text())
  assert meta["round"] == 9 and meta["format"] == checkpoint.FORMAT
  assert meta["state_type"] == (
      "prfl_jax.algorithms.federated_clustering.FederatedClusteringState")
  assert meta["treedef"] == str(jax.tree.structure(_state(0)))
  leaves = {leaf["path"]: (leaf["shape"], leaf["dtype"])
            for leaf in meta["leaves"]}
  assert leaves[".params"] == ([6, 4], "float32")
  assert leaves[".opt_state[0].mu"] == ([6, 4], "float32")
  assert leaves[".byzantine"] == ([6], "bool")
  assert leaves[".round"] == ([], "int32")
  assert set(meta["versions"]) == {"prfl_jax", "jax", "orbax_checkpoint"}
  manifest = json.loads((saved / "9" / checkpoint.MANIFEST).read_text())
  files = {str(p.relative_to(saved / "9")) for p in (saved / "9").rglob("*")
           if p.is_file() and p.name != checkpoint.MANIFEST}
  assert set(manifest["files"]) == files
  assert "meta/metadata" in files


def test_flipped_byte_in_an_array_is_found_and_the_previous_round_restored(
    saved):
  """Failed before the fix: msgpack restored a flipped byte as garbage.

  Mutation check: without `verify` (orbax alone) the error names no file,
  so the warning check below fails.
  """
  for path in _array_files(saved / "9"):
    original = path.read_bytes()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.warns(UserWarning, match=f"'{path}' is corrupt.*round 6"):
      _assert_equal(checkpoint.restore(saved, _state(0)), _state(6))
    with pytest.raises(checkpoint.CheckpointError, match=f"'{path}'"):
      checkpoint.restore(saved, _state(0), at_round=9)
    path.write_bytes(original)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # Intact again: no warning.
    _assert_equal(checkpoint.restore(saved, _state(0)), _state(9))


def test_edited_metadata_is_found(saved):
  """Metadata edited to claim float16 is caught by its checksum; the warning
  points at the line that called `restore` (here, this file). Seen to fail
  when it points one frame higher (`stacklevel=2` -> `3`, mutant #177 of
  session 8's whole `--preset train` run: pytest's own code was named)."""
  meta = saved / "9" / "meta" / "metadata"
  meta.write_text(meta.read_text().replace('"float32"', '"float16"'))
  with pytest.warns(UserWarning, match=f"'{meta}' (is corrupt|has)") as got:
    _assert_equal(checkpoint.restore(saved, _state(0)), _state(6))
  assert [w.filename for w in got] == [__file__]


def test_truncated_missing_and_garbage_files_are_named(saved, tmp_path):
  """Failed before the fix: truncated or garbage files gave msgpack errors
  naming no file."""
  data = _array_files(saved / "9")[0]
  data.write_bytes(data.read_bytes()[:10])
  with pytest.raises(checkpoint.CheckpointError,
                     match=f"'{data}' has 10 bytes"):
    checkpoint.restore(saved, _state(0), at_round=9)
  data.unlink()
  with pytest.raises(checkpoint.CheckpointError, match=f"'{data}' is missing"):
    checkpoint.restore(saved, _state(0), at_round=9)
  manifest = saved / "6" / checkpoint.MANIFEST
  manifest.write_bytes(b"\x00garbage\xff")
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.restore(saved, _state(0))
  message = str(e.value)  # Every candidate is named.
  assert f"'{data}' is missing" in message
  assert f"'{manifest}' is not a valid checkpoint manifest" in message
  manifest.unlink()  # As after a save that died before its manifest.
  with pytest.raises(checkpoint.CheckpointError,
                     match=f"'{saved / '6'}' has no {checkpoint.MANIFEST}"):
    checkpoint.restore(saved, _state(0), at_round=6)

  extra = tmp_path / "other"
  checkpoint.save(extra, _state(1))
  (extra / "1" / "state" / "stray").write_text("x")
  with pytest.raises(checkpoint.CheckpointError, match="stray' is not listed"):
    checkpoint.restore(extra, _state(0))

  not_a_dir = tmp_path / "state.msgpack"
  not_a_dir.write_bytes(b"\x81\xa6params")
  for call in (lambda: checkpoint.restore(not_a_dir, _state(0)),
               lambda: checkpoint.save(not_a_dir, _state(0))):
    with pytest.raises(checkpoint.CheckpointError,
                       match=f"'{not_a_dir}' is a file"):
      call()
  with pytest.raises(FileNotFoundError, match="no checkpoint in"):
    checkpoint.restore(tmp_path / "nothing", _state(0))
  with pytest.raises(FileNotFoundError, match="no checkpoint of round 4"):
    checkpoint.restore(extra, _state(0), at_round=4)


@pytest.mark.parametrize("target, message", [
    (prfl.algorithms.fedavg(LOSS, optax.adam(1e-2)).init(jnp.zeros((6, 4))),
     "holds a prfl_jax.algorithms.federated_clustering.FederatedClustering"
     "State \\(another algorithm's state\\), but `target` is a "
     "prfl_jax.algorithms.fedavg.FedAvgState"),
    (_state(0)._replace(params=jnp.zeros((6, 4), jnp.float16)),
     "at leaf .params: saved float32\\[6, 4\\], target float16\\[6, 4\\]"),
    (_state(0)._replace(params=jnp.zeros((6, 4), jnp.int32)),
     "at leaf .params: saved float32\\[6, 4\\], target int32\\[6, 4\\]"),
    (_state(0)._replace(round=jnp.float32(0)),
     "at leaf .round: saved int32\\[\\], target float32\\[\\]"),
    (_fc().init(jnp.zeros((5, 4))), "at leaf .params: saved float32\\[6, 4\\]"
     ", target float32\\[5, 4\\]"),
    (_fc(optax.sgd(0.1, momentum=0.9)).init(jnp.zeros((6, 4))),
     "another tree structure than `target`: leaves only in the checkpoint "
     "\\['.opt_state\\[0\\].count', '.opt_state\\[0\\].mu'"),
    (_state(0)._replace(params={"w": jnp.zeros((6, 4))}),
     "only in `target` \\[\"\\.params\\['w'\\]\"\\]"),
])
def test_restore_rejects_another_algorithm_dtype_shape_or_structure(
    saved, target, message):
  """Failed before the fix: float16 / int32 targets and another algorithm's
  state (FedAvgState has the same fields) were accepted."""
  with pytest.raises(ValueError, match=f"checkpoint '{saved / '9'}'"):
    checkpoint.restore(saved, target)
  with pytest.raises(ValueError, match=message):
    checkpoint.restore(saved, target)


def test_saving_an_earlier_round_replaces_its_future(saved):
  checkpoint.save(saved, _state(4), keep=3)
  assert checkpoint.rounds(saved) == [4]
  checkpoint.save(saved, _state(5), keep=3)
  checkpoint.save(saved, _state(7), keep=3)
  checkpoint.save(saved, _state(8), keep=3)
  assert checkpoint.rounds(saved) == [5, 7, 8]
  _assert_equal(checkpoint.restore(saved, _state(0)), _state(8))


@pytest.mark.parametrize("change", [dict(format="prfl_jax.checkpoint/0"),
                                    dict(files=[])])
def test_a_manifest_of_another_format_or_without_a_file_table_is_refused(
    saved, change):
  """A manifest whose format is not this version's (its files intact), or
  whose file table is not a table, is not valid: round 9 is skipped. Seen to
  fail when both must be wrong (`format != FORMAT or not isinstance(files,
  dict)` -> `and`, mutant #220 of session 8's whole `--preset train` run)."""
  path = saved / "9" / checkpoint.MANIFEST
  path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
  with pytest.raises(checkpoint.CheckpointError,
                     match=f"'{path}' is not a valid checkpoint manifest"):
    checkpoint.restore(saved, _state(0), at_round=9)


def test_a_relative_directory_is_saved_and_named_absolute(tmp_path,
                                                          monkeypatch):
  """`save("ckpt", ...)` from another working directory writes under it and
  returns the round's absolute path, which `restore("ckpt")` reads. Seen to
  fail when local paths are left relative (`'://' not in directory` -> `in`,
  mutant #125 of session 8's whole `--preset train` run)."""
  monkeypatch.chdir(tmp_path)
  got = checkpoint.save("ckpt", _state(4))
  assert got == os.fspath(tmp_path / "ckpt" / "4")
  _assert_equal(checkpoint.restore("ckpt", _state(0)), _state(4))


def test_save_with_keep_one_keeps_only_the_newest_round(tmp_path):
  """`keep=1` (the smallest allowed) leaves only the newest round, which
  restores. Seen to fail when 1 is refused (`keep < 1` -> `keep <= 1`,
  mutant #150 of session 8's whole `--preset train` run)."""
  for r in (2, 5):
    checkpoint.save(tmp_path, _state(r), keep=1)
  assert checkpoint.rounds(tmp_path) == [5]
  _assert_equal(checkpoint.restore(tmp_path, _state(0)), _state(5))


def test_a_leftover_that_cannot_be_removed_does_not_stop_a_save(tmp_path):
  """Half-written steps are removed as far as possible: a leftover that
  cannot be (here a plain file under orbax's temporary name, which rmtree
  refuses) stays, and the round is saved and restores. Seen to fail when the
  removal's errors are raised (`rmtree(..., ignore_errors=True)` -> `False`,
  mutant #147 of session 8's whole `--preset train` run)."""
  (tmp_path / "3.orbax-checkpoint-tmp-1").write_text("")
  checkpoint.save(tmp_path, _state(5))
  assert checkpoint.rounds(tmp_path) == [5]
  _assert_equal(checkpoint.restore(tmp_path, _state(0)), _state(5))


def test_save_argument_checks(tmp_path):
  with pytest.raises(ValueError, match="`keep`"):
    checkpoint.save(tmp_path / "a", _state(1), keep=0)
  with pytest.raises(ValueError, match="scalar `round` field"):
    checkpoint.save(tmp_path / "a", {"params": jnp.zeros(3)})
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(OSError, match="is not writable"):
    checkpoint.save(blocker / "ckpt", _state(1))
  assert not list(tmp_path.glob("a*"))


def test_restore_places_leaves_with_the_targets_sharding(saved):
  mesh = prfl.sharding.client_mesh()
  target = prfl.sharding.shard_clients(_state(0), mesh, name="state")
  out = checkpoint.restore(saved, target)
  _assert_equal(jax.device_get(out), jax.device_get(_state(9)))
  assert out.params.sharding == target.params.sharding
  assert os.path.isdir(saved / "9")


def test_describe_value_names_a_cycle_once():
  """A list holding itself is described to its first repeat: `[1.0, {type:
  list}]`. Seen to fail when the ids seen on the way down are intersected
  instead of joined (the cycle unrolled to the depth limit)."""
  loop = [1.0]
  loop.append(loop)
  assert run_lib.describe_value(loop) == [1.0, {"type": "builtins.list"}]


def test_describe_value_names_values_deeper_than_eight_levels_by_type():
  """Nine nested lists: the eight outer ones are described, the ninth (depth
  8) only by its type. Seen to fail when the depth limit lets one more level
  through (`depth >= _MAX_DEPTH` -> `>`, mutant #187 of session 8's whole
  `--preset train` run)."""
  value = [1.0]
  for _ in range(8):
    value = [value]
  want = {"type": "builtins.list"}
  for _ in range(8):
    want = [want]
  assert run_lib.describe_value(value) == want


def test_describe_value_hashes_arrays_up_to_the_size_limit_inclusive(
    monkeypatch):
  """An array of exactly `_MAX_HASH_BYTES` (set to 16 here) is described
  with its SHA-256, a larger one by dtype and shape alone. Seen to fail when
  the limit is exclusive (`nbytes <= _MAX_HASH_BYTES` -> `<`, mutant #181 of
  session 8's whole `--preset train` run)."""
  monkeypatch.setattr(run_lib, "_MAX_HASH_BYTES", 16)
  at_limit = run_lib.describe_value(np.arange(4, dtype=np.float32))
  assert at_limit["array"]["sha256"] == hashlib.sha256(
      np.arange(4, dtype=np.float32).tobytes()).hexdigest()
  over = run_lib.describe_value(np.arange(5, dtype=np.float32))
  assert over == {"array": {"dtype": "float32", "shape": [5]}}


def test_describe_value_does_not_hash_an_array_over_64_mib():
  """The hash limit is 64 MiB: an array 4 bytes over it (all zeros, so
  cheap) is described by dtype and shape alone. Seen to fail when the limit
  doubles (`1 << 26` -> `2 << 26`, mutant #179 of session 8's whole
  `--preset train` run)."""
  over = np.zeros((1 << 24) + 1, np.float32)
  assert run_lib.describe_value(over) == {
      "array": {"dtype": "float32", "shape": [(1 << 24) + 1]}}


def test_describe_value_gives_a_dataclass_instance_its_fields():
  """An instance is described by its fields (two settings differ), a
  dataclass itself only by its type. Seen to fail when the instance check
  is inverted (`not isinstance(value, type)` -> `isinstance`, session 7's
  mutant #198 of `--preset train`: every instance read as its type alone,
  so a resume with another setting went unnoticed)."""
  @dataclasses.dataclass
  class Plan:
    kernel: str = "gram"

  got = run_lib.describe_value(Plan("direct"))
  assert got["fields"] == {"kernel": "direct"}
  assert got != run_lib.describe_value(Plan("gram"))
  assert "fields" not in run_lib.describe_value(Plan)


def test_check_same_run_names_eight_differences_and_counts_the_rest():
  """Nine settings differ: the message names the first eight (sorted) and
  says 9 in all. Seen to fail when it names nine (`diffs[:8]` -> `[:9]`,
  session 7's mutant #206 of `--preset train`)."""
  saved = {f"s{i}": i for i in range(9)}
  now = {f"s{i}": i + 1 for i in range(9)}
  with pytest.raises(ValueError,
                     match=r"s7: saved 7, now 8; \.\.\. \(9 in all\)"):
    run_lib.check_same_run(saved, now, "ckpt")


def test_describe_run_records_the_counts_only_when_given():
  """Counts of real examples per client are part of a run (they decide which
  rows its batches draw): recorded when given, so other counts are a
  difference, and left out when every row is real. Seen to fail when the
  test is inverted (`counts is not None` -> `is None`, mutant #198 of
  session 8's whole `--preset train` run: counts were never recorded)."""
  alg = prfl.algorithms.local(LOSS, optax.sgd(1e-2))
  kw = dict(key=jax.random.key(0), batch_size=2,
            train={"x": np.zeros((2, 3, 1), np.float32)})
  assert "counts" not in checkpoint.describe_run(alg, **kw)
  two = checkpoint.describe_run(alg, counts=np.array([3, 2]), **kw)
  three = checkpoint.describe_run(alg, counts=np.array([3, 3]), **kw)
  assert two["counts"]["array"]["shape"] == [2]
  assert run_lib.differences(two, three)


def test_differences_name_a_setting_only_one_run_has():
  """A setting recorded by one run only (an option added, or dropped) is a
  difference, whichever side has it. Seen to fail when only the settings
  both runs have are compared (`a.keys() | b.keys()` -> `&`, mutant #201 of
  session 8's whole `--preset train` run)."""
  saved = {"lr": 0.1, "plan": {"chunk": 4}}
  now = {"lr": 0.1, "plan": {"chunk": 4, "kernel": "gram"}, "groups": [2]}
  assert run_lib.differences(saved, now) == [
      "groups[0]: saved '(absent)', now 2",
      "plan.kernel: saved '(absent)', now 'gram'"]
  assert run_lib.differences(now, saved) == [
      "groups[0]: saved 2, now '(absent)'",
      "plan.kernel: saved 'gram', now '(absent)'"]


def test_check_same_run_names_exactly_eight_differences_without_a_count():
  """Eight settings differ: all eight are named and no "(8 in all)" count
  follows (there is no rest). Seen to fail when the count is added from
  eight on (`len(diffs) > 8` -> `>= 8`, session 7's mutant #206 of `--preset
  train`, run whole in session 8)."""
  saved = {f"s{i}": i for i in range(8)}
  now = {f"s{i}": i + 1 for i in range(8)}
  with pytest.raises(ValueError) as e:
    run_lib.check_same_run(saved, now, "ckpt")
  assert "s7: saved 7, now 8. Resume" in str(e.value)
  assert "in all" not in str(e.value)


def test_check_target_refuses_another_structure_with_the_same_leaf_paths():
  """A target whose optimizer state is a list where the checkpoint's is a
  tuple has the same leaf paths (`[0]`, `[1]`), shapes and dtypes, but
  another tree structure: refused, naming both structures. Seen to fail when
  the structure check needs both the paths and the structure to differ
  (`keys != keys or treedef != treedef` -> `and`, mutant #167 of the whole
  `--preset train` run that session 7 started)."""
  state = _state(1)
  target = state._replace(opt_state=list(state.opt_state))
  assert ([leaf["path"] for leaf in checkpoint.describe(target)["leaves"]] ==
          [leaf["path"] for leaf in checkpoint.describe(state)["leaves"]])
  with pytest.raises(ValueError, match="another tree structure"):
    checkpoint.check_target(checkpoint.describe(state), target, "ckpt")
  checkpoint.check_target(checkpoint.describe(state), state, "ckpt")
