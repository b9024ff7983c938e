"""Federated-Clustering's defence against tied Byzantine messages.

`aggregators.cap_duplicates` in front of Threshold-Clustering
(`federated_clustering(..., pre_aggregator=...)`) makes identical messages
count once. The toy: two clusters of 5 benign clients in 16 dimensions with
noisy data (so a near-mean vector is closer to every benign gradient than
the other benign gradients are), 2 Byzantine clients per cluster, radius at
the 25th percentile: 4 tied copies fill a benign client's quantile ball
(Werner et al., 2023, Theorem 1 needs beta_i < delta_i; tied copies make
the ball's Byzantine share beta_i N / (quantile count) instead).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax.algorithms import fc_defence


def _loss(x, batch):
  return 0.5 * jnp.mean(jnp.sum((x[None] - batch) ** 2, -1))


def _federation():
  rng = np.random.default_rng(0)
  d, benign, byzantine = 16, 5, 2
  rows, byz, cluster = [], [], []
  for k, centre in enumerate((1.0, -1.0)):
    for j in range(benign + byzantine):
      rows.append(centre + rng.normal(size=(4, d)))
      byz.append(j >= benign)
      cluster.append(k)
  batch = np.stack(rows).astype(np.float32)
  byz, cluster = np.array(byz), np.array(cluster)
  optima = np.stack([batch[(cluster == k) & ~byz].reshape(-1, d).mean(0)
                     for k in range(2)])
  return jnp.asarray(batch), byz, optima[cluster]


def _benign_error(attack, pre_aggregator, ball_cap=None):
  batch, byz, optima = _federation()
  alg = prfl.algorithms.federated_clustering(
      _loss, optax.sgd(0.5), radius=prfl.quantile_radius(0.25),
      attack=attack, pre_aggregator=pre_aggregator, ball_cap=ball_cap,
      plan=prfl.ExecutionPlan(kernel="gram"))
  state = alg.init(jnp.zeros((len(byz), 16)), byzantine=jnp.asarray(byz))
  step = jax.jit(alg.step)
  for t in range(60):
    state, metrics = step(state, batch, jax.random.key(t))
  err = np.linalg.norm(np.asarray(state.params) - optima, axis=1)[~byz]
  return float(err.mean()), float(metrics["byzantine_in_ball"])


@functools.lru_cache(maxsize=None)
def _clean_error():
  """The attack-free run's `_benign_error`, run once per process (five
  tests compare with it)."""
  return _benign_error(None, None)


@pytest.mark.parametrize("name", ["ipm", "alie", "mimic"])
def test_defence_restores_the_attack_free_error(name):
  """Tied attacks move the benign models without the defence (benign
  error above 1.1x the attack-free one; IPM: 2.4x) and not with it (within
  1.1x). Run without the defence (the first half of this test, and
  `fc_defence.message_fn` skipping the pre-aggregator) it fails."""
  attack = {"ipm": prfl.attacks.ipm(), "alie": prfl.attacks.alie(),
            "mimic": prfl.attacks.mimic()}[name]
  clean, _ = _clean_error()
  attacked, byz_in = _benign_error(attack, None)
  defended, byz_def = _benign_error(attack,
                                    prfl.aggregators.cap_duplicates())
  assert attacked > 1.1 * clean, (attacked, clean)
  assert defended < 1.1 * clean, (defended, clean)
  assert byz_def < byz_in


def test_defence_changes_nothing_without_ties():
  """Honest messages are never tied: the defended run is the plain one."""
  assert _benign_error(None, prfl.aggregators.cap_duplicates()) == (
      _clean_error())


def test_dropped_rows_reach_clustering_as_nan():
  msgs = {"x": jnp.array([[1.0, 2.0], [1.0, 2.0], [3.0, 0.0], [0.0, 0.0]])}
  weights = jnp.array([1.0, 1.0, 1.0, 0.0])
  out = fc_defence.apply_pre_aggregator(prfl.aggregators.cap_duplicates(),
                                        msgs, weights, jax.random.key(0))
  np.testing.assert_array_equal(np.isnan(out["x"][:, 0]),
                                [False, True, False, False])
  np.testing.assert_array_equal(np.asarray(out["x"])[[0, 2]],
                                np.asarray(msgs["x"])[[0, 2]])


def test_the_pre_aggregators_key_is_no_attacks_key():
  """`message_fn` hands the pre-aggregator a key no attack draws from: not
  the message key, nor `fold_in(key, c)` for any c < 4096, which covers the
  jittered wrapper's streams (c = 0, 1) and `split(key, n)[c]` for every
  n > c (the same keys in JAX's partitionable threefry, checked here for
  n = 8: the attacks' per-leaf splits). Seen to fail with the old
  `_PRE_KEY = 1`: the pre-aggregator drew from `fold_in(key, 1)`, the
  stream of `attacks.jittered`'s noise (and the second leaf's key of every
  attack that splits per leaf)."""
  seen = []

  def pre(messages, weights, key):
    seen.append(jax.random.key_data(key))
    return messages, weights
  fn = fc_defence.message_fn(None, pre, jnp.zeros(2, bool), jnp.ones(2))

  @jax.jit
  def keys(key):
    fn({"x": jnp.zeros((2, 1))}, 0, key)
    taken = jax.vmap(lambda c: jax.random.key_data(jax.random.fold_in(
        key, c)))(jnp.arange(4096))
    return (seen[0], taken, jax.random.key_data(jax.random.split(key, 8)),
            jax.random.key_data(key))
  got, taken, split, own = map(np.asarray, keys(jax.random.key(3)))
  np.testing.assert_array_equal(split, taken[:8])
  assert not np.any(np.all(taken == got, axis=1))
  assert not np.array_equal(got, own)


def test_cap_duplicates_keeps_one_row_per_tie_group():
  x = jnp.array([[1.0, 2.0], [3.0, 0.0], [1.0, 2.0], [1.0, 2.0 + 1e-4],
                 [3.0, 0.1], [np.nan, 0.0]])
  _, w = prfl.aggregators.cap_duplicates()({"x": x})
  np.testing.assert_array_equal(w, [1, 1, 0, 0, 1, 0])


def test_bucketing_cannot_precede_threshold_clustering():
  batch, byz, _ = _federation()
  alg = prfl.algorithms.federated_clustering(
      _loss, optax.sgd(0.5), radius=1.0,
      pre_aggregator=prfl.aggregators.bucketing(2),
      plan=prfl.ExecutionPlan(kernel="gram"))
  state = alg.init(jnp.zeros((len(byz), 16)))
  with pytest.raises(ValueError, match="one row per client"):
    alg.step(state, batch, jax.random.key(0))


def test_bad_pre_aggregator_and_ghost_kernel_raise():
  with pytest.raises(TypeError, match="pre_aggregator"):
    prfl.algorithms.federated_clustering(_loss, optax.sgd(0.5), radius=1.0,
                                         pre_aggregator="nnm")
  with pytest.raises(ValueError, match="materialised messages"):
    prfl.algorithms.federated_clustering(
        _loss, optax.sgd(0.5), radius=1.0,
        pre_aggregator=prfl.aggregators.cap_duplicates(),
        plan=prfl.ExecutionPlan(kernel="ghost"))


def test_cap_balls_limits_a_client_to_the_median_count():
  """Sender 3 is in all 4 balls of the present models, senders 0-2 in 2
  (median 2, cap 2): 3 keeps its own ball and one random other; nobody else
  is touched; the absent senders 4-7 are never counted. Seen to fail with
  the median taken over absent senders too (median 1, cap 1)."""
  inside = np.eye(8, dtype=bool)
  inside[:4, :4] = [[1, 1, 0, 1], [1, 1, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1]]
  weights = jnp.array([1.0] * 4 + [0.0] * 4)
  for seed in range(5):
    allowed = np.asarray(fc_defence.cap_balls(jnp.asarray(inside), weights,
                                              1.0, jax.random.key(seed)))
    np.testing.assert_array_equal(allowed[:, :3], np.ones((8, 3), bool))
    assert allowed[3, 3] and allowed[:4, 3].sum() == 2, allowed
  never = np.asarray(fc_defence.cap_balls(jnp.asarray(inside), weights, 2.0,
                                          jax.random.key(0)))
  assert never.all()


def test_cap_balls_never_counts_an_absent_models_ball():
  """Senders 0-3 present, each in its own model's ball only (count 1,
  median 1, cap 1); the absent client 4's model has sender 0 in its ball.
  That ball is not counted, so nobody is over the cap and every message
  may take part everywhere. Seen to fail when only the senders' presence
  is checked (session 14's sampled survivor algorithms #543,
  `present[:, None]` -> `present[None, :]`: sender 0 counts 2 balls and is
  dropped at models 1-4); the existing test's absent models held only
  absent senders."""
  inside = np.eye(5, dtype=bool)
  inside[4, 0] = True
  weights = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])
  cap = jax.jit(fc_defence.cap_balls)
  for seed in range(3):
    allowed = cap(jnp.asarray(inside), weights, 1.0, jax.random.key(seed))
    np.testing.assert_array_equal(allowed, np.ones((5, 5), bool))


def test_cap_balls_never_counts_an_absent_senders_message():
  """Models 0-2 present, each ball holding its own sender; the absent
  client 3's message lies in all three balls. Its balls are not counted
  (count 0; the present senders 1 each, median 1, cap 1), so nobody is
  over the cap and every message may take part everywhere. Seen to fail
  when only the models' presence is checked (session 15's sampled
  survivor algorithms #544, `present[None, :]` -> `present[:, None]`:
  client 3 counts 3 balls and keeps one of models 0-2); the mirror image
  of the test above, whose absent senders were in no present ball."""
  inside = np.eye(4, dtype=bool)
  inside[:3, 3] = True
  weights = jnp.array([1.0, 1.0, 1.0, 0.0])
  cap = jax.jit(fc_defence.cap_balls)
  for seed in range(3):
    allowed = cap(jnp.asarray(inside), weights, 1.0, jax.random.key(seed))
    np.testing.assert_array_equal(allowed, np.ones((4, 4), bool))


def test_cap_balls_caps_at_the_median_of_odd_and_even_counts():
  """The cap is the median count itself, not the smallest or a neighbour:
  three present senders in 1, 3, 3 balls (median 3: nobody over the cap,
  every message allowed everywhere) and four in 1, 1, 3, 3 (median 2:
  senders 2 and 3 keep their own ball and one of their other two; 0 and 1
  are allowed everywhere). Seen to fail with `(num - 2) // 2` for the
  lower middle index (session 15's sampled survivor algorithms #557: the
  same index for an even count; for 1, 3, 3 it reads 1 and 3, median 2),
  with `(num + 1) // 2` (#556 at 9158dc9, sampled later and killed by the
  older tests too: median 3 of 1, 1, 3, 3) and with the smallest count
  (#549, which other tests kill); the tests above had only even counts
  with equal middle values."""
  cap = jax.jit(fc_defence.cap_balls)
  odd = np.array([[1, 1, 1], [0, 1, 1], [0, 1, 1]], bool)  # Models x senders.
  even = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1]],
                  bool)
  for seed in range(3):
    key = jax.random.key(seed)
    allowed = cap(jnp.asarray(odd), jnp.ones(3), 1.0, key)
    np.testing.assert_array_equal(allowed, np.ones((3, 3), bool))
    allowed = np.asarray(cap(jnp.asarray(even), jnp.ones(4), 1.0, key))
    np.testing.assert_array_equal(allowed[:, :2], np.ones((4, 2), bool))
    np.testing.assert_array_equal(allowed[:, 2:].sum(axis=0), [2, 2])
    assert allowed[2, 2] and allowed[3, 3]
    np.testing.assert_array_equal(allowed[:, 2:] & ~even[:, 2:], False)


def test_cap_balls_rounds_a_fractional_cap_up():
  """M = ceil(ball_cap * median) when the product is not a whole number.
  Four present senders in 3, 2, 1, 1 balls (median 1.5, ball_cap 1: M = 2):
  sender 1 (2 balls) is allowed everywhere and sender 0 keeps its own ball
  and one of models 1-2. Three present senders in 3, 1, 1 balls (a fourth
  absent) at ball_cap 1.5 (median 1, M = 2): sender 0 again keeps its own
  ball and one other. Seen to fail with `jnp.floor` (census survivor
  algorithms #562 at 9158dc9: M = 1, sender 0 keeps only its own ball and
  sender 1 loses model 3); the tests above had whole products only (1 x 2,
  1 x 3, 2 x 2)."""
  cap = jax.jit(fc_defence.cap_balls)
  even = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]],
                  bool)  # Models x senders: counts 3, 2, 1, 1.
  odd = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]],
                 bool)  # 3, 1, 1 and client 3 absent (the same program).
  for seed in range(3):
    key = jax.random.key(seed)
    allowed = np.asarray(cap(jnp.asarray(even), jnp.ones(4), 1.0, key))
    np.testing.assert_array_equal(allowed[:, 1:], np.ones((4, 3), bool))
    assert allowed[0, 0] and allowed[1:3, 0].sum() == 1 and not allowed[3, 0]
    allowed = np.asarray(cap(jnp.asarray(odd), jnp.array([1.0, 1, 1, 0]),
                             1.5, key))
    np.testing.assert_array_equal(allowed[:, 1:], np.ones((4, 3), bool))
    assert allowed[0, 0] and allowed[1:3, 0].sum() == 1, allowed


def test_cap_balls_allows_at_least_one_ball():
  """M = max(ceil(ball_cap * median), 1). Counts 3, 1, 1, 1 (median 1,
  ball_cap 1: M = 1): sender 0 keeps only its own ball. Counts 2, 0, 0, 0
  (senders 1-3 in no ball, as a median client under tied IPM copies:
  median 0, so M = 1 even at ball_cap 100): sender 0 again keeps only its
  own ball. Everyone else is allowed everywhere. Seen to fail with the
  floor 2 (census survivor algorithms #564 at 9158dc9: sender 0 keeps a
  second ball); every other test's cap was 2 or more, or nobody was over
  a cap of 1."""
  cap = jax.jit(fc_defence.cap_balls)
  one = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]],
                 bool)  # Models x senders: counts 3, 1, 1, 1.
  none = np.zeros((4, 4), bool)
  none[:2, 0] = True  # Counts 2, 0, 0, 0.
  for inside, ball_cap in ((one, 1.0), (none, 1.0), (none, 100.0)):
    allowed = np.asarray(cap(jnp.asarray(inside), jnp.ones(4), ball_cap,
                             jax.random.key(0)))
    np.testing.assert_array_equal(allowed[:, 0], [True, False, False, False])
    np.testing.assert_array_equal(allowed[:, 1:], np.ones((4, 3), bool))


def test_message_fn_drops_disallowed_rows_even_without_attack_or_pre():
  """The second pass of the ball cap with no attack and no pre-aggregator
  still drops the messages `allowed` excludes at model i (NaN rows: outside
  every ball); with nothing to do at all there is no `message_fn` (None).
  Seen to fail with `allowed is not None` in the early return (census
  survivor algorithms #528 at 9158dc9: None returned for an honest capped
  group, so the cap changed nothing without an attack or pre-aggregator;
  an identity function for an undefended one)."""
  weights, byzantine = jnp.ones(3), jnp.zeros(3, bool)
  assert fc_defence.message_fn(None, None, byzantine, weights) is None
  allowed = jnp.array([[True, False, True], [True, True, True],
                       [False, True, True]])
  fn = fc_defence.message_fn(None, None, byzantine, weights, allowed)
  grads = jnp.arange(6.0).reshape(3, 2)
  for i, want in ((0, [[0, 1], [np.nan, np.nan], [4, 5]]),
                  (1, [[0, 1], [2, 3], [4, 5]]),
                  (2, [[np.nan, np.nan], [2, 3], [4, 5]])):
    np.testing.assert_array_equal(fn(grads, i, jax.random.key(0)), want)


@pytest.mark.parametrize("name", ["jittered_ipm", "spread_edge"])
def test_ball_cap_holds_where_cap_duplicates_does_not(name):
  """Untied attacks (IPM with every row jittered by 1% of its norm; the
  ball-edge attack spread out) get through cap_duplicates (benign error
  above 1.5x the attack-free one: every jittered copy counts) and not
  through the ball cap (within 1.1x: a Byzantine client sent to every model
  joins every ball; the cap lets it into as many balls as a median client).
  Run without the cap (`defended_clustering` returning the first pass) the
  second half fails."""
  attack = {"jittered_ipm": prfl.attacks.jittered(prfl.attacks.ipm()),
            "spread_edge": prfl.attacks.spread_edge(
                prfl.quantile_radius(0.25))}[name]
  dedup = prfl.aggregators.cap_duplicates()
  clean, _ = _clean_error()
  through, _ = _benign_error(attack, dedup)
  capped, byz_in = _benign_error(attack, dedup, ball_cap=1.0)
  assert through > 1.5 * clean, (through, clean)
  assert capped < 1.1 * clean, (capped, clean)
  assert byz_in < 0.1


def test_ball_cap_above_every_count_changes_nothing():
  """Without an attack no client joins 100x the median count: the second
  pass is the first (up to float rounding, the two programs compile
  differently). Under IPM this toy's median client is in no ball at all
  (the tied copies fill them), so even a cap of 100x the median is 1."""
  batch, byz, _ = _federation()
  params = []
  for ball_cap in (None, 100.0):
    alg = prfl.algorithms.federated_clustering(
        _loss, optax.sgd(0.5), radius=prfl.quantile_radius(0.25),
        ball_cap=ball_cap, plan=prfl.ExecutionPlan(kernel="gram"))
    state = alg.init(jnp.zeros((len(byz), 16)), byzantine=jnp.asarray(byz))
    step = jax.jit(alg.step)  # Op by op it took 200 s of a CI run.
    for t in range(20):
      state, _ = step(state, batch, jax.random.key(t))
    params.append(np.asarray(state.params))
  np.testing.assert_allclose(params[1], params[0], atol=1e-5)


@pytest.mark.parametrize("bad", [0.5, float("inf"), True, "1", -1])
def test_bad_ball_cap_raises(bad):
  with pytest.raises(ValueError, match="ball_cap"):
    prfl.algorithms.federated_clustering(_loss, optax.sgd(0.5), radius=1.0,
                                         ball_cap=bad)
