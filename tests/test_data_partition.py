"""Tests of prfl_jax.data.partition and padding-aware batch sampling."""

import jax
import numpy as np
import pytest

import prfl_jax as prfl
from prfl_jax import tree as tree_lib


def make_ds(m=200, num_classes=10, size=4, seed=0):
  """Images whose top-left pixel is the example's id / m (readable back)."""
  rng = np.random.default_rng(seed)
  images = rng.uniform(0.5, 1.0, (m, size, size, 1)).astype(np.float32)
  images[:, 0, 0, 0] = np.arange(m) / m
  labels = np.arange(m) % num_classes
  rng.shuffle(labels)
  return prfl.data.ArrayDataset(images=images, labels=labels.astype(np.int32),
                                num_classes=num_classes, source="test")


def ids(fed, k_of_client, split="train", m=200):
  """[N, M] example ids (-1 for padding), undoing each cluster's rotation."""
  x, y = getattr(fed.data, split)
  out = np.full(y.shape, -1)
  for i in range(len(y)):
    k = k_of_client(i)
    unrotated = prfl.data.rotate(x[i], (4 - k) % 4)
    out[i] = np.where(y[i] >= 0, np.round(unrotated[:, 0, 0, 0] * m), -1)
  return out


def check_cover(parts, m):
  """Disjoint, and every example used exactly once."""
  joined = np.concatenate(parts)
  assert len(joined) == m
  np.testing.assert_array_equal(np.sort(joined), np.arange(m))


def test_iid_partition_is_a_seeded_near_equal_cover():
  labels = np.zeros(103)
  parts = prfl.data.iid_partition(labels, 10, seed=3)
  check_cover(parts, 103)
  assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3
  again = prfl.data.iid_partition(labels, 10, seed=3)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  other = prfl.data.iid_partition(labels, 10, seed=4)
  assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
  with pytest.raises(ValueError, match="`num_clients` \\(104\\) is more"):
    prfl.data.iid_partition(labels, 104)


def mean_top_class_share(labels, parts):
  return np.mean([np.bincount(labels[p], minlength=10).max() / len(p)
                  for p in parts])


def test_dirichlet_skew_grows_as_alpha_shrinks():
  labels = np.repeat(np.arange(10), 100)
  shares = []
  for alpha in (100.0, 1.0, 0.05):
    parts = prfl.data.dirichlet_partition(labels, 10, alpha, seed=0,
                                          min_partition_size=5)
    check_cover(parts, 1000)
    assert min(len(p) for p in parts) >= 5
    shares.append(mean_top_class_share(labels, parts))
  # IID-like (about 0.1 + noise) < moderate < nearly one class per client.
  assert shares[0] < 0.2 < shares[1] < shares[2] and shares[2] > 0.6
  with pytest.raises(ValueError, match="`alpha` must be a finite number > 0"):
    prfl.data.dirichlet_partition(labels, 10, 0.0)
  with pytest.raises(ValueError, match="increase `alpha`"):
    prfl.data.dirichlet_partition(labels, 10, 1e-3, min_partition_size=90,
                                  max_tries=3)


def test_shard_partition_gives_each_client_its_shards_classes():
  labels = np.repeat(np.arange(10), 20)  # 10 shards of one class each... x2.
  parts = prfl.data.shard_partition(labels, 10, 2, seed=1)
  check_cover(parts, 200)
  assert all(len(p) == 20 for p in parts)
  # 20 shards of 10 examples, each within one class: <= 2 classes per client.
  assert all(len(np.unique(labels[p])) <= 2 for p in parts)
  assert np.mean([len(np.unique(labels[p])) for p in parts]) > 1.2
  with pytest.raises(ValueError, match="shards is more than the 200"):
    prfl.data.shard_partition(labels, 101, 2)


def test_rotate_is_np_rot90_k_times_counter_clockwise():
  img = np.array([[1, 2], [3, 4]], np.float32)[None, :, :, None]
  np.testing.assert_array_equal(prfl.data.rotate(img, 1)[0, ..., 0],
                                [[2, 4], [1, 3]])
  x = np.random.default_rng(0).normal(size=(3, 5, 5, 2))
  for k in range(5):
    want = x
    for _ in range(k):
      want = np.stack([np.stack([np.rot90(im[..., c]) for c in range(2)], -1)
                       for im in want])
    np.testing.assert_array_equal(prfl.data.rotate(x, k), want)


def test_private_label_and_label_block_hand_values():
  np.testing.assert_array_equal(
      prfl.data.private_label(np.array([0, 3, 9, -1]), 2, 10), [2, 5, 1, -1])
  np.testing.assert_array_equal(
      prfl.data.label_block(np.arange(10), 5, 10), [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])


