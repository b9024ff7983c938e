"""Tests of the oracle, local and FedAvg baselines on hand-computed rounds."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax.algorithms.fedavg import local_updates


def shifted_quadratic(x, batch):
  """f_j(x) = 0.5 * mean_b ||x - c_b||^2; gradient x - mean_b c_b."""
  return 0.5 * jnp.mean(jnp.sum((x[None] - batch) ** 2, -1))


C = jnp.array([[[0.0]], [[2.0]], [[10.0]], [[20.0]]])


def test_local_is_per_client_sgd():
  alg = prfl.algorithms.local(shifted_quadratic, optax.sgd(0.5))
  state, m = alg.step(alg.init(jnp.zeros((4, 1))), C, jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0], [0, 1, 5, 10])
  np.testing.assert_allclose(m["loss"], np.mean([0, 2, 50, 200]))


def test_oracle_averages_within_true_clusters_over_benign_clients():
  alg = prfl.algorithms.oracle(shifted_quadratic, optax.sgd(0.5),
                               clusters=[0, 0, 1, 1])
  state, _ = alg.step(alg.init(jnp.zeros((4, 1))), C, jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0], [0.5, 0.5, 7.5, 7.5])
  state = alg.init(jnp.zeros((4, 1)), byzantine=jnp.array([0, 0, 0, 1], bool))
  state, _ = alg.step(state, C, jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0], [0.5, 0.5, 5.0, 5.0])
  with pytest.raises(ValueError, match="clusters"):
    prfl.algorithms.oracle(shifted_quadratic, optax.sgd(0.5),
                           clusters=[0, 1]).init(jnp.zeros((4, 1)))


def test_oracle_rejects_a_negative_cluster_id_anywhere():
  """A negative id after a non-negative one is refused too (the check takes
  the smallest id, not the largest: session 11's sampled survivor
  algorithms #111 checked `clusters.max() < 0`)."""
  with pytest.raises(ValueError, match="non-negative"):
    prfl.algorithms.oracle(shifted_quadratic, optax.sgd(0.5),
                           clusters=[0, -1])


def test_oracle_refuses_zero_clients_when_built():
  """An empty `clusters` (no clients) is refused by the factory, before any
  compile, with the argument's name, whatever the empty array's dtype.
  Seen to fail on the code before the check: an empty int array built an
  oracle whose `step` died in a reshape with a bare ZeroDivisionError
  (`integer modulo by zero`), and `[]` (float64) was refused as not an
  integer array."""
  for bad in ([], np.array([], np.int32), np.zeros((0, 3), np.int32)):
    with pytest.raises(ValueError, match="`clusters` is empty"):
      prfl.algorithms.oracle(shifted_quadratic, optax.sgd(0.5), clusters=bad)


def test_oracle_refuses_float_ids_and_a_2d_id_array_each_alone():
  """Either fault alone is refused when the oracle is built: float ids
  [0.0, 1.0] (1-D) and integer ids [[0, 1]] (2-D). Seen to fail with the
  two conditions joined by `and` (session 15's sampled survivor algorithms
  #105: both pass; the float ids even train, as clusters 0 and 1)."""
  for bad in (np.array([0.0, 1.0]), np.array([[0, 1]])):
    with pytest.raises(ValueError, match="1-D integer"):
      prfl.algorithms.oracle(shifted_quadratic, optax.sgd(0.5), clusters=bad)


def test_as_many_clusters_or_groups_as_clients_is_allowed():
  """`num_clusters` / `num_groups` may equal N (every client its own
  cluster); only N + 1 is refused. Seen to fail with `count >= num_clients`
  (census survivor algorithms #15 at 9158dc9: N = 3 of 3 refused, in the
  check and in Myopic-Clustering's and Federated-Clustering's init); no
  test built a run with exactly N."""
  from prfl_jax.algorithms import base
  base.check_at_most_clients(3, "num_clusters", 3)
  with pytest.raises(ValueError, match="`num_clusters`=4 exceeds"):
    base.check_at_most_clients(4, "num_clusters", 3)
  params = jnp.zeros((3, 2))
  state = prfl.algorithms.myopic_clustering(
      shifted_quadratic, optax.sgd(0.5), num_clusters=3,
      radius=1.0).init(params)
  assert state.assignment.shape == (3,)
  state = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.5), radius=1.0,
      num_groups=3).init(params)
  assert int(state.round) == 0
  with pytest.raises(ValueError, match="`num_groups`=4 exceeds"):
    prfl.algorithms.federated_clustering(
        shifted_quadratic, optax.sgd(0.5), radius=1.0,
        num_groups=4).init(params)


