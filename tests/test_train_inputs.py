"""`prfl.train`'s schedule and its checks of masks, resumed states and data.

Each test names the defect it guards against; "failed before the fix" means
it was run once on the code before the fix and failed there.
"""

import io
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax.train import check_eval_fn
from prfl_jax.train_checks import check_clusters
from prfl_jax.train_checks import check_examples
from prfl_jax.train_checks import check_resume
from prfl_jax.train_checks import resolve_eval_every


def _local():
  return prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))


_KW = dict(key=jax.random.key(0), verbose=False)


def test_oracle_results_do_not_depend_on_eval_every():
  """The ground-truth oracle (momentum SGD, a Byzantine client, mini-batches)
  ends bit for bit at the same state with `eval_every` 1, 2, 4 and 6.

  Failed before the fix: chunks were `lax.scan`s of static length, and XLA
  inlines a one-round scan and fuses it differently, so `eval_every=1` ended
  6e-8 away. Also seen to fail when `train` goes back to `lax.scan`.
  """
  data = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                        clients_per_cluster=4, dim=3,
                                        num_samples=6)[0]
  alg = prfl.algorithms.oracle(prfl.data.regression_loss,
                               optax.sgd(1e-2, momentum=0.9),
                               clusters=data.clusters)
  runs = [prfl.train(alg, jnp.zeros((8, 3)), data, num_rounds=6,
                     eval_every=e, byzantine=np.arange(8) == 7,
                     batch_size=2, key=jax.random.key(3), verbose=False)
          for e in (1, 2, 4, 6)]
  for r in runs[1:]:
    if jax.default_backend() == "cpu":  # GPU scatter-adds are atomics.
      jax.tree.map(np.testing.assert_array_equal, r.state, runs[0].state)
      np.testing.assert_array_equal(r.history["train/loss"],
                                    runs[0].history["train/loss"])
  np.testing.assert_array_equal(runs[2].history["eval_round"], [0, 4, 6])


def test_default_eval_every_counts_rounds_from_round_zero(data):
  """Default schedule: `ceil(R / 20)` rounds per chunk, R the last round.

  A fresh 30-round run evaluates every 2 rounds; resuming it at round 24 for
  6 rounds keeps chunks of 2 (R = 30). Failed before the fix: the default was
  `num_rounds // 20`, so both ran 1-round chunks (a resume with under 40
  rounds left always did). Seen to fail when the default is halved
  (`ceil(R / 40)`).
  """
  fresh = prfl.train(_local(), jnp.zeros((6, 4)), data, num_rounds=30, **_KW)
  np.testing.assert_array_equal(fresh.history["eval_round"],
                                np.arange(0, 31, 2))
  half = prfl.train(_local(), jnp.zeros((6, 4)), data, num_rounds=24, **_KW)
  resumed = prfl.train(_local(), None, data, num_rounds=6,
                       initial_state=half.state, **_KW)
  np.testing.assert_array_equal(resumed.history["eval_round"],
                                [24, 26, 28, 30])
  np.testing.assert_array_equal(resumed.state.params, fresh.state.params)
  assert [resolve_eval_every(None, 0, r) for r in (1, 20, 21, 300)] == [
      1, 1, 2, 15]
  assert resolve_eval_every(None, 280, 20) == 15


def test_eval_every_is_capped_at_the_rounds_left():
  """One helper gives both of `train`'s paths (dense chunks and the cohort
  loop) their chunk length: the given `eval_every` or the default, at most
  the rounds to run. Seen to fail when the cap (`min(..., num_rounds)`) is
  dropped."""
  assert resolve_eval_every(5, 0, 3) == 3
  assert resolve_eval_every(4, 10, 6) == 4
  assert resolve_eval_every(None, 0, 1) == 1
  assert resolve_eval_every(None, 380, 2) == 2  # Default 20, 2 rounds left.


@pytest.mark.parametrize("mask, error, match", [
    ([0, 0.2, 0, 0, 0, 0], ValueError, r"0 or 1, got \[0.2\]"),
    ([0, 5, 0, 0, 0, 0], ValueError, r"0 or 1, got \[5\]"),
    (["no", "yes", "no", "no", "no", "no"], TypeError, "dtype <U3"),
])
def test_byzantine_mask_values_are_checked(data, mask, error, match):
  """Failed before the fix: the mask was cast with `asarray(mask, bool)`, so
  0.2 and 5 became True and every non-empty string (also "no") made its
  client Byzantine."""
  with pytest.raises(error, match=match):
    prfl.train(_local(), jnp.zeros((6, 4)), data, num_rounds=1,
               byzantine=np.asarray(mask), **_KW)


