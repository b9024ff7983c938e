"""Tests of prfl_jax.train and the synthetic federation."""

import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_synthetic_federation_matches_section_5_1():
  data, x_star = prfl.data.synthetic_regression(
      jax.random.key(1), num_clusters=4, clients_per_cluster=16)
  a, y = np.asarray(data.train["a"]), np.asarray(data.train["y"])
  assert a.shape == (64, 9, 10) and y.shape == (64, 9)
  np.testing.assert_array_equal(data.clusters, np.repeat(np.arange(4), 16))
  np.testing.assert_allclose(
      y, np.einsum("nsd,nd->ns", a, np.asarray(x_star)[data.clusters]),
      rtol=1e-4, atol=1e-4)
  for k in range(4):  # Entries N(k + 1, 1) (clusters are 1-based in §5.1).
    assert abs(a[data.clusters == k].mean() - (k + 1)) < 0.1
  assert prfl.data.regression_loss(x_star[0], jax.tree.map(
      lambda x: x[0], data.train)) < 1e-8
  with pytest.raises(ValueError, match="num_clusters"):
    prfl.data.synthetic_regression(jax.random.key(0), num_clusters=0)


def test_sample_batch_draws_distinct_examples_per_client(data):
  batch = prfl.data.sample_batch(jax.random.key(0), data.train, 3)
  assert batch["a"].shape == (6, 3, 4) and batch["y"].shape == (6, 3)
  for i in range(6):
    rows = {tuple(r) for r in np.asarray(batch["a"][i])}
    assert len(rows) == 3
    for r in rows:
      assert r in {tuple(x) for x in np.asarray(data.train["a"][i])}
  assert prfl.data.sample_batch(jax.random.key(0), data.train, None) is data.train


def test_history_progress_and_per_cluster_eval(data):
  lines = []
  alg = prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))
  byz = jnp.array([False, False, False, True, False, False])
  r = prfl.train(alg, jnp.zeros((6, 4)), data, num_rounds=10,
                 key=jax.random.key(0), batch_size=2,
                 eval_fn=prfl.data.regression_eval, eval_every=4,
                 byzantine=byz, log=lines.append)
  h = r.history
  np.testing.assert_array_equal(h["round"], np.arange(1, 11))
  assert h["train/loss"].shape == (10,)
  np.testing.assert_array_equal(h["eval_round"], [0, 4, 8, 10])
  assert h["eval/error/per_cluster"].shape == (4, 3)
  assert h["elapsed_s"].shape == (4,)
  assert len(lines) == 3 and lines[-1].startswith("[round 10/10]")
  assert "left" in lines[0] and "eval/error=" in lines[0]
  # Means leave the Byzantine client out; per-cluster means too.
  err = np.linalg.norm(np.asarray(r.state.params) - np.asarray(
      data.test["x_star"]), axis=1)
  np.testing.assert_allclose(h["eval/error"][-1], err[~np.asarray(byz)].mean(),
                             rtol=1e-5)
  np.testing.assert_allclose(h["eval/error/per_cluster"][-1],
                             [err[:2].mean(), err[2], err[4:].mean()],
                             rtol=1e-5)


def _local_run(data, seed):
  """A short run with an evaluation: every test that calls it compiles the
  same programs (tests/conftest.py's persistent cache)."""
  alg = prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))
  return prfl.train(alg, jnp.zeros((6, 4)), data, num_rounds=5,
                    key=jax.random.key(seed), batch_size=2,
                    eval_fn=prfl.data.regression_eval, verbose=False)


def test_different_seeds_differ_same_seed_repeats(data):
  run = lambda seed: _local_run(data, seed).state.params
  np.testing.assert_array_equal(run(0), run(0))
  assert not np.array_equal(run(0), run(1))