def test_rotation_federation_uses_every_example_once_rotated_by_cluster():
  ds = make_ds()
  fed = prfl.data.federate(ds, task="rotation", num_clusters=4,
                           clients_per_cluster=5, seed=1)
  n = 20
  assert fed.data.train[0].shape[0] == n and fed.num_classes == 10
  np.testing.assert_array_equal(fed.data.clusters, np.repeat(np.arange(4), 5))
  cluster = lambda i: i // 5
  tr, te = ids(fed, cluster, "train"), ids(fed, cluster, "test")
  used = np.concatenate([tr[tr >= 0], te[te >= 0]]).astype(int)
  np.testing.assert_array_equal(np.sort(used), np.arange(200))
  for i in range(n):  # Image = rot90^k of the data set's image, labels kept.
    for split, id_ in (("train", tr), ("test", te)):
      x, y = getattr(fed.data, split)
      for j in np.flatnonzero(id_[i] >= 0):
        np.testing.assert_array_equal(
            x[i, j], np.rot90(ds.images[int(id_[i, j])], cluster(i)))
        assert y[i, j] == ds.labels[int(id_[i, j])]
  # 200 / 20 = 10 examples per client: 8 train + 2 test, no padding.
  assert (fed.data.train[1] >= 0).all() and fed.data.train[1].shape == (n, 8)
  assert fed.data.test[1].shape == (n, 2) and not fed.byzantine.any()


