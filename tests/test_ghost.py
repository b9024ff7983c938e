"""Tests of prfl_jax.ghost: Gram matrices of dense-layer gradients by (*)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import ghost
from prfl_jax import gradients
from prfl_jax import models

N, B = 7, 4


def plan(chunk_size=1, kernel="auto"):
  """The execution-plan keyword of a factory (one place to rename)."""
  return {"schedule": prfl.Schedule(chunk_size, kernel)}

SIZES = (6, 9, 5, 3)  # Three dense layers; only the first sees the data.


def _tapped(params, batch, taps):
  """MLP with a scalar `temp` outside the dense layers (materialised)."""
  x, y = batch
  logits, inputs = models.mlp_apply(
      {k: v for k, v in params.items() if k != "temp"}, x, taps)
  logp = jax.nn.log_softmax(logits * params["temp"])
  return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1)), inputs


def _problem(seed=0, always=True):
  keys = jax.random.split(jax.random.PRNGKey(seed), N)
  params = jax.vmap(lambda k: models.mlp_init(k, SIZES))(keys)
  params["temp"] = jnp.linspace(0.5, 1.5, N)
  rng = np.random.default_rng(seed)
  # Two groups of clients with different label rules.
  x = rng.normal(size=(N, B, SIZES[0])).astype(np.float32)
  y = np.where(np.arange(N)[:, None] < 4, x[..., 0] > 0,
               2 * (x[..., 1] > 0)).astype(np.int32)
  loss = ghost.GhostLoss(_tapped, models.layer_names(3), always=always)
  return loss, params, (jnp.asarray(x), jnp.asarray(y))


def _tree_gram(grads):
  flat = np.concatenate([np.asarray(g, np.float64).reshape(g.shape[0], -1)
                         for g in jax.tree.leaves(grads)], axis=1)
  return flat @ flat.T


def test_one_weight_gram_by_hand():
  """N=2, B=1, scalar layer: <g_j, g_k> = (x_j x_k + 1) r_j r_k."""
  def fn(params, batch, taps):
    x, y = batch
    h = ghost.dense(params["lin"], x, None if taps is None else taps["lin"])
    return 0.5 * jnp.sum(jnp.square(h - y)), {"lin": x}

  loss = ghost.GhostLoss(fn, ("lin",), always=True)
  model = {"lin": {"kernel": jnp.array([[2.0]]), "bias": jnp.array([0.5])}}
  x = jnp.array([[[1.0]], [[-3.0]]])
  y = jnp.array([[[0.0]], [[1.0]]])
  r = np.array([2.0 * 1 + 0.5, 2.0 * -3 + 0.5 - 1])  # Residuals 2.5, -6.5.
  xs = np.array([1.0, -3.0])
  expected = (np.outer(xs, xs) + 1) * np.outer(r, r)
  shared = ghost.shared_inputs(
      loss, jax.tree.map(lambda a: a[None], model), (x, y))
  assert set(shared) == {"lin"}
  out = ghost.ghost_grads(loss, model, (x, y), shared)
  np.testing.assert_allclose(out.gram, expected, rtol=1e-6)
  np.testing.assert_allclose(out.losses, 0.5 * r**2, rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_block_gram_matches_plain(n, monkeypatch):
  """The symmetric split gives the plain block sums, even and odd N."""
  monkeypatch.setattr(ghost, "_MIN_SPLIT_ROWS", 4)
  rng = np.random.default_rng(n)
  a = rng.normal(size=(n * 3, 4))
  d = rng.normal(size=(n * 3, 2))
  ka = a @ a.T + 1
  plain = (ka * (d @ d.T)).reshape(n, 3, n, 3).sum(axis=(1, 3))
  out = ghost._block_gram(jnp.asarray(ka, jnp.float32),
                          jnp.asarray(d, jnp.float32), n)
  np.testing.assert_allclose(out, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("always", [True, False])
def test_ghost_grads_match_materialised(always):
  loss, params, batch = _problem(always=always)
  shared = ghost.shared_inputs(loss, params, batch)
  # Only the first layer's input does not depend on the model.
  chosen = always or ghost.uses_ghost(N, B, SIZES[0], SIZES[1], shared=True)
  assert set(shared) == ({"Dense_0"} if chosen else set())
  for i in (0, 4):
    model = jax.tree.map(lambda a, i=i: a[i], params)
    out = ghost.ghost_grads(loss, model, batch, shared)
    losses, grads = gradients.all_pairs_grads(
        loss, jax.tree.map(lambda a, i=i: a[i:i + 1], params), batch)
    np.testing.assert_allclose(out.gram, _tree_gram(
        jax.tree.map(lambda g: g[0], grads)), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(out.losses, losses[0], rtol=1e-6)
    coefs = jnp.linspace(-1.0, 2.0, N)
    ok = jnp.ones((N,), bool)
    combined = ghost.combine(coefs, out, ok)
    expected = jax.tree.map(lambda g: jnp.tensordot(coefs, g[0], axes=1),
                            grads)
    jax.tree.map(lambda c, e: np.testing.assert_allclose(
        c, e, rtol=2e-5, atol=1e-6), combined, expected)


def test_uses_ghost_counts_flops():
  # MNIST MLP, N = B = 32: the 784 x 200 data layer goes through (*), the
  # 200 x 10 output layer is cheaper materialised.
  assert ghost.uses_ghost(32, 32, 784, 200, shared=True)
  assert not ghost.uses_ghost(32, 32, 200, 10, shared=False)
  # R = 6, N = 2, in = 3, out = 4: (*) costs 36*4 (+ 2*36*3); materialised
  # 2*(6+4)*12 = 240.
  assert ghost.uses_ghost(2, 3, 3, 4, shared=True)  # 144 < 240
  assert not ghost.uses_ghost(2, 3, 3, 4, shared=False)  # 360 > 240


SCHEDULES = [gradients.Schedule(None, "ghost"), gradients.Schedule(1, "ghost"),
             gradients.Schedule(3, "ghost")]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
@pytest.mark.parametrize("case", ["plain", "weights", "nan"])
def test_cluster_at_models_matches_gram_schedule(schedule, case):
  loss, params, (x, y) = _problem(seed=1)
  weights = None
  if case == "weights":
    weights = jnp.array([1.0, 1.0, 0.0, 1.0, 2.0, 1.0, 0.0])
  elif case == "nan":  # Client 5's data make its gradients NaN.
    x = x.at[5, 0, 0].set(jnp.nan)
  run = lambda s: jax.jit(lambda p, b: gradients.cluster_at_models(
      loss, p, b, radius=prfl.quantile_radius(0.5), num_iters=6,
      weights=weights, schedule=s))(params, (x, y))
  out, ref = run(schedule), run(gradients.Schedule(None, "direct"))
  ok = np.ones(N, bool)
  if case == "nan":  # Client 5's own centre is its own NaN gradient.
    ok[5] = False
  jax.tree.map(lambda a, r: np.testing.assert_allclose(
      np.asarray(a)[ok], np.asarray(r)[ok], rtol=1e-4, atol=1e-6),
               out.centers, ref.centers)
  np.testing.assert_allclose(out.own_loss[ok], ref.own_loss[ok], rtol=1e-6)
  np.testing.assert_allclose(out.own_grad_norm[ok], ref.own_grad_norm[ok],
                             rtol=1e-5)
  np.testing.assert_array_equal(out.inside[ok], ref.inside[ok])
  assert 0 < np.sum(ref.inside) < ref.inside.size
  if case == "nan":
    assert not np.any(np.asarray(out.inside)[:, 5])


def test_federated_clustering_ghost_matches_gram():
  loss, params, batch = _problem(seed=2, always=False)
  states = []
  for kernel in ("ghost", "gram"):
    alg = prfl.algorithms.federated_clustering(
        loss, optax.sgd(0.1), radius=prfl.quantile_radius(0.4), num_iters=4,
        num_groups=2, schedule=prfl.Schedule(1, kernel))
    state = alg.init(params)
    step = jax.jit(alg.step)
    for r in range(3):
      state, _ = step(state, batch, jax.random.PRNGKey(r))
    states.append(state)
  jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=1e-4,
                                                       atol=1e-6),
               states[0].params, states[1].params)


def test_errors_name_the_argument():
  loss, params, batch = _problem()
  kw = dict(radius=1.0, num_iters=2, schedule=gradients.Schedule(1, "ghost"))
  with pytest.raises(TypeError, match="`loss_fn` must be a .*GhostLoss"):
    gradients.cluster_at_models(loss.__call__, params, batch, **kw)
  with pytest.raises(ValueError, match="message_fn"):
    gradients.cluster_at_models(loss, params, batch,
                                message_fn=lambda g, i, k: g,
                                key=jax.random.PRNGKey(0), **kw)
  bad = ghost.GhostLoss(loss.fn, ("Dense_0", "missing"))
  with pytest.raises(ValueError, match=r"params\['missing'\]"):
    gradients.cluster_at_models(bad, params, batch, **kw)
  wrong_input = ghost.GhostLoss(
      lambda p, b, t: (loss.fn(p, b, t)[0], {"Dense_0": b[0][:, :2]}),
      ("Dense_0",))
  with pytest.raises(ValueError, match="input of layer 'Dense_0'"):
    gradients.cluster_at_models(wrong_input, params, batch, **kw)
  with pytest.raises(TypeError, match="GhostLoss"):
    prfl.algorithms.federated_clustering(
        loss.__call__, optax.sgd(0.1), radius=1.0,
        schedule=prfl.Schedule(1, "ghost"))
  with pytest.raises(ValueError, match="attack"):
    prfl.algorithms.federated_clustering(
        loss, optax.sgd(0.1), radius=1.0, attack=prfl.attacks.bit_flip(),
        schedule=prfl.Schedule(1, "ghost"))


def test_auto_kernel_picks_ghost_only_where_it_applies():
  loss, params, batch = _problem()
  assert gradients.resolve_kernel("auto", loss) == "ghost"
  assert gradients.resolve_kernel("auto", loss, lambda g, i, k: g) == "gram"
  assert gradients.resolve_kernel("auto", loss.__call__) == "gram"
  assert gradients.resolve_kernel("direct", loss) == "direct"
  assert prfl.Schedule().kernel == "auto"
  # With an attack, the default schedule falls back to the Gram kernel.
  flip = lambda g, i, k: jax.tree.map(lambda a: -a, g)
  out = gradients.cluster_at_models(loss, params, batch, radius=1.0,
                                    num_iters=2, message_fn=flip,
                                    key=jax.random.PRNGKey(0))
  ref = gradients.cluster_at_models(
      loss, params, batch, radius=1.0, num_iters=2, message_fn=flip,
      key=jax.random.PRNGKey(0), schedule=prfl.Schedule(1, "gram"))
  jax.tree.map(np.testing.assert_array_equal, out.centers, ref.centers)


def _median_pair_distance(loss, params, batch):
  """Median over models i and clients j != i of ||g_j(x_i) - g_i(x_i)||."""
  grads = jax.vmap(jax.vmap(jax.grad(loss), (None, 0)), (0, None))(params,
                                                                   batch)
  n = jax.tree.leaves(batch)[0].shape[0]
  flat = np.concatenate([np.asarray(g, np.float64).reshape(n, n, -1)
                         for g in jax.tree.leaves(grads)], axis=2)
  own = flat[np.arange(n), np.arange(n)]
  dist = np.linalg.norm(flat - own[:, None], axis=2)
  return float(np.median(dist[~np.eye(n, dtype=bool)]))


def _fc_rounds(loss, params, batch, radius, chunk, kernel, rounds=2):
  alg = prfl.algorithms.federated_clustering(
      loss, optax.sgd(0.2), radius=radius, num_iters=4,
      **plan(chunk, kernel))
  state = alg.init(params)
  step = jax.jit(alg.step)
  fractions = []
  for r in range(rounds):
    state, metrics = step(state, batch, jax.random.PRNGKey(r))
    fractions.append(float(metrics["ball_fraction"]))
  return state.params, fractions


@pytest.mark.parametrize("chunk", [None, 3])
def test_fixed_radius_ghost_rounds_match_gram(chunk):
  """A fixed radius on the ghost path: FC's rounds equal the Gram kernel's.

  A quantile radius ignores a uniform shift of the distances; a fixed one
  does not. Mutation seen to fail: dropping `+ G_ii` when `ghost.centred`
  centres the Gram matrix (every squared distance shrinks by ||g_i||^2, so
  more clients fall inside the balls).
  """
  loss, params, batch = _problem(seed=3)
  radius = _median_pair_distance(loss, params, batch)
  out, fractions = _fc_rounds(loss, params, batch, radius, chunk, "ghost")
  ref, ref_fractions = _fc_rounds(loss, params, batch, radius, 1, "gram")
  jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=1e-4,
                                                       atol=1e-6), out, ref)
  np.testing.assert_allclose(fractions, ref_fractions, rtol=1e-6)
  assert all(1 / N < f < 1 for f in ref_fractions)  # Balls that decide.


def test_split_block_gram_above_256_rows_with_fixed_radius():
  """N * B = 9 * 32 = 288 rows > `_MIN_SPLIT_ROWS`: the ghost kernel's
  symmetric split (not monkeypatched) gives FC the Gram kernel's rounds with
  a fixed radius.

  Mutations seen to fail: the lower-left block of the split written as zeros
  instead of `off.T`; dropping `+ G_ii` in `ghost.centred`.
  """
  n, b, sizes = 9, 32, (6, 5, 3)
  keys = jax.random.split(jax.random.PRNGKey(4), n)
  params = jax.vmap(lambda k: models.mlp_init(k, sizes))(keys)
  rng = np.random.default_rng(4)
  x = rng.normal(size=(n, b, sizes[0])).astype(np.float32)
  y = np.where(np.arange(n)[:, None] < 5, x[..., 0] > 0,
               2 * (x[..., 1] > 0)).astype(np.int32)
  batch = (jnp.asarray(x), jnp.asarray(y))
  mlp = models.mlp_classifier_loss(2)
  loss = ghost.GhostLoss(mlp.fn, mlp.layers, always=True)
  assert n * b > ghost._MIN_SPLIT_ROWS
  radius = _median_pair_distance(loss, params, batch)
  out, fractions = _fc_rounds(loss, params, batch, radius, None, "ghost")
  ref, ref_fractions = _fc_rounds(loss, params, batch, radius, 1, "gram")
  jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=1e-4,
                                                       atol=1e-6), out, ref)
  np.testing.assert_allclose(fractions, ref_fractions, rtol=1e-6)
  assert all(1 / n < f < 1 for f in ref_fractions)