def test_byzantine_mask_as_zeros_and_ones_equals_bools():
  alg = _local()
  as_ints = alg.init(jnp.zeros((3, 2)), byzantine=np.array([0, 1, 0]))
  as_floats = alg.init(jnp.zeros((3, 2)), byzantine=[0.0, 1.0, 0.0])
  for s in (as_ints, as_floats):
    assert s.byzantine.dtype == bool
    np.testing.assert_array_equal(s.byzantine, [False, True, False])


def test_a_traced_mask_of_zeros_and_ones_is_checked_by_dtype_only():
  """`init` under `jit` with an integer or float mask: the traced values
  cannot be read, so only the dtype is checked, and the mask becomes
  bools. Seen to fail when the values of a traced mask are read too
  (session 14's sampled survivor algorithms #6, `dtype != bool and not
  Tracer` -> `or`: NumPy cannot convert a tracer, so every jitted init
  with a 0/1 mask raised); the other tests pass masks as concrete arrays."""
  alg = _local()
  init = jax.jit(lambda b: alg.init(jnp.zeros((3, 2)), byzantine=b))
  for mask in (jnp.array([0, 1, 0]), jnp.array([0.0, 1.0, 0.0])):
    state = init(mask)
    assert state.byzantine.dtype == bool
    np.testing.assert_array_equal(state.byzantine, [False, True, False])


def test_initial_state_of_another_algorithm_is_refused(data):
  """Local's state (params, opt_state, byzantine, round) has FedAvg's fields:
  failed before the fix (FedAvg resumed from it silently); and a state built
  with another optimizer is refused, naming the structures."""
  local_state = _local().init(jnp.zeros((6, 4)))
  fedavg = prfl.algorithms.fedavg(prfl.data.regression_loss, optax.sgd(1e-2))
  with pytest.raises(TypeError, match="LocalState.*FedAvgState"):
    prfl.train(fedavg, None, data, num_rounds=1, initial_state=local_state,
               **_KW)
  adam = prfl.algorithms.local(prfl.data.regression_loss, optax.adam(1e-2))
  with pytest.raises(ValueError, match="another optimizer"):
    prfl.train(adam, None, data, num_rounds=1, initial_state=local_state,
               **_KW)
  momentum = prfl.algorithms.local(prfl.data.regression_loss,
                                  optax.sgd(1e-2, momentum=0.9))
  state = momentum.init(jnp.zeros((6, 4)))
  state = state._replace(opt_state=jax.tree.map(
      lambda x: x.astype(jnp.float16), state.opt_state))
  with pytest.raises(ValueError, match=r"trace` is float16\[6, 4\], but "
                     r"`algorithm` builds float32\[6, 4\]"):
    prfl.train(momentum, None, data, num_rounds=1, initial_state=state, **_KW)


def test_every_client_byzantine_reports_nan_not_zero(data):
  """With no benign client the loss and the evaluation are NaN. Failed before
  the fix: `benign_mean` divided by max(count, 1) and read 0.0, a perfect
  score."""
  r = prfl.train(_local(), jnp.zeros((6, 4)), data, num_rounds=2,
                 byzantine=np.ones(6, bool), eval_fn=prfl.data.regression_eval,
                 **_KW)
  assert np.isnan(r.history["train/loss"]).all()
  assert np.isnan(r.history["eval/error"]).all()
  one_benign = prfl.algorithms.base.benign_mean(
      jnp.array([1.0, 3.0]), jnp.array([True, False]))
  assert float(one_benign) == 3.0


@pytest.mark.parametrize("part, leaf, value", [
    ("train", "a", np.nan), ("train", "y", np.inf), ("test", "x_star", np.nan)])
def test_non_finite_data_is_refused_naming_leaf_and_clients(
    data, part, leaf, value):
  """Failed before the fix: the run went through and clients 1 and 4 ended
  with NaN models (train) or NaN evaluations (test)."""
  tree = dict(getattr(data, part))
  x = np.array(tree[leaf])
  x[1, 0] = value
  x[4, -1] = value
  tree[leaf] = jnp.asarray(x)
  bad = data._replace(**{part: tree})
  with pytest.raises(ValueError,
                     match=rf"data\.{part}\['{leaf}'\]. .*clients \[1, 4\]"):
    prfl.train(_local(), jnp.zeros((6, 4)), bad, num_rounds=1, **_KW)


def test_zero_examples_per_client_is_refused(data):
  """Failed before the fix: a ZeroDivisionError from inside JAX's tracing."""
  empty = data._replace(train=jax.tree.map(lambda x: x[:, :0], data.train))
  with pytest.raises(ValueError, match="0 examples per client"):
    prfl.train(_local(), jnp.zeros((6, 4)), empty, num_rounds=1, **_KW)