def test_runs_that_differ_in_the_key_share_one_compiled_program(data):
  """The key and the true clusters are arguments of `train`'s programs, not
  constants: a run with another seed and another task's clusters of the
  same shapes finds every program in JAX's persistent compilation cache
  (which tests/conftest.py turns on) and compiles nothing.

  Seen to fail (the chunk and the evaluation compiled again) with the key
  and the clusters closed over in `chunk`, as before.
  """
  assert jax.config.jax_compilation_cache_dir, "tests/conftest.py sets it"
  clusters = np.asarray(data.clusters)
  first = _local_run(data, 0)
  misses = []
  listener = lambda event, **kw: misses.append(event) if event == (
      "/jax/compilation_cache/cache_misses") else None
  jax.monitoring.register_event_listener(listener)
  try:
    second = _local_run(data._replace(clusters=clusters[::-1]), 1)
  finally:
    jax.monitoring.unregister_event_listener(listener)
  assert not misses
  assert not np.array_equal(first.state.params, second.state.params)
  np.testing.assert_array_equal(  # Its own clusters, not the first run's.
      second.history["eval/error/per_cluster"][0][::-1],
      first.history["eval/error/per_cluster"][0])


def test_bad_arguments_raise_before_compiling(data):
  alg = prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))
  kw = dict(num_rounds=5, key=jax.random.key(0), verbose=False)
  with pytest.raises(ValueError, match="num_rounds"):
    prfl.train(alg, jnp.zeros((6, 4)), data, **{**kw, "num_rounds": 0})
  with pytest.raises(ValueError, match="batch_size"):
    prfl.train(alg, jnp.zeros((6, 4)), data, batch_size=6, **kw)
  with pytest.raises(ValueError, match="params"):
    prfl.train(alg, jnp.zeros((5, 4)), data, **kw)
  with pytest.raises(ValueError, match="eval_every"):
    prfl.train(alg, jnp.zeros((6, 4)), data, eval_every=0, **kw)
  with pytest.raises(TypeError, match="data"):
    prfl.train(alg, jnp.zeros((6, 4)), {"x": 1}, **kw)
  with pytest.raises(ValueError, match="inconsistent"):
    prfl.train(alg, jnp.zeros((6, 4)),
               data._replace(clusters=data.clusters[:5]), **kw)
  with pytest.raises(TypeError, match="algorithm"):
    prfl.train(lambda: None, jnp.zeros((6, 4)), data, **kw)


def test_assumption_constants_match_numpy():
  rng = np.random.default_rng(0)
  c = rng.normal(size=(5, 1, 3)).astype(np.float32)
  x = rng.normal(size=(5, 3)).astype(np.float32)
  clusters = np.array([0, 0, 1, 1, 1])
  # f_j(x) = 0.5 * ||s_j * x - c_j||^2 with per-client scale s_j.
  s = np.array([1.0, 2.0, 1.0, 0.5, 3.0], np.float32)
  loss = lambda p, b: 0.5 * jnp.sum((b[0, 0] * p - b[0, 1:]) ** 2)
  batch = jnp.asarray(np.concatenate([s[:, None, None], c], -1))
  out = prfl.diagnostics.assumption_constants(loss, jnp.asarray(x), batch,
                                              jnp.asarray(clusters))
  grad = lambda j, p: s[j] * (s[j] * p - c[j, 0])
  for i in range(5):
    g = np.array([grad(j, x[i]) for j in range(5)])
    mean = g[clusters == clusters[i]].mean(0)
    ratio = np.sum((g[i] - mean) ** 2) / np.sum(mean ** 2)
    inter = min(np.sum((g[i] - g[j]) ** 2) for j in range(5)
                if clusters[j] != clusters[i])
    np.testing.assert_allclose(out["intra_ratio"][i], ratio, rtol=1e-4)
    np.testing.assert_allclose(out["inter_sq_dist"][i], inter, rtol=1e-4)