def test_private_label_federation_maps_labels_per_cluster():
  ds = make_ds()
  fed = prfl.data.federate(ds, task="private_label", num_clusters=3,
                           clients_per_cluster=4, train_per_client=6,
                           test_per_client=3, seed=2)
  tr = ids(fed, lambda i: 0)  # No rotation to undo.
  assert fed.data.train[1].shape == (12, 6) and fed.data.test[1].shape == (12, 3)
  for i in range(12):
    np.testing.assert_array_equal(
        fed.data.train[1][i], (ds.labels[tr[i].astype(int)] + i // 4) % 10)
  np.testing.assert_array_equal(fed.data.train[0], ds.images[tr.astype(int)])


def test_label_blocks_give_each_cluster_its_own_labels():
  ds = make_ds()
  fed = prfl.data.federate(ds, task="label_blocks", num_clusters=5,
                           clients_per_cluster=2, seed=0)
  for split in ("train", "test"):
    y = getattr(fed.data, split)[1]
    for i in range(10):
      valid = y[i][y[i] >= 0]
      assert set(valid) <= {2 * (i // 2), 2 * (i // 2) + 1}
  tr, te = ids(fed, lambda i: 0), ids(fed, lambda i: 0, "test")
  assert (tr >= 0).sum() + (te >= 0).sum() == 200
  with pytest.raises(ValueError, match="divisible by `num_clusters` \\(3\\)"):
    prfl.data.federate(ds, task="label_blocks", num_clusters=3,
                       clients_per_cluster=2)


def test_unequal_clients_are_padded_with_label_minus_one_never_dropped():
  ds = make_ds(m=400)
  fed = prfl.data.federate(ds, task="none", num_clusters=2,
                           clients_per_cluster=5, partition="dirichlet",
                           alpha=0.3, seed=0)
  (x, y), (xt, yt) = fed.data.train, fed.data.test
  sizes = (y >= 0).sum(1)
  assert sizes.min() < sizes.max() == y.shape[1]  # Really unequal.
  assert (y >= 0).sum() + (yt >= 0).sum() == 400  # Nothing dropped.
  for i in range(10):  # Valid examples first, then padding (zeros, -1).
    assert (y[i, :sizes[i]] >= 0).all() and (y[i, sizes[i]:] == -1).all()
    assert not x[i, sizes[i]:].any()
  assert "padded with label -1" in fed.description


def test_train_and_test_come_from_the_same_client_distribution():
  """Shards of one class each: a client's train and test share <= 2 classes."""
  ds = make_ds()
  fed = prfl.data.federate(ds, task="none", num_clusters=1,
                           clients_per_cluster=10, partition="shards",
                           shards_per_client=2, seed=3)
  (_, y), (_, yt) = fed.data.train, fed.data.test
  for i in range(10):
    assert len(set(y[i]) | set(yt[i])) <= 2


def test_sample_batch_never_draws_padded_examples():
  """`federate` records the padding; batches draw real rows first.

  Seen to fail when `federate` leaves `num_examples` None on padded data, and
  when `batch_rows` drops the real-first reordering.
  """
  ds = make_ds(m=400)
  fed = prfl.data.federate(ds, task="none", num_clusters=2,
                           clients_per_cluster=5, partition="dirichlet",
                           alpha=0.3, seed=0)
  counts = fed.data.num_examples
  np.testing.assert_array_equal(counts, (fed.data.train[1] >= 0).sum(1))
  train = tuple(map(jax.numpy.asarray, fed.data.train))
  b = int(counts.min())
  draw = jax.jit(lambda k: prfl.data.sample_batch(k, train, b, counts))
  for s in range(20):
    batch = draw(jax.random.key(s))
    assert isinstance(batch, prfl.data.Padded)
    assert (np.asarray(batch.examples[1]) >= 0).all()
    assert np.asarray(batch.mask).all()
  # A client with fewer real examples than B gets all of them, then padding.
  big = int(counts.max())
  batch = prfl.data.sample_batch(jax.random.key(0), train, big, counts)
  np.testing.assert_array_equal(np.asarray(batch.mask).sum(1), counts)
  np.testing.assert_array_equal(np.asarray(batch.mask),
                                np.asarray(batch.examples[1]) >= 0)


def test_equal_clients_are_not_padded():
  fed = prfl.data.federate(make_ds(), task="none", num_clusters=2,
                           clients_per_cluster=4, train_per_client=8,
                           test_per_client=2)
  assert fed.data.num_examples is None


def test_sample_batch_is_unchanged_on_unpadded_data():
  """Equal-size data draws exactly the plain permutation's examples."""
  rng = np.random.default_rng(0)
  train = (rng.normal(size=(3, 7, 2)).astype(np.float32),
           rng.integers(0, 5, (3, 7)).astype(np.int32))
  key = jax.random.key(5)
  keys = tree_lib.client_keys(key, 3)
  want = np.stack([np.asarray(jax.random.permutation(k, 7)[:4]) for k in keys])
  _, yb = prfl.data.sample_batch(key, train, 4)
  np.testing.assert_array_equal(
      yb, np.take_along_axis(train[1], want, axis=1))
  full = prfl.data.sample_batch(key, train, 4, np.full(3, 7, np.int32))
  np.testing.assert_array_equal(full.examples[1], yb)
  assert np.asarray(full.mask).all()


def test_byzantine_mask_marks_the_last_clients_of_each_cluster():
  ds = make_ds()
  fed = prfl.data.federate(ds, task="rotation", num_clusters=2,
                           clients_per_cluster=4, byzantine_fraction=0.3)
  np.testing.assert_array_equal(fed.byzantine, [0, 0, 0, 1, 0, 0, 0, 1])
  fed = prfl.data.federate(ds, task="rotation", num_clusters=2,
                           clients_per_cluster=4, byzantine_fraction=0.5)
  np.testing.assert_array_equal(fed.byzantine, [0, 0, 1, 1, 0, 0, 1, 1])
  assert fed.byzantine.dtype == bool


def test_same_seed_same_federation():
  ds = make_ds()
  kw = dict(task="private_label", num_clusters=2, clients_per_cluster=3,
            partition="shards", shards_per_client=2)
  a = prfl.data.federate(ds, seed=7, **kw)
  b = prfl.data.federate(ds, seed=7, **kw)
  c = prfl.data.federate(ds, seed=8, **kw)
  for u, v in zip(jax.tree.leaves(a.data), jax.tree.leaves(b.data)):
    np.testing.assert_array_equal(u, v)
  assert not np.array_equal(a.data.train[1], c.data.train[1])
  assert a.description == b.description


@pytest.mark.parametrize("kwargs, match", [
    (dict(task="flip"), "unknown `task` 'flip'.*label_blocks"),
    (dict(partition="pathological"), "unknown `partition` 'pathological'"),
    (dict(partition="dirichlet"), "needs `alpha`"),
    (dict(partition="dirichlet", alpha=-1.0), "`alpha` must be a finite"),
    (dict(alpha=0.5), "`alpha` is only used by partition='dirichlet'"),
    (dict(partition="shards"), "needs `shards_per_client`"),
    (dict(byzantine_fraction=1.0), "`byzantine_fraction` must be .* \\[0, 1\\)"),
    (dict(byzantine_fraction=-0.1), "`byzantine_fraction`"),
    (dict(clients_per_cluster=30), "200.*use fewer clients"),
    (dict(num_clusters=5), "at most 4 distinct clusters"),
    (dict(clients_per_cluster=0), "`clients_per_cluster` must be an integer"),
    (dict(train_per_client=40, test_per_client=10),
     "fewer than `train_per_client` \\+ `test_per_client`"),
    (dict(test_per_client=0), "`test_per_client` must be an integer >= 1"),
    (dict(seed=-1), "`seed`"),
])
def test_bad_federate_arguments_name_the_argument(kwargs, match):
  args = dict(task="rotation", num_clusters=4, clients_per_cluster=5)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    prfl.data.federate(make_ds(), **args)


def test_federate_rejects_a_non_dataset_and_too_many_private_labels():
  with pytest.raises(TypeError, match="`ds` must be a prfl_jax.data.ArrayDataset"):
    prfl.data.federate((np.zeros((4, 2, 2, 1)), np.zeros(4)), task="none",
                       num_clusters=1, clients_per_cluster=1)
  with pytest.raises(ValueError, match="at most 10 distinct clusters"):
    prfl.data.federate(make_ds(), task="private_label", num_clusters=11,
                       clients_per_cluster=2)


def test_digits_federation_end_to_end():
  ds = prfl.data.load_dataset("digits")
  fed = prfl.data.federate(ds, task="rotation", num_clusters=4,
                           clients_per_cluster=10, byzantine_fraction=0.2)
  (x, y), (xt, yt) = fed.data.train, fed.data.test
  assert x.shape[0] == 40 and x.shape[2:] == (8, 8, 1) and x.dtype == np.float32
  assert (y >= 0).sum() + (yt >= 0).sum() == 1797
  assert prfl.data.check_data(fed.data) == 40 and fed.byzantine.sum() == 8
  assert "scikit-learn" in fed.description