def test_zero_clients_are_refused():
  """A federation of no clients (leaves [0, ...], clusters []) is refused by
  name on the dense and the cohort path, before anything compiles. Failed
  before the fix: a bare ZeroDivisionError (integer modulo by zero) from
  the NaN check's reshape of the empty leaf; integer data got past it and
  died the same way in the first step. The census survivor train #29 at
  9158dc9 (`train`'s cluster count for no clients `else 1` -> `else 2`) is
  the branch this refusal makes unreachable."""
  none = prfl.data.FederatedData(
      train=(jnp.zeros((0, 5, 4)), jnp.zeros((0, 5))),
      test=(jnp.zeros((0, 5, 4)), jnp.zeros((0, 5))),
      clusters=np.zeros(0, np.int32))
  for alg in (_local(), _cohort()):
    with pytest.raises(ValueError, match="`data` has no clients"):
      prfl.train(alg, jnp.zeros((0, 4)), none, num_rounds=1, **_KW)


def _cohort():
  return prfl.participation.cohort(_local(), cohort_size=2)


def test_cohort_runs_check_the_data_and_the_key(data):
  """The cohort path applies the dense path's checks. Failed before the fix
  (main's cohort path, 91bdebb): NaN in the data ran through."""
  x = np.array(data.train["a"])
  x[1, 0, 0] = np.nan
  bad = data._replace(train=dict(data.train, a=jnp.asarray(x)))
  with pytest.raises(ValueError, match=r"data\.train\['a'\]. .*clients \[1\]"):
    prfl.train(_cohort(), jnp.zeros((6, 4)), bad, num_rounds=1, **_KW)
  with pytest.raises(TypeError, match="`key` must be a PRNG key"):
    prfl.train(_cohort(), jnp.zeros((6, 4)), data, num_rounds=1,
               key=np.arange(2.0), verbose=False)


def test_padding_rows_may_hold_nan(data):
  """Rows past `num_examples` are never read, so NaN there is allowed; NaN in
  a real row is refused. Failed before the fix (91bdebb: no check, the NaN
  row trained); seen to fail when the check ignores the counts."""
  x = np.array(data.train["a"])
  x[:, 3] = np.nan
  counts = jnp.full((6,), 3, jnp.int32)
  padded = data._replace(train=dict(data.train, a=jnp.asarray(x)),
                         num_examples=counts)
  r = prfl.train(_local(), jnp.zeros((6, 4)), padded, num_rounds=2,
                 batch_size=2, **_KW)
  assert np.isfinite(r.state.params).all()
  with pytest.raises(ValueError, match=r"clients \[0, 1, 2, 3, 4, 5\]"):
    prfl.train(_local(), jnp.zeros((6, 4)), padded._replace(
        num_examples=counts.at[:].set(4)), num_rounds=1, **_KW)


def test_padding_rows_of_a_leaf_without_feature_axes_may_hold_nan(data):
  """The padding mask also covers a leaf of one value per example (`y`,
  `[N, M]`): NaN past `num_examples` there is allowed, in a real row it is
  refused. Seen to fail when the mask reaches only leaves of 3 or more axes
  (`np.ndim(leaf) >= 2` -> `> 2`, session 7's mutant #104 of `--preset
  train`)."""
  y = np.array(data.train["y"])
  y[:, 3:] = np.nan
  padded = data._replace(train=dict(data.train, y=jnp.asarray(y)),
                         num_examples=jnp.full((6,), 3, jnp.int32))
  check_examples(padded)
  with pytest.raises(ValueError, match=r"data\.train\['y'\]. .*clients \[0,"):
    check_examples(padded._replace(num_examples=jnp.full((6,), 4, jnp.int32)))


def test_a_leaf_of_one_value_per_client_is_checked_for_nan(data):
  """A test leaf of one value per client (`[N]`) is checked too: NaN for
  client 2 is refused naming it. Seen to fail when leaves of one axis are
  skipped like scalars (`np.ndim(leaf) < 1` -> `<= 1`, mutant #98 of session
  8's whole `--preset train` run)."""
  scale = np.ones(6, np.float32)
  check_examples(data._replace(test=dict(data.test, scale=scale)))
  scale[2] = np.nan
  with pytest.raises(ValueError,
                     match=r"data\.test\['scale'\]. .*clients \[2\]"):
    check_examples(data._replace(test=dict(data.test, scale=scale)))