def test_fedavg_gradient_averaging():
  alg = prfl.algorithms.fedavg(shifted_quadratic, optax.sgd(0.5))
  state, _ = alg.step(alg.init(jnp.zeros((4, 1))), C, jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0], [4.0] * 4)
  # Under a large-gradient attack the global model is dragged away.
  bad = prfl.algorithms.fedavg(shifted_quadratic, optax.sgd(0.5),
                               attack=prfl.attacks.large(100.0))
  state = bad.init(jnp.zeros((4, 1)), byzantine=jnp.array([0, 0, 0, 1], bool))
  state, _ = bad.step(state, C, jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0],
                             [0.5 * (0 + 2 + 10 + 2000) / 4] * 4)


def test_fedavg_local_steps_average_models():
  # Two local SGD steps (lr 0.5) on micro-batches {c_a}, {c_b} from x = 0:
  # x1 = 0.5 c_a, x2 = x1 - 0.5 (x1 - c_b) = 0.25 c_a + 0.5 c_b.
  batch = jnp.array([[[0.0], [4.0]], [[8.0], [0.0]]])
  alg = prfl.algorithms.fedavg(shifted_quadratic, optax.sgd(0.5),
                               local_steps=2)
  state, _ = alg.step(alg.init(jnp.zeros((2, 1))), batch, jax.random.key(0))
  np.testing.assert_allclose(state.params[:, 0], [(2.0 + 2.0) / 2] * 2)
  with pytest.raises(ValueError, match="divisible"):
    alg.step(alg.init(jnp.zeros((2, 1))), batch[:, :1], jax.random.key(0))


ALL = ["local", "oracle", "fedavg", "fc", "mc", "myopic", "ifca1", "ifca2",
       "hypcluster", "cfl", "ditto", "knn_per"]


def _algorithm(name, data):
  loss, opt = prfl.data.regression_loss, optax.sgd(1e-3)
  key = jax.random.key(3)
  q = prfl.quantile_radius(0.3)
  return {
      "local": lambda: prfl.algorithms.local(loss, opt),
      "oracle": lambda: prfl.algorithms.oracle(loss, opt,
                                               clusters=data.clusters),
      "fedavg": lambda: prfl.algorithms.fedavg(loss, opt),
      "fc": lambda: prfl.algorithms.federated_clustering(loss, opt, radius=q),
      # Seeded at round 2 of the test's 6 (the default warms up for 10).
      "mc": lambda: prfl.algorithms.momentum_clustering(
          loss, opt, num_clusters=2, radius=q, warmup_rounds=2),
      "myopic": lambda: prfl.algorithms.myopic_clustering(
          loss, opt, num_clusters=2, radius=q),
      "ifca1": lambda: prfl.algorithms.ifca(loss, opt, num_clusters=2,
                                            key=key),
      "ifca2": lambda: prfl.algorithms.ifca(
          loss, opt, num_clusters=2, option=2, local_steps=3, key=key),
      "hypcluster": lambda: prfl.algorithms.hypcluster(
          loss, opt, num_clusters=2, local_steps=3, key=key),
      "cfl": lambda: prfl.algorithms.cfl(loss, opt, eps1=1.0, eps2=2.0,
                                         max_clusters=4, local_steps=3),
      "ditto": lambda: prfl.algorithms.ditto(loss, opt, lam=1.0,
                                             local_steps=3),
      "knn_per": lambda: prfl.algorithms.knn_per(loss, opt),
  }[name]()


@pytest.mark.parametrize("name", ALL)
def test_few_rounds_on_synthetic_under_jit(name):
  data, _ = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                           clients_per_cluster=3)
  result = prfl.train(_algorithm(name, data), jnp.zeros((6, 10)), data,
                      num_rounds=6, key=jax.random.key(1),
                      eval_fn=prfl.data.regression_eval, eval_every=3,
                      verbose=False)
  assert result.state.params.shape == (6, 10)
  assert np.all(np.isfinite(result.state.params))
  # `state.round` counts the rounds done (a resumed run starts there): six.
  # Seen to fail for local with `round - 1` (session 15's sampled survivor
  # algorithms #103: -6; nothing else read Local's counter), and for
  # FedAvg and the oracle with `round + 2` (census survivors algorithms #102
  # and #120 at 9158dc9: 12) and with `round - 1` (#101 and #119: -6).
  assert int(result.state.round) == 6
  assert result.history["eval/error"].shape == (3,)
  assert np.all(np.isfinite(result.history["train/loss"]))
  if name in ("local", "oracle", "fedavg", "fc", "mc"):
    # Deterministic starts (IFCA/HypCluster draw random cluster models, and
    # six rounds at lr 1e-3 need not undo that noise).
    assert result.history["eval/error"][-1] < result.history["eval/error"][0]


