"""Tests of natural client partitions and the FEMNIST (LEAF JSON) loader."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl


def writers_dataset(num_writers=7, seed=0):
  """Generated examples with writer ids of very different sizes."""
  rng = np.random.default_rng(seed)
  sizes = rng.integers(2, 30, num_writers)
  sizes[0] = 2
  ids = np.repeat(np.arange(num_writers) * 10, sizes)  # Ids 0, 10, 20, ...
  rng.shuffle(ids)
  x = rng.normal(size=(len(ids), 4)).astype(np.float32)
  y = (ids // 10 % 3).astype(np.int32)
  return x, y, ids, sizes


def test_natural_id_partition_gives_one_client_per_id():
  """Seen to fail when the partition groups by position instead of id."""
  _, _, ids, sizes = writers_dataset()
  values, parts = prfl.data.natural_id_partition(ids)
  np.testing.assert_array_equal(values, np.arange(7) * 10)
  np.testing.assert_array_equal([len(p) for p in parts], sizes)
  for v, p in zip(values, parts):
    assert (ids[p] == v).all()
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)),
                                np.arange(len(ids)))


def test_natural_federation_trains_with_cohorts():
  x, y, ids, sizes = writers_dataset()
  fed = prfl.data.natural_federation((x, y), ids, test_fraction=0.25,
                                     num_classes=3, seed=1)
  train, test = fed.data.train, fed.data.test
  np.testing.assert_array_equal(train.counts + test.counts, sizes)
  assert (test.counts >= 1).all() and (train.counts >= 1).all()
  for i in range(7):  # Every client holds only its writer's examples.
    rows = slice(train.offsets[i], train.offsets[i + 1])
    assert (train.values[1][rows] == fed.client_ids[i] // 10 % 3).all()
  loss = prfl.models.classifier_loss(lambda p, v: v @ p)
  alg = prfl.participation.cohort(
      prfl.algorithms.fedavg(loss, optax.sgd(0.5)), cohort_size=3)
  r = prfl.train(alg, prfl.participation.Replicated(jnp.zeros((4, 3)), 7),
                 fed.data, num_rounds=4, batch_size=4, key=jax.random.key(0),
                 eval_fn=prfl.models.classifier_eval(lambda p, v: v @ p),
                 verbose=False)
  assert np.isfinite(r.history["train/loss"]).all()
  assert 0 <= r.history["eval/accuracy"][-1] <= 1


def _leaf_json(path, users, rng):
  blob = {"users": [], "num_samples": [], "user_data": {}}
  for user, n in users:
    blob["users"].append(user)
    blob["num_samples"].append(n)
    blob["user_data"][user] = {
        "x": rng.uniform(size=(n, 784)).round(3).tolist(),
        "y": rng.integers(0, 62, n).tolist()}
  path.write_text(json.dumps(blob))


def test_femnist_reads_leaf_json_files(tmp_path):
  """LEAF's train/test JSONs become one ragged client per writer."""
  rng = np.random.default_rng(0)
  (tmp_path / "train").mkdir()
  (tmp_path / "test").mkdir()
  _leaf_json(tmp_path / "train" / "all_0.json",
             [("f0001_12", 5), ("f0002_40", 1), ("f0003_07", 9)], rng)
  _leaf_json(tmp_path / "test" / "all_0.json",
             [("f0001_12", 2), ("f0002_40", 1), ("f0003_07", 3)], rng)
  fed = prfl.data.load_femnist(str(tmp_path))
  assert fed.num_classes == 62
  np.testing.assert_array_equal(fed.client_ids,
                                ["f0001_12", "f0002_40", "f0003_07"])
  np.testing.assert_array_equal(fed.data.train.counts, [5, 1, 9])
  np.testing.assert_array_equal(fed.data.test.counts, [2, 1, 3])
  assert fed.data.train.values[0].shape == (15, 28, 28, 1)
  pooled = prfl.data.load_femnist(str(tmp_path), test_fraction=0.5,
                                  max_clients=2)
  np.testing.assert_array_equal(pooled.data.train.counts +
                                pooled.data.test.counts, [7, 2])
  with pytest.raises(FileNotFoundError, match="LEAF"):
    prfl.data.load_femnist(str(tmp_path / "train" / "nothing"))