def test_checkpoint_resume_continues_the_same_run(data, tmp_path):
  alg = prfl.algorithms.federated_clustering(
      prfl.data.regression_loss, optax.sgd(1e-2, momentum=0.9),
      radius=prfl.quantile_radius(0.5))
  kw = dict(key=jax.random.key(0), eval_every=3, verbose=False,
            eval_fn=prfl.data.regression_eval)
  ckpt = str(tmp_path / "run")
  first = prfl.train(alg, jnp.zeros((6, 4)), data, num_rounds=6,
                     checkpoint_path=ckpt, **kw)
  assert prfl.checkpoint.rounds(ckpt) == [3, 6]
  restored = prfl.checkpoint.restore(ckpt, alg.init(jnp.zeros((6, 4))))
  np.testing.assert_array_equal(restored.params, first.state.params)
  np.testing.assert_array_equal(restored.opt_state[0].trace,
                                first.state.opt_state[0].trace)
  assert int(restored.round) == 6
  resumed = prfl.train(alg, None, data, num_rounds=3, initial_state=restored,
                       checkpoint_path=ckpt, **kw)
  np.testing.assert_array_equal(resumed.history["round"], [7, 8, 9])
  np.testing.assert_array_equal(resumed.history["eval_round"], [6, 9])
  assert prfl.checkpoint.rounds(ckpt) == [6, 9]
  with pytest.raises(ValueError, match="does not match"):
    prfl.checkpoint.restore(ckpt, alg.init(jnp.zeros((5, 4))))


def _assert_same_run(a, b):
  """Bit for bit on CPU. GPU scatter-adds (segment sums) use atomics, so their
  float sums may differ in the last bits between two runs of one program
  unless XLA_FLAGS=--xla_gpu_deterministic_ops=true; the replayed random
  streams this guards against move results by ~0.15."""
  def check(x, y):
    x, y = np.asarray(x), np.asarray(y)
    if jax.default_backend() == "cpu" or not np.issubdtype(x.dtype,
                                                           np.inexact):
      np.testing.assert_array_equal(x, y)
    else:
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  jax.tree.map(check, a, b)


# Federated-Clustering with mini-batches, 2 random groups and a Gaussian attack:
# every source of randomness a round has.
def _resume_setup():
  data = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                        clients_per_cluster=4, dim=3,
                                        num_samples=6)[0]
  alg = prfl.algorithms.federated_clustering(
      prfl.data.regression_loss, optax.sgd(1e-2, momentum=0.9),
      radius=prfl.quantile_radius(0.5), num_groups=2,
      attack=prfl.attacks.gaussian(1.0))
  byz = np.arange(8) == 7
  kw = dict(key=jax.random.key(3), batch_size=2, verbose=False,
            eval_fn=prfl.data.regression_eval)
  return alg, jnp.zeros((8, 3)), data, byz, kw


_KILLED_RUN = """
import os, signal, sys
import jax.numpy as jnp
import prfl_jax as prfl
from tests.test_train import _resume_setup

def die(line):  # Called after each chunk's checkpoint: the first one kills.
  print(line, flush=True)
  os.kill(os.getpid(), signal.SIGKILL)

alg, params, data, byz, kw = _resume_setup()
prfl.train(alg, params, data, num_rounds=9, eval_every=3, byzantine=byz,
           checkpoint_path=sys.argv[1], log=die, **{**kw, "verbose": True})
print("NOT KILLED")
"""


