"""Tests of Federated-Clustering (Algorithm 1)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax.algorithms.federated_clustering import random_groups
from tests import reference

ETA = 0.1


def plan(chunk_size=1, kernel="auto"):
  """The execution-plan keyword of a factory (one place to rename)."""
  return {"plan": prfl.ExecutionPlan(chunk_size, kernel)}


def example1_loss(x, batch):
  """Section 2, Example 1: f1, f2, f3 selected by the client index."""
  c = batch[0]
  f1 = x ** 2 / (6 * ETA)
  f2 = jnp.where(x < 1, 4 * (x - 1) ** 3 + 3 * (x - 1) ** 4 + 1,
                 (x - 1) ** 2 / (2 * ETA) + 1)
  f3 = (x - 2) ** 2 / (2 * ETA)
  return jnp.select([c == 0, c == 1, c == 2], [f1, f2, f3])


def example2_loss(x, batch):
  """Section 2, Example 2: f1 = (x + 0.5)^2, f2 = (x - 0.5)^2."""
  return (x + jnp.where(batch[0] == 0, 0.5, -0.5)) ** 2


def shifted_quadratic(x, batch):
  """f_j(x) = 0.5 * ||x - c_j||^2, gradient x - c_j."""
  return 0.5 * jnp.sum((x - batch[0]) ** 2)


def _run(alg, params, batch, rounds, seed=0):
  state = alg.init(params)
  step = jax.jit(alg.step)
  for t in range(rounds):
    state, metrics = step(state, batch, jax.random.key(seed + t))
  return state, metrics


def test_example1_ends_at_optima():
  alg = prfl.algorithms.federated_clustering(
      example1_loss, optax.sgd(ETA), radius=0.5 / ETA, num_iters=10)
  state, _ = _run(alg, jnp.full((3,), 1.5), jnp.arange(3).reshape(3, 1), 100)
  np.testing.assert_allclose(state.params, [0.0, 0.0, 2.0], atol=1e-4)


def test_example1_first_round_by_hand():
  # Round 1 at x = 1.5: gradients 1/(2 eta), 1/(2 eta), -1/(2 eta) = 5, 5, -5
  # at every model. Clients 1, 2: points at distance 0, 0, 10 from their own
  # gradient, radius 5 -> centre stays 5 -> x = 1.5 - 0.1 * 5 = 1.
  # Client 3: only itself inside -> centre -5 -> x = 2.
  alg = prfl.algorithms.federated_clustering(
      example1_loss, optax.sgd(ETA), radius=0.5 / ETA, num_iters=10)
  state, _ = _run(alg, jnp.full((3,), 1.5), jnp.arange(3).reshape(3, 1), 1)
  np.testing.assert_allclose(state.params, [1.0, 1.0, 2.0], atol=1e-6)
  # Round 2, client 2 at x = 1 (Section 3.1.3): g1(1) = 1/(3 eta), g2(1) = 0,
  # g3(1) = -1/eta; client 1 is within 5 of 0, so client 2 leaves the saddle.
  state, _ = _run(alg, jnp.full((3,), 1.5), jnp.arange(3).reshape(3, 1), 2)
  assert state.params[1] < 1.0


def test_example2_separates_clients():
  alg = prfl.algorithms.federated_clustering(
      example2_loss, optax.sgd(0.1), radius=0.5, num_iters=10)
  state, _ = _run(alg, jnp.zeros(2), jnp.arange(2).reshape(2, 1), 150)
  np.testing.assert_allclose(state.params, [-0.5, 0.5], atol=1e-4)


def _np_fc_round(x, c, lr, radius, num_iters, weights=None):
  """One FC round with the NumPy reference of Algorithm 2 (shifted quadratic)."""
  new = x.copy()
  for i in range(x.shape[0]):
    grads = x[i][None] - c  # [N, P]: g_j(x_i)
    v = reference.threshold_clustering(grads, grads[i][None], radius,
                                       num_iters, weights=weights)[0]
    new[i] = x[i] - lr * v
  return new


def test_one_round_by_hand():
  # Gradients at x = 0 are -c_j = 0, -1, -10; radius 2, one clustering step:
  # client 1: {0, -1} inside -> v = (0 - 1 + 0) / 3 = -1/3 -> x = 1/3
  # client 2: {0, -1} inside -> v = (0 - 1 - 1) / 3 = -2/3 -> x = 2/3
  # client 3: alone -> v = -10 -> x = 10.
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(1.0), radius=2.0, num_iters=1)
  c = jnp.array([[0.0], [1.0], [10.0]])
  state, metrics = _run(alg, jnp.zeros((3, 1)), c[:, None], 1)
  np.testing.assert_allclose(state.params[:, 0], [1 / 3, 2 / 3, 10.0],
                             rtol=1e-6)
  np.testing.assert_allclose(metrics["ball_fraction"], (2 + 2 + 1) / 9,
                             rtol=1e-6)


@pytest.mark.parametrize("radius", [1.5, "quantile"])
@pytest.mark.parametrize("plan", [
    prfl.ExecutionPlan(chunk_size=None, kernel="gram"),
    prfl.ExecutionPlan(chunk_size=2, kernel="direct"),
    prfl.ExecutionPlan(chunk_size=3, kernel="gram"),
    prfl.ExecutionPlan()])  # No dense layer: falls back to the Gram kernel.
@pytest.mark.filterwarnings("ignore:prfl_jax. found no dense")
def test_rounds_match_numpy(radius, plan):
  rng = np.random.default_rng(0)
  c = rng.normal(size=(7, 3)).astype(np.float32) * 2
  x = rng.normal(size=(7, 3)).astype(np.float32)
  rule = prfl.quantile_radius(0.4) if radius == "quantile" else radius
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.3), radius=rule, num_iters=4,
      plan=plan)
  state, _ = _run(alg, jnp.asarray(x), jnp.asarray(c)[:, None], 3)
  ref = x.astype(np.float64)
  for _ in range(3):
    if radius == "quantile":
      ref = _np_fc_round_q(ref, c, 0.3, 0.4, 4)
    else:
      ref = _np_fc_round(ref, c, 0.3, radius, 4)
  np.testing.assert_allclose(state.params, ref, rtol=1e-4, atol=1e-4)


def _np_fc_round_q(x, c, lr, q, num_iters):
  new = x.copy()
  for i in range(x.shape[0]):
    grads = x[i][None] - c
    v = reference.threshold_clustering(grads, grads[i][None], None, num_iters,
                                       quantile=q)[0]
    new[i] = x[i] - lr * v
  return new


def test_random_groups_partition_and_padding():
  groups = random_groups(jax.random.key(3), 7, 3)
  assert groups.index.shape == (3, 3)
  real = np.asarray(groups.index)[np.asarray(groups.weight) > 0]
  np.testing.assert_array_equal(np.sort(real), np.arange(7))
  assert float(jnp.sum(groups.weight)) == 7
  flat = np.asarray(groups.index).ravel()
  np.testing.assert_array_equal(flat[np.asarray(groups.slot)], np.arange(7))


def test_groups_cluster_within_group_with_padding():
  # With an infinite radius every client's centre is the mean gradient of the
  # real members of its group; padding clients must not count.
  n, g = 7, 3
  rng = np.random.default_rng(1)
  c = rng.normal(size=(n, 2)).astype(np.float32)
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(1.0), radius=np.inf, num_iters=3,
      num_groups=g)
  key = jax.random.key(11)
  state = alg.init(jnp.zeros((n, 2)))
  state, _ = jax.jit(alg.step)(state, jnp.asarray(c)[:, None], key)
  groups = random_groups(jax.random.split(key)[0], n, g)
  expected = np.zeros((n, 2))
  for row, w in zip(np.asarray(groups.index), np.asarray(groups.weight)):
    members = row[w > 0]
    expected[members] = c[members].mean(0)  # x = 0 - 1 * mean(0 - c_j).
  np.testing.assert_allclose(state.params, expected, rtol=1e-5, atol=1e-6)


def test_local_steps_alternate_with_clustering():
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.1), radius=1.0, local_steps=2)
  state = alg.init(jnp.zeros((4, 2)))
  batch = jnp.arange(8.0).reshape(4, 1, 2)
  flags, step = [], jax.jit(alg.step)
  for t in range(6):
    state, m = step(state, batch, jax.random.key(t))
    flags.append(float(m["clustered"]))
  assert flags == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
  # A local round is a plain gradient step.
  local = prfl.algorithms.local(shifted_quadratic, optax.sgd(0.1))
  s1 = alg.init(jnp.ones((4, 2)))._replace(round=jnp.array(1, jnp.int32))
  s1, _ = step(s1, batch, jax.random.key(0))
  s2, _ = jax.jit(local.step)(local.init(jnp.ones((4, 2))), batch,
                              jax.random.key(0))
  np.testing.assert_allclose(s1.params, s2.params)


def _byzantine_federation():
  """Two clusters of 4 clients; clients 3 and 7 are Byzantine.

  Targets (f_j(x) = 0.5 ||x - c_j||^2): cluster A = clients 0-3 near 0,
  cluster B = clients 4-7 near 5 (+0.01 noise). The Byzantine clients' honest
  targets sit 0.4 off their cluster (first coordinate), so had they been
  honest (the attack switched off) they would sit inside the balls and pull
  their cluster's models by 0.1.
  """
  rng = np.random.default_rng(2)
  c = np.concatenate([np.zeros((4, 2)), np.full((4, 2), 5.0)])
  c += 0.01 * rng.normal(size=(8, 2))
  c[[3, 7], 0] += 0.4
  byz = np.zeros(8, bool)
  byz[[3, 7]] = True
  return c.astype(np.float32), byz


def _fixed_point(c, kind):
  """Hand-derived end point of every benign model (rows 0-2, 4-6).

  With radius 1, FC's estimate at x_i converges to the mean of the messages
  inside x_i's ball, so x_i stops where those messages sum to 0:
  * "benign": no Byzantine message gets into a ball -> the benign mean of the
    client's cluster.
  * "bit_flip": the Byzantine member's negated gradient c_b - x stays in its
    own cluster's ball: sum_benign (x - c_j) + (c_b - x) = 0.
  * "ipm": both messages -0.1 * (x - mean of the 6 benign targets) stay in
    every ball: sum_benign (x - c_j) - 0.2 (x - c_mean) = 0.
  * "mimic": both copy client 0's message x - c_0, inside A's balls only.
  """
  c = c.astype(np.float64)
  out = np.zeros((8, 2))
  for members, bad in (([0, 1, 2], 3), ([4, 5, 6], 7)):
    s = c[members].sum(0)
    if kind == "benign":
      x = s / 3
    elif kind == "bit_flip":
      x = (s - c[bad]) / 2
    elif kind == "ipm":
      x = (s - 0.2 * c[[0, 1, 2, 4, 5, 6]].mean(0)) / 2.8
    elif kind == "mimic":
      x = (s + 2 * c[0]) / 5 if bad == 3 else s / 3
    out[members] = x
  return out


# attack, hand-derived end point, share of Byzantine messages inside a benign
# client's ball (a benign mean over clients of #Byzantine inside / 8).
BYZANTINE_CASES = {
    "nan": (prfl.attacks.non_finite(float("nan")), "benign", 0.0),
    "inf": (prfl.attacks.non_finite(float("inf")), "benign", 0.0),
    "large": (prfl.attacks.large(1e6), "benign", 0.0),
    "gaussian": (prfl.attacks.gaussian(1e3), "benign", 0.0),
    "alie": (prfl.attacks.alie(), "benign", 0.0),
    "bit_flip": (prfl.attacks.bit_flip(), "bit_flip", 1 / 8),
    "ipm": (prfl.attacks.ipm(), "ipm", 2 / 8),
    "mimic": (prfl.attacks.mimic(), "mimic", (3 * 2 / 8) / 6),
}


@pytest.mark.parametrize("name", list(BYZANTINE_CASES))
def test_byzantine_attack_cannot_pull_benign_models(name):
  """Benign models end at the hand-derived point the attack allows.

  For the attacks whose messages stay out of every ball (NaN, Inf, large,
  Gaussian, ALIE) that is the cluster's benign optimum and no Byzantine
  message is ever inside a benign ball; bit-flip, IPM and mimic messages get
  in and move the models by at most 0.25 (see `_fixed_point`).

  Mutations seen to fail every case: the radius forced to infinity in
  `clustering._inside` (plain averaging: all models go to ~2.5), and the
  attack switched off (`attack=None` in `federated_clustering`'s
  `clustered_update` call: the honest Byzantine clients pull by 0.1 and are
  inside the balls).
  """
  attack, kind, byz_share = BYZANTINE_CASES[name]
  c, byz = _byzantine_federation()
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.5), radius=1.0, attack=attack)
  state = alg.init(jnp.zeros((8, 2)), byzantine=jnp.asarray(byz))
  step = jax.jit(alg.step)
  in_ball = []
  for t in range(40):
    state, metrics = step(state, jnp.asarray(c)[:, None], jax.random.key(t))
    in_ball.append(float(metrics["byzantine_in_ball"]))
  benign = ~byz
  np.testing.assert_allclose(np.asarray(state.params)[benign],
                             _fixed_point(c, kind)[benign], atol=2e-3)
  if byz_share == 0.0:
    assert max(in_ball) == 0.0
  np.testing.assert_allclose(in_ball[-1], byz_share, rtol=1e-6)
  np.testing.assert_allclose(
      float(metrics["loss"]),
      np.mean(0.5 * np.sum((_fixed_point(c, kind) - c)[benign] ** 2, 1)),
      rtol=0.05, atol=1e-5)


def test_large_gradient_attack_never_enters_the_ball():
  c = np.array([[0.0], [0.1], [0.2], [5.0], [5.1], [5.2]], np.float32)
  byz = jnp.array([False, False, True, False, False, True])
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.5), radius=1.0,
      attack=prfl.attacks.large(1e4))
  state = alg.init(jnp.zeros((6, 1)), byzantine=byz)
  for t in range(60):
    state, metrics = jax.jit(alg.step)(state, jnp.asarray(c)[:, None],
                                       jax.random.key(t))
  assert float(metrics["byzantine_in_ball"]) == 0.0
  np.testing.assert_allclose(state.params[:2, 0], 0.05, atol=1e-3)
  np.testing.assert_allclose(state.params[3:5, 0], 5.05, atol=1e-3)


def test_same_seed_same_numbers_and_one_trace():
  data, _ = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                           clients_per_cluster=3)
  traced_loss = chex.assert_max_traces(prfl.data.regression_loss, n=8)
  alg = prfl.algorithms.federated_clustering(
      traced_loss, optax.sgd(1e-3), radius=prfl.quantile_radius(0.3),
      num_groups=2)
  step = chex.assert_max_traces(alg.step, n=1)
  alg = alg._replace(step=step)
  kw = dict(num_rounds=12, key=jax.random.key(5), batch_size=5,
            eval_fn=prfl.data.regression_eval, eval_every=4, verbose=False)
  r1 = prfl.train(alg, jnp.zeros((6, 10)), data, **kw)
  chex.clear_trace_counter()
  r2 = prfl.train(alg, jnp.zeros((6, 10)), data, **kw)
  np.testing.assert_array_equal(r1.state.params, r2.state.params)
  np.testing.assert_array_equal(r1.history["eval/error"],
                                r2.history["eval/error"])


def test_bad_arguments():
  loss = shifted_quadratic
  with pytest.raises(ValueError, match="num_iters"):
    prfl.algorithms.federated_clustering(loss, optax.sgd(1.0), radius=1.0,
                                         num_iters=0)
  with pytest.raises(ValueError, match="num_groups"):
    prfl.algorithms.federated_clustering(
        loss, optax.sgd(1.0), radius=1.0, num_groups=5).init(jnp.zeros((4, 2)))
  with pytest.raises(ValueError, match="local_steps"):
    prfl.algorithms.federated_clustering(loss, optax.sgd(1.0), radius=1.0,
                                         local_steps=-1)
  with pytest.raises(TypeError, match="optimizer"):
    prfl.algorithms.federated_clustering(loss, 0.1, radius=1.0)
  with pytest.raises(ValueError, match="radius"):
    prfl.algorithms.federated_clustering(loss, optax.sgd(1.0), radius=-2.0)
  with pytest.raises(ValueError, match="byzantine"):
    prfl.algorithms.federated_clustering(
        loss, optax.sgd(1.0), radius=1.0).init(jnp.zeros((4, 2)),
                                               byzantine=jnp.zeros(3, bool))
  alg = prfl.algorithms.federated_clustering(
      lambda x, b: x - b[0], optax.sgd(1.0), radius=1.0)
  with pytest.raises(TypeError, match="loss_fn"):
    alg.step(alg.init(jnp.zeros((4, 2))), jnp.zeros((4, 1, 2)),
             jax.random.key(0))
  with pytest.raises(ValueError, match="leading axes must match"):
    alg.step(alg.init(jnp.zeros((4, 2))), jnp.zeros((3, 1, 2)),
             jax.random.key(0))


def _np_group_round(x, c, byz, index, weight, lr, radius, q, num_iters):
  """One FC round with groups, in NumPy: per group, per member, Algorithm 2
  on the members' gradients `x_i - c_j` from `x_i - c_i`.

  Returns:
    `(new x, metrics)` with the metrics FC reports (benign means).
  """
  n = x.shape[0]
  new = x.copy()
  loss, norm, upd, ball, byz_in = (np.zeros(n) for _ in range(5))
  for row, w in zip(index, weight):
    members = row[w > 0]
    for pos, i in enumerate(members):
      grads = x[i][None] - c[members]
      v, inside, _ = reference.threshold_clustering_info(
          grads, grads[pos][None], radius, num_iters, quantile=q)
      new[i] = x[i] - lr * v[0]
      loss[i] = 0.5 * np.sum((x[i] - c[i]) ** 2)
      norm[i] = np.linalg.norm(x[i] - c[i])
      upd[i] = np.linalg.norm(v[0])
      ball[i] = inside[0].sum() / len(members)
      byz_in[i] = (inside[0] & byz[members]).sum() / len(members)
  ok = ~byz
  metrics = {"loss": loss[ok].mean(), "grad_norm": norm[ok].mean(),
             "update_norm": upd[ok].mean(), "ball_fraction": ball[ok].mean(),
             "byzantine_in_ball": byz_in[ok].mean()}
  return new, metrics


def _group_problem(n=7, p=3, seed=4):
  rng = np.random.default_rng(seed)
  c = (2 * rng.normal(size=(n, p))).astype(np.float32)
  x = rng.normal(size=(n, p)).astype(np.float32)
  byz = np.zeros(n, bool)
  byz[[1, 5]] = True  # Honest (no attack), but left out of the metrics.
  return c, x, byz


GROUP_PLANS = [(None, "gram"), (None, "direct"), (1, "gram"), (2, "direct")]


@pytest.mark.parametrize("radius", [4.0, "quantile"])
@pytest.mark.parametrize("chunk, kernel", GROUP_PLANS)
def test_groups_match_numpy_under_every_plan(chunk, kernel, radius):
  """FC with 3 groups (N = 7: slots 3 + 3 + 3, two of them padding) equals a
  NumPy loop over groups and members, params and every metric, under the
  full vmap (`chunk_size=None`) and chunked plans.

  The quantile q = 0.7 on groups of 3 puts the rank at 1.4 (2.1 with the
  wrong `q * count`), so the ball holds 2 of 3 gradients (all 3 with the
  wrong rank formula).
  Mutations seen to fail: group results written back in reverse group order
  (full vmap: `groups.index[::-1].ravel()`; chunked: rows reversed in the
  scan's `put`); stats left in slot order (`_to_client_order` without
  `[groups.slot]`); `group_of = groups.slot % S`; the group size counting
  padding (`gsize = slot_w.shape[1]`); the quantile's `q * count`.
  """
  c, x, byz = _group_problem()
  q = 0.7 if radius == "quantile" else None
  rule = prfl.quantile_radius(q) if q is not None else radius
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.3), radius=rule, num_iters=4,
      num_groups=3, **plan(chunk, kernel))
  state = alg.init(jnp.asarray(x), byzantine=jnp.asarray(byz))
  step = jax.jit(alg.step)
  ref = x.astype(np.float64)
  seen = []
  for t in range(2):
    key = jax.random.key(t)
    state, metrics = step(state, jnp.asarray(c)[:, None], key)
    groups = random_groups(jax.random.split(key)[0], 7, 3)
    ref, ref_metrics = _np_group_round(
        ref, c.astype(np.float64), byz, np.asarray(groups.index),
        np.asarray(groups.weight), 0.3, radius if q is None else None, q, 4)
    np.testing.assert_allclose(state.params, ref, rtol=1e-4, atol=1e-5)
    for name, value in ref_metrics.items():
      np.testing.assert_allclose(metrics[name], value, rtol=1e-4, atol=1e-6,
                                 err_msg=name)
    seen.append(ref_metrics)
  # The balls must be neither everything nor only the owner, and hold a
  # Byzantine (honest here) client at least once.
  assert all(1 / 3 < m["ball_fraction"] < 1.0 for m in seen)
  assert max(m["byzantine_in_ball"] for m in seen) > 0


def test_full_vmap_groups_equal_chunked_groups():
  """`chunk_size=None` and chunked plans give the same round with groups
  (a 2-layer MLP, several leaves, 4 groups of N = 10 with padding).

  Mutation seen to fail: the full vmap writing its rows back in reverse group
  order (`groups.index[::-1].ravel()`).
  """
  n, b, din, dh, dout = 10, 3, 4, 5, 3

  def loss(p, batch):
    xb, yb = batch
    logits = jnp.tanh(xb @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) *
                             jax.nn.one_hot(yb, dout), -1))

  rng = np.random.default_rng(7)
  f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
  params = {"w1": f32(n, din, dh), "b1": f32(n, dh), "w2": f32(n, dh, dout),
            "b2": f32(n, dout)}
  batch = (f32(n, b, din), rng.integers(0, dout, (n, b)).astype(np.int32))
  out = []
  for chunk in (None, 1, 3):
    alg = prfl.algorithms.federated_clustering(
        loss, optax.sgd(0.5), radius=prfl.quantile_radius(0.5), num_iters=3,
        num_groups=4, **plan(chunk, "gram"))
    state = alg.init(params)
    step = jax.jit(alg.step)
    for t in range(2):
      state, metrics = step(state, batch, jax.random.key(t))
    out.append((state.params, metrics))
  for params_c, metrics_c in out[1:]:
    jax.tree.map(lambda a, r: np.testing.assert_allclose(
        a, r, rtol=1e-5, atol=1e-6), params_c, out[0][0])
    for name in metrics_c:
      np.testing.assert_allclose(metrics_c[name], out[0][1][name], rtol=1e-5)


@pytest.mark.parametrize("chunk", [None, 1])
def test_local_steps_with_groups_match_numpy(chunk):
  """`local_steps=1` with 2 groups: rounds 0 and 2 cluster within the round's
  groups, rounds 1 and 3 take a plain local step, as in a NumPy loop.

  Mutations seen to fail: the full-vmap / chunked write-back in reverse
  group order; local rounds stepping with the group slot's gradient instead
  of the client's own (`gbatch` taken at `jnp.roll(index, 1)`).
  """
  c, x, byz = _group_problem(n=6, p=2, seed=5)
  byz[:] = False
  alg = prfl.algorithms.federated_clustering(
      shifted_quadratic, optax.sgd(0.4), radius=2.0, num_iters=3,
      num_groups=2, local_steps=1, **plan(chunk, "gram"))
  state = alg.init(jnp.asarray(x))
  step = jax.jit(alg.step)
  ref = x.astype(np.float64)
  for t in range(4):
    key = jax.random.key(20 + t)
    state, metrics = step(state, jnp.asarray(c)[:, None], key)
    if t % 2 == 0:
      groups = random_groups(jax.random.split(key)[0], 6, 2)
      ref, _ = _np_group_round(ref, c.astype(np.float64), byz,
                               np.asarray(groups.index),
                               np.asarray(groups.weight), 0.4, 2.0, None, 3)
    else:
      ref = ref - 0.4 * (ref - c)
    assert float(metrics["clustered"]) == float(t % 2 == 0)
    np.testing.assert_allclose(state.params, ref, rtol=1e-4, atol=1e-5)


def test_one_group_keeps_the_client_order():
  """`num_groups=1` is the identity partition (no shuffle), as documented.

  Mutation seen to fail: `num_groups == 1` -> `!= 1` in `random_groups`.
  """
  groups = random_groups(jax.random.key(0), 6, 1)
  np.testing.assert_array_equal(groups.index, [np.arange(6)])
  np.testing.assert_array_equal(groups.slot, np.arange(6))
  np.testing.assert_array_equal(groups.weight, np.ones((1, 6)))
