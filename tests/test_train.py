"""Tests of prfl_jax.train and the synthetic federation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl


@pytest.fixture(name="data")
def fixture_data():
  return prfl.data.synthetic_regression(jax.random.key(0), num_clusters=3,
                                        clients_per_cluster=2, dim=4,
                                        num_samples=5)[0]


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


def test_different_seeds_differ_same_seed_repeats(data):
  alg = prfl.algorithms.local(prfl.data.regression_loss, optax.sgd(1e-2))
  run = lambda seed: prfl.train(alg, jnp.zeros((6, 4)), data, num_rounds=5,
                                key=jax.random.key(seed), batch_size=2,
                                verbose=False).state.params
  np.testing.assert_array_equal(run(0), run(0))
  assert not np.array_equal(run(0), run(1))


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
  ckpt = str(tmp_path / "run" / "state.msgpack")
  first = prfl.train(alg, jnp.zeros((6, 4)), data, num_rounds=6,
                     checkpoint_path=ckpt, **kw)
  restored = prfl.checkpoint.restore(ckpt, alg.init(jnp.zeros((6, 4))))
  np.testing.assert_array_equal(restored.params, first.state.params)
  np.testing.assert_array_equal(restored.opt_state[0].trace,
                                first.state.opt_state[0].trace)
  assert int(restored.round) == 6
  resumed = prfl.train(alg, None, data, num_rounds=3, initial_state=restored,
                       **kw)
  np.testing.assert_array_equal(resumed.history["round"], [7, 8, 9])
  np.testing.assert_array_equal(resumed.history["eval_round"], [6, 9])
  assert not list((tmp_path / "run").glob(".tmp-*"))
  with pytest.raises(ValueError, match="does not match"):
    prfl.checkpoint.restore(ckpt, alg.init(jnp.zeros((5, 4))))


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