FACTORIES = {"local": "local", "oracle": "oracle", "fedavg": "fedavg",
             "fc": "federated_clustering", "mc": "momentum_clustering",
             "myopic": "myopic_clustering", "ifca1": "ifca", "ifca2": "ifca",
             "hypcluster": "hypcluster", "cfl": "cfl", "ditto": "ditto",
             "knn_per": "knn_per"}


def test_every_factory_is_covered():
  """ALL (run under `prfl.train` above) names every algorithm factory."""
  exported = {n for n, v in vars(prfl.algorithms).items()
              if callable(v) and n[0].islower() and not n.startswith(
                  "knn_per_")}
  assert exported == set(FACTORIES.values())


@pytest.mark.parametrize("name", ALL)
def test_init_has_the_one_signature(name):
  """`init(params, *, byzantine=None)` for every algorithm (issue 11): IFCA
  and HypCluster take their key or initial models in the factory. Failed
  before for ifca1, ifca2 and hypcluster (`init` also took `init_models` and
  `key`, which `prfl.train` cannot pass)."""
  data, _ = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                           clients_per_cluster=3)
  init = _algorithm(name, data).init
  params = list(inspect.signature(init).parameters.values())
  assert [(p.name, p.kind, p.default) for p in params] == [
      ("params", inspect.Parameter.POSITIONAL_OR_KEYWORD,
       inspect.Parameter.empty),
      ("byzantine", inspect.Parameter.KEYWORD_ONLY, None)]
  state = init(jnp.zeros((6, 10)), byzantine=jnp.array([0, 0, 0, 0, 0, 1],
                                                       bool))
  assert state.params.shape == (6, 10)


@pytest.mark.parametrize("at_once", [1, 3])
def test_fedavg_clients_at_once_trains_the_same_clients(at_once):
  """k clients at a time (`lax.map`, 3 does not divide N = 4) gives the
  `vmap`'s models and losses. Seen to fail when `local_updates` maps the
  params over clients but hands every client the first client's batch."""
  batch = jnp.array([[[0.0], [4.0]], [[8.0], [0.0]], [[1.0], [3.0]],
                     [[5.0], [7.0]]])
  params = jnp.arange(4.0)[:, None]
  runs = []
  for k in (None, at_once):
    alg = prfl.algorithms.fedavg(shifted_quadratic, optax.sgd(0.5),
                                 local_steps=2, clients_at_once=k)
    state = alg.init(params)
    runs.append(jax.jit(alg.step)(state, batch, jax.random.key(0)))
  (want, want_m), (got, got_m) = runs
  np.testing.assert_allclose(got.params, want.params, rtol=1e-6)
  np.testing.assert_allclose(got_m["loss"], want_m["loss"], rtol=1e-6)
  deltas, losses = jax.jit(
      lambda p, b: local_updates(
          shifted_quadratic, optax.sgd(0.5), p, b, 2, at_once))(params, batch)
  # Client j's two steps from x_j: x1 = x_j/2 + c_a/2, x2 = x1/2 + c_b/2.
  x1 = params[:, 0] / 2 + batch[:, 0, 0] / 2
  np.testing.assert_allclose(deltas[:, 0], x1 / 2 + batch[:, 1, 0] / 2
                             - params[:, 0], rtol=1e-6)
  np.testing.assert_allclose(losses, 0.5 * (params[:, 0] - batch[:, 0, 0])**2,
                             rtol=1e-6)


def test_local_updates_default_trains_every_client_in_one_vmap():
  """`clients_at_once=None` is one `vmap` over the clients: its program has
  one loop (the local steps' scan), `1` adds the loop over the clients.
  Seen to fail when the branch is inverted (`clients_at_once is None` ->
  `is not None`, session 7's mutant #78 of `--preset algorithms`: the same
  numbers, but the default trained the clients one after another)."""
  params, batch = jnp.arange(4.0)[:, None], jnp.zeros((4, 2, 1))

  def loops(k):
    return str(jax.make_jaxpr(lambda p, b: local_updates(
        shifted_quadratic, optax.sgd(0.5), p, b, 2, k))(params, batch)
               ).count("scan[")
  assert (loops(None), loops(1)) == (1, 2)


@pytest.mark.parametrize("kwargs", [dict(clients_at_once=0, local_steps=2),
                                    dict(clients_at_once=2.0, local_steps=2),
                                    dict(clients_at_once=2, local_steps=1)])
def test_fedavg_clients_at_once_bad_input(kwargs):
  with pytest.raises(ValueError, match="clients_at_once"):
    prfl.algorithms.fedavg(shifted_quadratic, optax.sgd(0.5), **kwargs)