def test_cohort_resume_is_checked(data):
  """A cohort run's `initial_state` must be a CohortState of this algorithm,
  of the data's clients, with the same Byzantine mask. Failed before the
  fix (91bdebb): a plain LocalState crashed inside the driver with an
  AttributeError ('LocalState' object has no attribute 'clients')."""
  alg = _cohort()
  state = alg.init(jnp.zeros((6, 4)), byzantine=np.arange(6) == 5)
  with pytest.raises(TypeError, match="builds a CohortState"):
    prfl.train(alg, None, data, num_rounds=1,
               initial_state=_local().init(jnp.zeros((6, 4))), **_KW)
  with pytest.raises(ValueError, match="has 4 clients but `data` has 6"):
    prfl.train(alg, None, data, num_rounds=1,
               initial_state=alg.init(jnp.zeros((4, 4))), **_KW)
  adam = prfl.participation.cohort(
      prfl.algorithms.local(prfl.data.regression_loss, optax.adam(1e-2)),
      cohort_size=2)
  with pytest.raises(ValueError, match="another optimizer"):
    prfl.train(adam, None, data, num_rounds=1, initial_state=state, **_KW)
  with pytest.raises(ValueError, match="`byzantine` differs"):
    prfl.train(alg, None, data, num_rounds=1, initial_state=state,
               byzantine=np.arange(6) == 0, **_KW)


def test_cohort_checkpoint_records_the_run(data, tmp_path):
  """A cohort run's checkpoints record its key and batch size, and its
  resume keeps the default chunk length. Failed before the fix: the cohort
  path saved no run record, so a resume with another key went on."""
  alg = _cohort()
  path = str(tmp_path / "ckpt")
  first = prfl.train(alg, jnp.zeros((6, 4)), data, num_rounds=24,
                     batch_size=2, checkpoint_path=path, **_KW)
  state = prfl.checkpoint.restore(path, first.state)
  with pytest.raises(ValueError, match="key"):
    prfl.train(alg, None, data, num_rounds=6, batch_size=2,
               initial_state=state, checkpoint_path=path,
               key=jax.random.key(1), verbose=False)
  resumed = prfl.train(alg, None, data, num_rounds=6, batch_size=2,
                       initial_state=state, checkpoint_path=path, **_KW)
  np.testing.assert_array_equal(resumed.history["eval_round"],
                                [24, 26, 28, 30])


@pytest.mark.parametrize("clusters", [[0, 1, -1, 1], [-2, -1], [0.0, 1.0]])
def test_a_negative_cluster_id_is_refused_whatever_the_largest(clusters):
  """Cluster ids must all be integers >= 0: one -1 beside non-negative ids is
  refused as well as all-negative ids and float ids, and ids from 0 (or none)
  are accepted. Seen to fail when the check reads the largest id
  (`clusters.min() >= 0` -> `clusters.max() >= 0`, session 7's mutant #90 of
  `--preset train`, which `test_train.py` kills but is not among
  `train_checks.py`'s test files) or takes either condition (`integer and
  non-negative` -> `or`, #85: float ids went through)."""
  with pytest.raises(ValueError, match="non-negative integer cluster ids"):
    check_clusters(np.array(clusters))
  check_clusters(np.array([0, 2, 1]))
  check_clusters(np.zeros(0, np.int32))


def test_resume_accepts_the_states_own_byzantine_mask():
  """Passing `byzantine` equal to the resumed state's mask (as bools or 0/1)
  is accepted; another mask, or one of another length, is refused. Seen to
  fail when the length check is inverted (`np.shape(byzantine) !=
  saved.shape` -> `==`, mutant #118 of session 8's whole `--preset train`
  run: every resume that repeated its mask was refused)."""
  alg = _local()
  state = alg.init(jnp.zeros((4, 2)), byzantine=np.arange(4) == 3)
  check_resume(alg, state, np.arange(4) == 3, 4)
  check_resume(alg, state, [0, 0, 0, 1], 4)
  check_resume(alg, state, None, 4)
  for other in (np.arange(4) == 0, np.arange(5) == 3):
    with pytest.raises(ValueError, match="`byzantine` differs"):
      check_resume(alg, state, other, 4)


