"""Tests of streamed (host) client data and host-kept client state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import participation

LOSS = prfl.data.regression_loss
COUNTS = np.array([1, 4, 5, 5, 6, 50, 4, 5, 6, 5], np.int64)  # 1 and 10x.


def ragged_federation(counts=COUNTS, dim=3, seed=0):
  """Host data (ragged) and the same clients padded on the device."""
  rng = np.random.default_rng(seed)
  total = int(counts.sum())
  a = rng.normal(size=(total, dim)).astype(np.float32)
  y = rng.normal(size=total).astype(np.float32)
  offsets = np.concatenate([[0], np.cumsum(counts)])
  n, width = len(counts), int(counts.max())
  ragged = prfl.data.Ragged({"a": a, "y": y}, offsets)
  test = prfl.data.Ragged({"a": a, "y": y}, offsets)
  clusters = (np.arange(n) % 2).astype(np.int32)
  host = prfl.data.HostData(ragged, test, clusters)
  dense = {"a": np.zeros((n, width, dim), np.float32),
           "y": np.zeros((n, width), np.float32)}
  for i in range(n):
    rows = slice(offsets[i], offsets[i + 1])
    dense["a"][i, :counts[i]] = a[rows]
    dense["y"][i, :counts[i]] = y[rows]
  mask = np.arange(width)[None, :] < counts[:, None]
  device = prfl.data.FederatedData(dense, prfl.data.Padded(dense, mask),
                                   clusters,
                                   num_examples=counts.astype(np.int32))
  return host, device


def eval_fn(params, test):
  examples, mask = prfl.data.unpad(test)
  err = jnp.square(examples["a"] @ params - examples["y"])
  return {"mse": prfl.data.masked_mean(err, mask)}


def fc():
  return prfl.algorithms.federated_clustering(
      LOSS, optax.sgd(0.05, momentum=0.9), radius=prfl.quantile_radius(0.5),
      num_groups=2)


def run(data, *, rounds=6, eval_every=3, alg=None, **kw):
  alg = alg or participation.cohort(fc(), cohort_size=4, dropout=0.25)
  return prfl.train(alg, jnp.zeros((len(COUNTS), 3)), data,
                    num_rounds=rounds, eval_every=eval_every, batch_size=4,
                    key=jax.random.key(2), eval_fn=eval_fn, verbose=False,
                    **kw)


def assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  np.testing.assert_array_equal(a.history["train/loss"],
                                b.history["train/loss"])


def test_streamed_data_and_host_state_equal_device_runs(tmp_path):
  """Host data, host state (RAM and memory-mapped) and device data agree.

  Seen to fail when `host_batches` draws client c's rows with the key of
  its position in the cohort instead of `fold_in(batch_key, c)`, and when
  `HostState.put` writes the rows back to the cohort's positions.
  """
  host, device = ragged_federation()
  ref = run(device)
  assert_same(run(host), ref)
  assert_same(run(host, state_on_host=True), ref)
  on_disk = run(host, state_on_host=str(tmp_path))
  assert_same(on_disk, ref)
  assert list(tmp_path.iterdir())  # The memory-mapped state files.
  np.testing.assert_allclose(run(host).history["eval/mse"],
                             ref.history["eval/mse"], rtol=1e-6)


def test_ragged_batches_hold_every_real_example_once():
  """The 1-example client's batch is that example and padding; the big
  client's batch is B distinct real examples."""
  host, _ = ragged_federation()
  alg = participation.cohort(fc(), cohort_size=10)
  keys = prfl.participation.run.draw_chunk(alg, jax.random.key(0), 10,
                                           jnp.arange(3))
  batch = prfl.participation.run.host_batches(host, keys, 8)
  assert batch.mask.shape == (3, 10, 8)
  np.testing.assert_array_equal(batch.mask.sum(-1)[0],
                                np.minimum(COUNTS, 8))
  first = batch.examples["y"][0, 0][batch.mask[0, 0]]
  np.testing.assert_array_equal(first, host.train.values["y"][:1])
  big = batch.examples["y"][0, 5]
  assert len(set(big.tolist())) == 8 and set(big.tolist()) <= set(
      host.train.values["y"][COUNTS[:5].sum():COUNTS[:6].sum()].tolist())


@pytest.mark.parametrize("on_host", [False, True])
def test_eval_every_and_resume_change_nothing(tmp_path, on_host):
  """Chunks of 6, 3 + 3, and a checkpointed resume (3 + 3) give the same
  numbers.

  Seen to fail, at the 3 + 3 run and at the resume, when a chunk's cohorts
  are drawn from `fold_in(key, i)` with i the position in the chunk instead
  of the round. Chunks of 3, not 2: the resume's program (static length 3)
  then serves both, one compile fewer.
  """
  host, _ = ragged_federation()
  kw = dict(state_on_host=on_host)
  whole = run(host, eval_every=6, **kw)
  assert_same(run(host, eval_every=3, **kw), whole)
  alg = participation.cohort(fc(), cohort_size=4, dropout=0.25)
  path = tmp_path / "ckpt"
  first = run(host, rounds=3, alg=alg, checkpoint_path=str(path), **kw)
  target = alg.init(jnp.zeros((len(COUNTS), 3)))
  restored = prfl.checkpoint.restore(path, target)
  assert int(restored.round) == 3
  second = run(host, rounds=3, alg=alg, initial_state=restored, **kw)
  for x, y in zip(jax.tree.leaves(second.state), jax.tree.leaves(whole.state)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  np.testing.assert_array_equal(
      np.concatenate([first.history["train/loss"],
                      second.history["train/loss"]]),
      whole.history["train/loss"])


def test_empty_client_is_refused_before_anything_runs():
  counts = COUNTS.copy()
  counts[3] = 0
  host, _ = ragged_federation(counts=np.maximum(counts, 0))
  with pytest.raises(ValueError, match=r"1 empty client\(s\), e.g. \[3\]"):
    run(host)
  with pytest.raises(ValueError, match="empty client"):
    prfl.data.ragged.from_client_ids(np.zeros(4), np.array([0, 0, 2, 2]))
  host, _ = ragged_federation()
  with pytest.raises(ValueError, match="needs a `batch_size`"):
    prfl.train(participation.cohort(fc(), cohort_size=2),
               jnp.zeros((len(COUNTS), 3)), host, num_rounds=1,
               key=jax.random.key(0), verbose=False)
  with pytest.raises(TypeError, match="cohort algorithm"):
    prfl.train(fc(), jnp.zeros((len(COUNTS), 3)), host, num_rounds=1,
               key=jax.random.key(0), batch_size=2, verbose=False)
