"""`federate`'s defaults and edges, each once left unguarded by every test
(issue 21's mutation audit): the test labels' permutation, the Byzantine
count per cluster and the default train/test split."""

import numpy as np
import pytest

import prfl_jax as prfl
from tests.test_data_partition import ids
from tests.test_data_partition import make_ds


def test_private_label_permutes_the_test_labels_too():
  """Seen to fail when `federate` permutes only the train labels (cluster
  k's test labels kept unshifted: its accuracy is measured on a task it
  never trained on)."""
  ds = make_ds()
  fed = prfl.data.federate(ds, task="private_label", num_clusters=3,
                           clients_per_cluster=2, train_per_client=6,
                           test_per_client=3, seed=2)
  te = ids(fed, lambda i: 0, split="test").astype(int)
  for i in range(6):
    np.testing.assert_array_equal(fed.data.test[1][i],
                                  (ds.labels[te[i]] + i // 2) % 10)


def test_byzantine_count_per_cluster_is_floored():
  """40% of 4 clients is 1.6: one Byzantine client per cluster, never more
  than the fraction asked for. Seen to fail when the count is rounded (2)."""
  fed = prfl.data.federate(make_ds(), task="rotation", num_clusters=2,
                           clients_per_cluster=4, byzantine_fraction=0.4)
  np.testing.assert_array_equal(fed.byzantine, [0, 0, 0, 1, 0, 0, 0, 1])
  assert "1 Byzantine per cluster" in fed.description


def test_default_split_is_80_20_per_client():
  """200 examples over 8 clients (25 each, iid) split 20 / 5 when no sizes
  are given. Seen to fail with the default test fraction 0.25 (19 / 6)."""
  fed = prfl.data.federate(make_ds(), task="none", num_clusters=2,
                           clients_per_cluster=4)
  (_, y), (_, yt) = fed.data.train, fed.data.test
  np.testing.assert_array_equal((y >= 0).sum(1), [20] * 8)
  np.testing.assert_array_equal((yt >= 0).sum(1), [5] * 8)


def test_one_size_given_completes_the_80_20_ratio():
  """Only `test_per_client=3`: 12 train examples per client; only
  `train_per_client=10`: round(10 / 4) = 2 test examples (25 per client
  available, so neither is cut); only `train_per_client=4`: at least 1 test
  example, not 2. Seen to fail with `4 / test_per_client` (no test gave one
  size alone), and with the floor at 2 (`max(1, ...)` -> `max(2, ...)`,
  session 7's mutant #64 of `--preset partitions`)."""
  kw = dict(task="none", num_clusters=2, clients_per_cluster=4)
  fed = prfl.data.federate(make_ds(), test_per_client=3, **kw)
  assert fed.data.train[1].shape == (8, 12) and fed.data.test[1].shape == (8, 3)
  fed = prfl.data.federate(make_ds(), train_per_client=10, **kw)
  assert fed.data.train[1].shape == (8, 10) and fed.data.test[1].shape == (8, 2)
  fed = prfl.data.federate(make_ds(), train_per_client=4, **kw)
  assert fed.data.train[1].shape == (8, 4) and fed.data.test[1].shape == (8, 1)


def test_description_says_padded_when_only_train_or_only_test_is_ragged():
  """100 examples per cluster over 9 clients: 11 or 12 each, split 9-10 /
  2-2 (only the train sets ragged); over 8 clients: 12 or 13, split 10-10 /
  2-3 (only the test sets ragged). Both are padded with label -1, and the
  description says so. Seen to fail when `padded` needs both ragged (`or`
  -> `and`) or reads the train sizes' max instead of their min."""
  for n, train, test in ((9, (9, 10), (2, 2)), (8, (10, 10), (2, 3))):
    fed = prfl.data.federate(make_ds(), task="none", num_clusters=2,
                             clients_per_cluster=n)
    (_, y), (_, yt) = fed.data.train, fed.data.test
    assert ((y >= 0).sum(1).min(), (y >= 0).sum(1).max()) == train
    assert ((yt >= 0).sum(1).min(), (yt >= 0).sum(1).max()) == test
    assert (f"(padded with label -1 to {train[1]} / {test[1]})" in
            fed.description)


def test_description_says_nothing_of_padding_when_no_client_is_short():
  """The default 80/20 split of 25 examples per client (200 over 8 iid
  clients) gives every client 20 / 5: no padding row, and the description
  does not claim one. Seen to fail when `padded` compares the smallest size
  with `<=` (every federation then reads as padded): session 5's sample,
  partitions #110."""
  fed = prfl.data.federate(make_ds(), task="none", num_clusters=2,
                           clients_per_cluster=4)
  assert (fed.data.train[1] >= 0).all() and (fed.data.test[1] >= 0).all()
  assert "padded" not in fed.description
  assert "train 20-20 / test 5-5 examples per client" in fed.description


@pytest.mark.parametrize("bad", [-1, 10])
def test_a_label_out_of_range_on_either_side_is_refused(bad):
  """Labels must lie in [0, num_classes): one label of -1 (all others
  valid) or one of 10 with 10 classes is a ValueError naming `ds.labels`.
  Seen to fail when the check needs both sides out of range (`or` ->
  `and`): session 5's sample, partitions #16."""
  ds = make_ds()
  labels = np.array(ds.labels)
  labels[7] = bad
  with pytest.raises(ValueError, match=r"`ds.labels` must lie in \[0, 10\)"):
    prfl.data.federate(ds._replace(labels=labels), task="none",
                       num_clusters=2, clients_per_cluster=4)


def test_two_examples_per_client_are_enough():
  """200 examples over 2 x 50 clients: 1 train + 1 test each; 51 clients per
  cluster are refused before any work, and a Dirichlet split keeps at least 2
  per client by default. Seen to fail (with `--isolation process`: the
  constant is copied by `from ... import`) when `MIN_CLIENT_EXAMPLES` is 3."""
  fed = prfl.data.federate(make_ds(), task="none", num_clusters=2,
                           clients_per_cluster=50)
  assert fed.data.train[1].shape == (100, 1) == fed.data.test[1].shape
  with pytest.raises(ValueError, match=">= 204 examples"):
    prfl.data.federate(make_ds(), task="none", num_clusters=2,
                       clients_per_cluster=51)
  labels = np.repeat(np.arange(2), 3)
  parts = prfl.data.dirichlet_partition(labels, 3, 1.0, seed=0)
  assert sorted(len(p) for p in parts) == [2, 2, 2]


def test_edges_that_are_allowed_private_label_clusters_and_shards():
  """As many private-label clusters as classes (10 of 10) are allowed, 11
  refused; as many shards as examples (one each) are allowed, one more
  refused. Seen to fail when the checks refuse the edge (`num_clusters > c`
  -> `>=`, `num_shards > len(labels)` -> `>=`)."""
  fed = prfl.data.federate(make_ds(), task="private_label", num_clusters=10,
                           clients_per_cluster=2)
  assert fed.data.train[1].shape[0] == 20
  with pytest.raises(ValueError, match="at most 10 distinct clusters"):
    prfl.data.federate(make_ds(), task="private_label", num_clusters=11,
                       clients_per_cluster=2)
  parts = prfl.data.shard_partition(np.arange(6) % 3, 3, 2)
  assert sorted(len(p) for p in parts) == [2, 2, 2]
  with pytest.raises(ValueError, match="7 examples"):
    prfl.data.shard_partition(np.arange(7) % 3, 4, 2)


def test_a_client_short_of_the_requested_sizes_keeps_their_ratio():
  """Shards of 25 examples per client against 32 + 8 requested: the client
  is cut in the requested 80/20 ratio, 20 / 5. Seen to fail when the ratio
  is taken over `train - test` (17 / 8)."""
  fed = prfl.data.federate(make_ds(), task="none", num_clusters=2,
                           clients_per_cluster=4, partition="shards",
                           shards_per_client=1, train_per_client=32,
                           test_per_client=8)
  (_, y), (_, yt) = fed.data.train, fed.data.test
  np.testing.assert_array_equal((y >= 0).sum(1), [20] * 8)
  np.testing.assert_array_equal((yt >= 0).sum(1), [5] * 8)


def test_exactly_enough_examples_per_client_are_allowed():
  """100 examples per cluster over 4 iid clients (25 each) against 20 + 5
  requested: every example is used, none refused; 21 + 5 is refused. Seen
  to fail when the check refuses the edge (`len(pool) // n < sum(requested)`
  -> `<=`, session 7's mutant #89 of `--preset partitions`)."""
  kw = dict(task="none", num_clusters=2, clients_per_cluster=4,
            test_per_client=5)
  fed = prfl.data.federate(make_ds(), train_per_client=20, **kw)
  assert fed.data.train[1].shape == (8, 20) and fed.data.test[1].shape == (8, 5)
  with pytest.raises(ValueError, match="gives each of its 4 clients 25"):
    prfl.data.federate(make_ds(), train_per_client=21, **kw)


def test_a_cluster_short_of_two_examples_per_client_is_refused():
  """Label blocks, 2 clusters of 8 clients, 200 examples of which only 10
  carry cluster 1's labels (5-9): enough in all (32 needed), but cluster 1
  cannot give its 8 clients 2 examples each. Seen to fail when the
  per-cluster check divides (`n * MIN_CLIENT_EXAMPLES` -> `n /`, session 7's
  mutant #85 of `--preset partitions`)."""
  ds = make_ds()
  labels = np.where(np.arange(200) < 10, 5 + np.arange(200) % 5,
                    np.arange(200) % 5)
  with pytest.raises(ValueError, match="cluster 1 has 10 examples, too few"):
    prfl.data.federate(ds._replace(labels=labels.astype(np.int32)),
                       task="label_blocks", num_clusters=2,
                       clients_per_cluster=8)
