"""Tests of prfl_jax.participation: cohorts, dropouts, every algorithm."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import prfl_jax as prfl
from prfl_jax import participation

LOSS = prfl.data.regression_loss
RADIUS = prfl.quantile_radius(0.5)


@pytest.fixture(name="data", scope="module")
def fixture_data():
  return prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                        clients_per_cluster=4, dim=3,
                                        num_samples=6)[0]


def algorithms(clusters):
  sgd = optax.sgd(0.05)
  return {
      "fedavg": prfl.algorithms.fedavg(LOSS, sgd),
      "local": prfl.algorithms.local(LOSS, sgd),
      "oracle": prfl.algorithms.oracle(LOSS, sgd, clusters=clusters),
      "fc": prfl.algorithms.federated_clustering(LOSS, sgd, radius=RADIUS,
                                                 num_groups=2),
      "mc": prfl.algorithms.momentum_clustering(LOSS, sgd, num_clusters=2,
                                                radius=RADIUS),
      "myopic": prfl.algorithms.myopic_clustering(LOSS, sgd, num_clusters=2,
                                                  radius=RADIUS),
      "ifca": prfl.algorithms.ifca(LOSS, sgd, num_clusters=2,
                                   key=jax.random.key(0)),
      "hypcluster": prfl.algorithms.hypcluster(LOSS, sgd, num_clusters=2,
                                               key=jax.random.key(0)),
      "cfl": prfl.algorithms.cfl(LOSS, sgd, eps1=1.0, eps2=0.0,
                                 max_clusters=4),
      "ditto": prfl.algorithms.ditto(LOSS, sgd, lam=1.0),
      "knn_per": prfl.algorithms.knn_per(LOSS, sgd),
  }


def test_uniform_cohorts_pass_a_chi_square_test():
  """Every client is drawn C/N of the rounds; 2000 seeded rounds.

  Seen to fail when Floyd's draw uses `randint(0, high)` (the newest client
  is then only taken on a collision).
  """
  n, c, rounds = 20, 5, 2000
  alg = participation.cohort(prfl.algorithms.local(LOSS, optax.sgd(0.1)),
                             cohort_size=c)
  keys = jax.random.split(jax.random.key(0), rounds)
  index = np.asarray(jax.jit(jax.vmap(lambda k: alg.members(k, n).index))(
      keys))
  assert all(len(set(row)) == c for row in index)
  assert (np.diff(index, axis=1) > 0).all()  # Sorted, distinct.
  counts = np.bincount(index.ravel(), minlength=n)
  assert stats.chisquare(counts).pvalue > 1e-3


def test_weighted_cohorts_follow_the_weights():
  """Weight-0 clients are never drawn; heavier clients more often."""
  n, c = 12, 3
  weights = np.array([0, 1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8], np.float32)
  alg = participation.cohort(prfl.algorithms.local(LOSS, optax.sgd(0.1)),
                             cohort_size=c, weights=weights)
  keys = jax.random.split(jax.random.key(1), 3000)
  index = np.asarray(jax.jit(jax.vmap(lambda k: alg.members(k, n).index))(
      keys))
  counts = np.bincount(index.ravel(), minlength=n)
  assert counts[0] == 0
  groups = [counts[1:4].mean(), counts[4:7].mean(), counts[7:10].mean(),
            counts[10:].mean()]
  assert groups == sorted(groups) and groups[0] < groups[-1] / 2


@pytest.mark.parametrize("name", ["fedavg", "local", "oracle", "fc", "mc",
                                  "myopic", "ifca", "hypcluster", "cfl",
                                  "ditto", "knn_per"])
def test_only_the_arriving_cohort_changes(name, data):
  """Non-participants and dropped clients keep their rows bit for bit.

  Seen to fail when `scatter` rebuilds the rows from zeros
  (`jnp.zeros_like(x).at[index].set(r)`); `members` returning the dropped
  clients too fails the shape check.
  """
  alg = participation.cohort(algorithms(data.clusters)[name], cohort_size=5,
                             dropout=0.4)
  state = alg.init(jnp.arange(24.0).reshape(8, 3) / 10)
  key = jax.random.key(3)
  members = alg.members(key, 8)
  assert members.index.shape == (3,) and members.dropped.shape == (2,)
  assert not set(np.asarray(members.index)) & set(np.asarray(members.dropped))
  batch = jax.tree.map(lambda x: x[members.index], data.train)
  new, metrics = jax.jit(alg.step)(state, batch, key)
  assert np.isfinite(metrics["loss"])
  out = np.setdiff1d(np.arange(8), np.asarray(members.index))
  for old, got in zip(jax.tree.leaves(state.clients),
                      jax.tree.leaves(new.clients)):
    np.testing.assert_array_equal(np.asarray(got)[out], np.asarray(old)[out])
  if "params" in state.clients:
    moved = np.asarray(new.clients["params"] - state.clients["params"])
    assert np.abs(moved[np.asarray(members.index)]).sum() > 0
  assert int(new.round) == 1


@pytest.mark.parametrize("name,exact", [("fedavg", False), ("local", True),
                                        ("oracle", True)])
def test_cohort_of_everyone_is_full_participation(name, exact, data):
  """`cohort_size=N` gives the full-participation run (full batches).

  Per-client models are equal bit for bit. FedAvg keeps one copy of its
  global model in a cohort run, and the metrics' means are fused
  differently, so XLA may round those differently: equal to 1e-6.
  Seen to fail when `scatter` keeps the old rows
  (`x.at[index].set(x[index])`).
  """
  alg = algorithms(data.clusters)[name]
  kw = dict(num_rounds=5, key=jax.random.key(1), eval_every=2,
            eval_fn=prfl.data.regression_eval, verbose=False)
  full = prfl.train(alg, jnp.zeros((8, 3)), data, **kw)
  part = prfl.train(participation.cohort(alg, cohort_size=8),
                    jnp.zeros((8, 3)), data, **kw)
  params = alg_params(part.state, 8)
  check = (np.testing.assert_array_equal if exact else
           lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6,
                                                   atol=1e-7))
  check(params, np.asarray(full.state.params))
  np.testing.assert_allclose(part.history["train/loss"],
                             full.history["train/loss"], rtol=1e-6)
  np.testing.assert_allclose(part.history["eval/error"],
                             full.history["eval/error"], rtol=1e-6)


def alg_params(state, n):
  if "params" in state.clients:
    return np.asarray(state.clients["params"])
  return np.broadcast_to(np.asarray(state.server["params"]),
                         (n,) + np.shape(state.server["params"]))


def test_dropped_messages_never_reach_the_server(data):
  """FedAvg's new global model is the step on the arriving clients only.

  Seen to fail when `step` applies the inner step to the whole drawn cohort.
  """
  inner = prfl.algorithms.fedavg(LOSS, optax.sgd(0.1))
  alg = participation.cohort(inner, cohort_size=6, dropout=0.5)
  state = alg.init(jnp.ones((8, 3)))
  key = jax.random.key(7)
  members = alg.members(key, 8)
  assert members.index.shape == (3,)
  batch = jax.tree.map(lambda x: x[members.index], data.train)
  new, _ = alg.step(state, batch, key)
  want = prfl.tree.take(data.train, members.index)
  grads = jax.vmap(jax.grad(LOSS))(jnp.ones((3, 3)), want)
  np.testing.assert_allclose(new.server["params"],
                             1.0 - 0.1 * grads.mean(0), rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(cohort_size=0), "cohort_size"),
    (dict(cohort_size=2.5), "cohort_size"),
    (dict(cohort_size=True), "cohort_size"),
    (dict(cohort_size=3, dropout=1.0), "dropout"),
    (dict(cohort_size=3, dropout=-0.1), "dropout"),
    (dict(cohort_size=3, dropout="0.1"), "dropout"),
])
def test_bad_cohort_arguments_are_refused_at_once(kwargs, match):
  with pytest.raises(ValueError, match=match):
    participation.cohort(prfl.algorithms.local(LOSS, optax.sgd(0.1)),
                         **kwargs)


def test_cohort_larger_than_the_federation_is_refused_before_compiling(data):
  alg = participation.cohort(prfl.algorithms.local(LOSS, optax.sgd(0.1)),
                             cohort_size=9)
  with pytest.raises(ValueError, match="`cohort_size`=9 exceeds"):
    prfl.train(alg, jnp.zeros((8, 3)), data, num_rounds=2,
               key=jax.random.key(0), verbose=False)
  fc = participation.cohort(algorithms(data.clusters)["fc"], cohort_size=2,
                            dropout=0.5)
  with pytest.raises(ValueError, match="`num_groups`=2 exceeds"):
    prfl.train(fc, jnp.zeros((8, 3)), data, num_rounds=2,
               key=jax.random.key(0), verbose=False)


@pytest.mark.parametrize("name", ["fedavg", "fc", "oracle", "mc"])
def test_replicated_params_give_the_stacked_state(name, data):
  """`Replicated` gives the state of N stacked copies.

  FedAvg, FC and Momentum-Clustering build it from C - D copies; the
  oracle (whose state holds all N true clusters) from N. Seen to fail when
  `init_parts` tiles row 0 of the oracle's clusters to every client.
  """
  alg = participation.cohort(algorithms(data.clusters)[name], cohort_size=4)
  one = jnp.array([1.0, 2.0, 3.0])
  byz = np.arange(8) == 5
  rep = alg.init(participation.Replicated(one, 8), byzantine=byz)
  stacked = alg.init(jnp.tile(one, (8, 1)), byzantine=byz)
  assert jax.tree.structure(rep) == jax.tree.structure(stacked)
  for a, b in zip(jax.tree.leaves(rep), jax.tree.leaves(stacked)):
    np.testing.assert_array_equal(a, b)