def test_resume_after_kill_equals_uninterrupted_run_bit_for_bit(tmp_path):
  """A run SIGKILLed after its round-3 checkpoint, restored and resumed for 6
  rounds (in chunks of 2, not 3), ends exactly where the uninterrupted 9-round
  run ends.

  Failed before the fix: chunk keys were `split(key, num_chunks)[c]`, and with
  partitionable threefry `split(k, 2)[0] == split(k, 3)[0]`, so the resumed
  run replayed the mini-batches, groups and attack noise of rounds 1-3
  (mutation check: restoring that scheme fails here, and so does
  `fold_in(key, round_index - first_round)`).
  """
  ckpt = tmp_path / "run"
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep +
             os.environ.get("PYTHONPATH", ""),
             XLA_PYTHON_CLIENT_PREALLOCATE="false")  # Shares a GPU if any.
  proc = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(ckpt)],
                        env=env, cwd=REPO, capture_output=True, text=True,
                        timeout=240)
  assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
  assert "[round 3/9]" in proc.stdout and "NOT KILLED" not in proc.stdout
  assert prfl.checkpoint.rounds(ckpt) == [3]

  alg, params, data, byz, kw = _resume_setup()
  whole = prfl.train(alg, params, data, num_rounds=9, eval_every=3,
                     byzantine=byz, **kw)
  restored = prfl.checkpoint.restore(ckpt, alg.init(params, byzantine=byz))
  assert int(restored.round) == 3
  resumed = prfl.train(alg, None, data, num_rounds=6, eval_every=2,
                       byzantine=byz, initial_state=restored,
                       checkpoint_path=str(ckpt), **kw)
  _assert_same_run(resumed.state, whole.state)
  _assert_same_run(resumed.history["train/loss"],
                   whole.history["train/loss"][3:])
  assert not np.array_equal(whole.state.params, params)


def test_eval_every_does_not_change_the_results():
  """`eval_every` 2 and 3 (chunks 2+2+2 vs 3+3) give the same final state.

  Failed before the fix: each chunk's key came from `split(key, num_chunks)`,
  so the chunking decided every round's randomness.
  """
  alg, params, data, byz, kw = _resume_setup()
  runs = [prfl.train(alg, params, data, num_rounds=6, eval_every=e,
                     byzantine=byz, **kw) for e in (2, 3)]
  _assert_same_run(runs[0].state, runs[1].state)
  _assert_same_run(runs[0].history["train/loss"],
                   runs[1].history["train/loss"])


def test_byzantine_mask_must_repeat_the_resumed_states(data):
  """Failed before the fix: `byzantine` was silently ignored with
  `initial_state`. The mask is part of the state, so a resumed run may only
  repeat it (the natural "same command, plus the restored state")."""
  alg = prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))
  byz = np.array([False, False, False, True, False, False])
  state = alg.init(jnp.zeros((6, 4)), byzantine=byz)
  kw = dict(num_rounds=2, key=jax.random.key(0), verbose=False)
  with pytest.raises(ValueError, match="`byzantine` differs from"):
    prfl.train(alg, None, data, initial_state=state, byzantine=~byz, **kw)
  with pytest.raises(ValueError, match="`byzantine` differs from"):
    prfl.train(alg, None, data, initial_state=state, byzantine=byz[:5], **kw)
  out = prfl.train(alg, None, data, initial_state=state, byzantine=byz, **kw)
  np.testing.assert_array_equal(out.state.byzantine, byz)


@pytest.mark.parametrize("eval_fn, message", [
    (lambda p, t: jnp.sum(p), "got ArrayImpl|got ShapeDtypeStruct"),
    (lambda p, t: [jnp.sum(p)], "got list"),
    (lambda p, t: {"err": p}, "entry 'err'"),
    (lambda p, t: {1: jnp.sum(p)}, "entry 1"),
])
def test_eval_fn_must_return_a_dict_of_scalars(data, eval_fn, message):
  """Failed before the fix: a non-dict result gave a tracer AttributeError
  from inside the compiled chunk; a vector value broke the summary."""
  alg = prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))
  with pytest.raises(TypeError, match=message):
    prfl.train(alg, jnp.zeros((6, 4)), data, num_rounds=2,
               key=jax.random.key(0), eval_fn=eval_fn, verbose=False)