def test_progress_lines_read_the_clock_and_are_flushed(data, monkeypatch):
  """With a fake clock (1000, 1002, 1006, 1007 s), a 5-round run in chunks
  of 2 records elapsed_s [0, 2, 6, 7] and logs, on stderr, "2.0s elapsed,
  ~3.0s left" (2 s / 2 rounds x 3 left), "6.0s elapsed, ~1.5s left", "7.0s
  elapsed, ~0.0s left", each line with the loss of its chunk's last round
  and flushed at once (a notebook's or a pipe's buffered stderr). Seen to
  fail, with each mutant applied by hand, for train #55 (elapsed starts at
  1.0), #66 (`perf_counter() - start` -> `+`), #68 (`now / done` -> `*`),
  #69 (rounds left `num_rounds - done` -> `+`), #70 (the chunk's last
  metrics `v[-1]` -> `v[-2]`: an IndexError in the 1-round last chunk) and
  #24 (`flush=True` -> False), which session 8's run had counted as killed by
  test_runs_that_differ_in_the_key_share_one_compiled_program, a test that
  failed in the tool's worker with no mutant in."""
  clock = iter([1000.0, 1002.0, 1006.0, 1007.0])
  train_module = sys.modules["prfl_jax.train"]
  monkeypatch.setattr(train_module, "time",
                      types.SimpleNamespace(perf_counter=lambda: next(clock)))

  class Stderr(io.StringIO):
    def __init__(self):
      super().__init__()
      self.flushed = []

    def flush(self):
      self.flushed.append(self.getvalue())

  stderr = Stderr()
  monkeypatch.setattr(sys, "stderr", stderr)
  r = prfl.train(_local(), jnp.zeros((6, 4)), data, num_rounds=5,
                 eval_every=2, key=jax.random.key(0))
  monkeypatch.undo()
  np.testing.assert_array_equal(r.history["elapsed_s"], [0.0, 2.0, 6.0, 7.0])
  lines = stderr.getvalue().splitlines()
  assert len(lines) == 3
  for line, (done, now, left) in zip(lines, ((2, 2.0, 3.0), (4, 6.0, 1.5),
                                             (5, 7.0, 0.0))):
    assert line.startswith(f"[round {done}/5] ")
    assert line.endswith(f" | {now:.1f}s elapsed, ~{left:.1f}s left")
    loss = r.history["train/loss"][done - 1]
    assert f"train/loss={loss:.4g} " in line, (line, loss)
  assert stderr.flushed[:3] == [
      "".join(l + "\n" for l in lines[:k]) for k in (1, 2, 3)]


def test_check_eval_fn_takes_bool_scalars_and_refuses_keys():
  """An evaluation may return booleans (a client's model is right or not):
  {"right": sum(p) > 0} is a dict of scalars; a PRNG key, neither a number
  nor a bool, is refused by name. Seen to fail with train #15 applied by
  hand (`v.dtype != bool` -> `==`: the bool entry refused, the key taken),
  which session 8's run had counted as killed by a test that failed in the
  tool's worker with no mutant in."""
  params, test = jnp.zeros((3, 2)), jnp.zeros((3, 4, 2))
  check_eval_fn(lambda p, t: {"right": jnp.sum(p) > 0,
                              "loss": jnp.sum(t)}, params, test)
  with pytest.raises(TypeError, match="entry 'key'"):
    check_eval_fn(lambda p, t: {"loss": jnp.sum(p),
                                "key": jax.random.key(0)}, params, test)


def test_params_none_without_initial_state_is_refused(data):
  """`params` may be None only when `initial_state` gives them: without
  either, ValueError names `params`. Seen to fail with train #33 applied
  by hand (`params is None and initial_state is not None` -> `or`: None's
  `.params`, an AttributeError), which session 8's run had counted as killed
  by a test that failed in the tool's worker with no mutant in."""
  with pytest.raises(ValueError, match="`params` has no array leaves"):
    prfl.train(_local(), None, data, num_rounds=1, **_KW)


def test_each_evaluation_runs_once(data):
  """A 4-round run in chunks of 2 evaluates at rounds 0, 2 and 4, each
  chunk's evaluation inside the chunk's program and never again after it:
  a callback in `eval_fn` runs 3 times (once per vmapped evaluation; 18
  where vmap would call it per client). Seen to fail (5 calls: every
  chunk's evaluation run a second time, on its own) with train #62 applied
  by hand (`out[2] if len(out) > 2` -> `> 3` in `_loop`), which session 8's
  run had counted as killed by a test that failed in the tool's worker with
  no mutant in; the numbers are the same, the work on the test sets
  doubles."""
  calls = []

  def eval_fn(params, test):
    del test
    jax.debug.callback(lambda: calls.append(1))
    return {"size": jnp.sum(params)}

  r = prfl.train(_local(), jnp.zeros((6, 4)), data, num_rounds=4,
                 eval_every=2, eval_fn=eval_fn, **_KW)
  np.testing.assert_array_equal(r.history["eval_round"], [0, 2, 4])
  assert len(calls) in (3, 3 * 6)