def test_cluster_without_benign_clients_reports_nan(data):
  """Cluster ids {0, 2, 3} (1 unused) and cluster 3 all Byzantine: both report
  NaN, the others their benign means. Failed before the fix: empty clusters
  reported error 0.0, indistinguishable from a perfect cluster."""
  alg = prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))
  clusters = jnp.array([0, 0, 2, 2, 3, 3])
  byz = np.array([False, False, False, False, True, True])
  r = prfl.train(alg, jnp.zeros((6, 4)), data._replace(clusters=clusters),
                 num_rounds=2, key=jax.random.key(0), byzantine=byz,
                 eval_fn=prfl.data.regression_eval, verbose=False)
  per = r.history["eval/error/per_cluster"][-1]
  assert per.shape == (4,)
  assert np.isnan(per[1]) and np.isnan(per[3])
  err = np.linalg.norm(np.asarray(r.state.params) -
                       np.asarray(data.test["x_star"]), axis=1)
  np.testing.assert_allclose(per[[0, 2]], [err[:2].mean(), err[2:4].mean()],
                             rtol=1e-5)
  with pytest.raises(ValueError, match="non-negative integer cluster ids"):
    prfl.train(alg, jnp.zeros((6, 4)),
               data._replace(clusters=jnp.array([0, 0, 1, 1, -1, 1])),
               num_rounds=2, key=jax.random.key(0), verbose=False)


def test_checkpoint_path_is_checked_before_the_first_round(data, tmp_path):
  """Failed before the fix: an unwritable `checkpoint_path` failed after the
  first chunk, naming a temp file. Runs as root ignore permission bits, so
  the path lies under a regular file."""
  local = prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))
  rounds_run = []

  def step(state, batch, key):
    jax.debug.callback(lambda: rounds_run.append(1))
    return local.step(state, batch, key)

  alg = local._replace(step=step)
  blocker = tmp_path / "file"
  blocker.write_text("x")
  kw = dict(num_rounds=2, key=jax.random.key(0), verbose=False)
  with pytest.raises(OSError, match=f"'{blocker / 'ckpt'}' is not writable"):
    prfl.train(alg, jnp.zeros((6, 4)), data,
               checkpoint_path=str(blocker / "ckpt"), **kw)
  assert not rounds_run  # Not a single round ran.
  ckpt = str(tmp_path / "ckpt")
  prfl.train(alg, jnp.zeros((6, 4)), data, checkpoint_path=ckpt, **kw)
  assert len(rounds_run) == 2
  with pytest.raises(ValueError,
                     match=r"already holds checkpoints of rounds \[1, 2\]"):
    prfl.train(alg, jnp.zeros((6, 4)), data, checkpoint_path=ckpt, **kw)


def test_donation_keeps_the_callers_arrays_and_the_numbers(data):
  """`donate=True` (the default) writes each chunk's state over the previous
  one, but the arrays the caller passed in (`params`, `initial_state`) stay
  valid, and the run equals `donate=False` bit for bit.

  Mutation seen to fail: dropping `train`'s copy of the initial state before
  the first donated chunk (the caller's `params` / `initial_state` arrays
  are then deleted by XLA).
  """
  alg = prfl.algorithms.federated_clustering(
      prfl.data.regression_loss, optax.sgd(1e-2, momentum=0.9),
      radius=prfl.quantile_radius(0.5))
  kw = dict(num_rounds=4, key=jax.random.key(3), batch_size=3, eval_every=2,
            eval_fn=prfl.data.regression_eval, verbose=False)
  params = jnp.full((6, 4), 0.5)
  donated = prfl.train(alg, params, data, donate=True, **kw)
  assert not params.is_deleted()
  np.testing.assert_array_equal(params, 0.5)
  plain = prfl.train(alg, params, data, donate=False, **kw)
  np.testing.assert_array_equal(donated.state.params, plain.state.params)
  for name, value in plain.history.items():
    if name != "elapsed_s":
      np.testing.assert_array_equal(donated.history[name], value)
  start = donated.state
  resumed = prfl.train(alg, None, data, initial_state=start, donate=True,
                       **kw)
  assert not any(x.is_deleted() for x in jax.tree.leaves(start)
                 if isinstance(x, jax.Array))
  resumed_plain = prfl.train(alg, None, data, initial_state=start,
                             donate=False, **kw)
  np.testing.assert_array_equal(resumed.state.params,
                                resumed_plain.state.params)
  assert not np.array_equal(resumed.state.params, start.params)
