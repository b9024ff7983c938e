"""Tests of prfl_jax.gradients against a plain NumPy Algorithm 1-2 reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import prfl_jax as prfl
from prfl_jax import gradients
from prfl_jax import kernels
from tests import tolerances

N, D, B = 7, 3, 5


def _loss(params, batch):
  x, y = batch
  r = x @ params["w"] + params["b"] - y
  return jnp.mean(jnp.square(r))


def _np_loss_and_grad(w, b, x, y):
  """Loss and flattened gradient `[D + 1]` of `_loss` in float64."""
  r = x @ w + b - y
  return np.mean(r**2), np.concatenate([2.0 * x.T @ r / len(r),
                                        [2.0 * np.mean(r)]])


def _np_threshold_clustering(points, init, radius, num_iters, weights):
  """Algorithm 2 with one centre, written plainly (float64)."""
  valid = np.all(np.isfinite(points), axis=1) & (weights > 0)
  total = weights.sum()
  v = init.copy()
  inside = np.zeros(len(points), bool)
  for _ in range(num_iters):
    dist = np.full(len(points), np.inf)
    dist[valid] = np.linalg.norm(points[valid] - v, axis=1)
    if isinstance(radius, prfl.QuantileRadius):
      tau = np.quantile(dist[valid], float(radius.q)) if valid.any() else 0.0
    else:
      tau = radius
    inside = valid & (dist <= tau)
    moved = np.zeros_like(v)
    for j in np.flatnonzero(inside):
      moved += weights[j] * points[j]
    v = (moved + (total - weights[inside].sum()) * v) / total
  return v, inside


def _np_cluster_at_models(params, batch, radius, num_iters, weights, bad=None):
  """For every model i: cluster `{g_j(x_i)}_j` from `g_i(x_i)` (Alg. 1)."""
  w, b = (np.asarray(params[k], np.float64) for k in ("w", "b"))
  x, y = (np.asarray(a, np.float64) for a in batch)
  centers, losses, own, inside = [], [], [], []
  for i in range(N):
    pairs = [_np_loss_and_grad(w[i], b[i], x[j], y[j]) for j in range(N)]
    grads = np.stack([g for _, g in pairs])
    own.append(grads[i].copy())
    losses.append(pairs[i][0])
    if bad is not None:
      grads[bad] = np.nan
    v, ins = _np_threshold_clustering(grads, grads[i] if bad != i else own[i],
                                      radius, num_iters, weights)
    centers.append(v)
    inside.append(ins)
  return (np.stack(centers), np.array(losses), np.stack(own),
          np.stack(inside))


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  params = {"w": rng.normal(size=(N, D)).astype(np.float32),
            "b": (0.5 * rng.normal(size=(N,))).astype(np.float32)}
  # Two groups of clients with different targets, so balls exclude some.
  shift = np.where(np.arange(N) < 4, 0.0, 3.0)[:, None]
  x = rng.normal(size=(N, B, D)).astype(np.float32)
  y = (rng.normal(size=(N, B)) + shift).astype(np.float32)
  return params, (x, y)


def _flat(tree):
  return np.concatenate([np.asarray(tree["w"]).reshape(N, -1),
                         np.asarray(tree["b"]).reshape(N, -1)], axis=1)


PLANS = [
    kernels.ExecutionPlan(None, "gram"),
    kernels.ExecutionPlan(None, "direct"),
    kernels.ExecutionPlan(1, "gram"),
    kernels.ExecutionPlan(1, "direct"),
    kernels.ExecutionPlan(3, "gram"),  # 3 does not divide N = 7.
    kernels.ExecutionPlan(3, "direct"),
    kernels.ExecutionPlan(None, "ghost"),
    kernels.ExecutionPlan(1, "ghost"),
    kernels.ExecutionPlan(3, "ghost"),
    kernels.ExecutionPlan(),  # auto: ghost, chunk from backend + loss.
]


def _nan_messages(bad, grads, index, key):
  del index, key  # Unused.
  mask = jnp.arange(N) == bad
  return jax.tree.map(
      lambda g: jnp.where(mask.reshape((N,) + (1,) * (g.ndim - 1)), jnp.nan,
                          g), grads)


@pytest.mark.parametrize("plan", PLANS, ids=str)
@pytest.mark.parametrize("case", ["quantile", "weights", "nan"])
def test_cluster_at_models_matches_numpy(plan, case):
  """Every plan gives the NumPy reference's centres, losses, norms, balls.

  The loss is `x @ w + b` with a vector `w` and a scalar `b`: the ghost
  kernel recognises both (q = 1, a scalar bias). Mutation: dropping the ones
  column of the bias in `ghost._input_tokens` fails the ghost plans.
  """
  params, batch = _problem()
  weights = np.ones(N)
  radius = prfl.quantile_radius(0.5)
  message_fn, bad, key = None, None, None
  if case == "weights":
    weights = np.array([1.0, 1.0, 0.0, 1.0, 2.0, 1.0, 0.0])
    radius = prfl.quantile_radius(0.6)
  elif case == "nan":  # A fixed radius, and a client that sends NaN.
    radius = 2.0
    bad = 5
    message_fn = functools.partial(_nan_messages, bad)
    key = jax.random.PRNGKey(1)
    if plan.kernel != "gram" and plan.kernel != "direct":
      pytest.skip("the ghost kernel builds no messages (NaN data: "
                  "test_ghost.py)")
  fn = jax.jit(lambda p, b: kernels.cluster_at_models(
      _loss, p, b, radius=radius, num_iters=6,
      weights=None if case != "weights" else jnp.asarray(weights, jnp.float32),
      plan=plan, message_fn=message_fn, key=key))
  out = fn(params, batch)
  ref_c, ref_l, ref_own, ref_in = _np_cluster_at_models(
      params, batch, radius, 6, weights, bad=bad)
  # The model's forward/backward follows JAX's default matmul precision
  # (TF32 / bf16 on accelerators): tolerances.model widens off CPU.
  ref_norm = np.linalg.norm(ref_own, axis=1)
  np.testing.assert_allclose(_flat(out.centers), ref_c, **tolerances.model(
      2e-4, 2e-5, scale=np.max(np.abs(ref_c))))
  np.testing.assert_allclose(out.own_loss, ref_l, **tolerances.model(2e-5))
  np.testing.assert_allclose(out.own_grad_norm, ref_norm, **tolerances.model(
      2e-5, 2e-6, scale=np.max(ref_norm)))
  np.testing.assert_array_equal(out.inside, ref_in)
  assert np.all(np.isfinite(_flat(out.centers)))
  # The ball must separate the two groups for this test to mean anything.
  assert 0 < ref_in.sum() < ref_in.size


def test_plans_agree_on_mlp():
  """Plans agree on a small MLP (several leaves, matrix params)."""
  n, b, din, dh, dout = 6, 4, 5, 7, 3

  def loss(p, batch):
    x, y = batch
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    return -jnp.mean(jnp.sum(
        jax.nn.log_softmax(logits) * jax.nn.one_hot(y, dout), -1))

  rng = np.random.default_rng(3)
  f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
  params = {"w1": f32(n, din, dh), "b1": f32(n, dh), "w2": f32(n, dh, dout),
            "b2": f32(n, dout)}
  batch = (f32(n, b, din), rng.integers(0, dout, (n, b)).astype(np.int32))
  outs = []
  for plan in [kernels.ExecutionPlan(2, "direct"),
               kernels.ExecutionPlan(1, "gram"),
               kernels.ExecutionPlan(None, "ghost"),
               kernels.ExecutionPlan(2, "ghost")]:
    out = jax.jit(lambda p, bt, s=plan: kernels.cluster_at_models(
        loss, p, bt, radius=prfl.quantile_radius(0.5), num_iters=5,
        plan=s))(params, batch)
    outs.append(out)
  for out in outs[1:]:
    jax.tree.map(lambda a, r: np.testing.assert_allclose(
        a, r, **tolerances.model(1e-4, 1e-5, scale=np.max(np.abs(r)))),
        out.centers, outs[0].centers)
    np.testing.assert_array_equal(out.inside, outs[0].inside)


def test_all_pairs_grads_matches_double_loop():
  params, batch = _problem(seed=2)
  losses, grads = jax.jit(functools.partial(gradients.all_pairs_grads, _loss))(
      params, batch)
  assert losses.shape == (N, N)
  vg = jax.jit(jax.value_and_grad(_loss))
  for i in range(N):
    p_i = jax.tree.map(lambda a, i=i: a[i], params)
    for j in range(N):
      b_j = jax.tree.map(lambda a, j=j: a[j], batch)
      loss, grad = vg(p_i, b_j)
      np.testing.assert_allclose(losses[i, j], loss,
                                 **tolerances.model(1e-5))
      # The scale of a leaf's TF32 rounding is that of its terms, not of
      # one (possibly cancelling) sum: the leaf's largest entry over all
      # pairs (an H100 gave 0.0291 for 0.0296 where that was 7.4).
      jax.tree.map(lambda a, r, i=i, j=j: np.testing.assert_allclose(
          a[i, j], r, **tolerances.model(1e-5, 1e-6,
                                         scale=np.max(np.abs(a)))),
          grads, grad)


def test_client_grads_is_diagonal_of_all_pairs():
  params, batch = _problem(seed=4)
  losses, grads = gradients.client_grads(_loss, params, batch)
  all_losses, all_grads = gradients.all_pairs_grads(_loss, params, batch)
  diagonal = np.stack([all_grads["w"][i, i] for i in range(N)])
  np.testing.assert_allclose(losses, np.diagonal(all_losses),
                             **tolerances.model(1e-6))
  np.testing.assert_allclose(grads["w"], diagonal, **tolerances.model(
      1e-5, 1e-6, scale=np.max(np.abs(diagonal))))


def test_check_loss_fn():
  params, batch = _problem()
  gradients.check_loss_fn(_loss, params, batch)
  with pytest.raises(TypeError, match="scalar"):
    gradients.check_loss_fn(
        lambda p, b: b[0] @ p["w"], params, batch)  # [B], not a scalar.
  with pytest.raises(TypeError, match="callable"):
    gradients.check_loss_fn(None, params, batch)
  with pytest.raises(ValueError, match="leading axes"):
    gradients.check_loss_fn(_loss, params,
                            jax.tree.map(lambda a: a[:3], batch))


def test_check_plan():
  kernels.check_plan(kernels.ExecutionPlan(None, "direct"))
  kernels.check_plan(kernels.ExecutionPlan())
  with pytest.raises(ValueError, match="chunk_size"):
    kernels.check_plan(kernels.ExecutionPlan(0))
  with pytest.raises(ValueError, match="chunk_size"):
    kernels.check_plan(kernels.ExecutionPlan("fast"))
  with pytest.raises(ValueError, match="kernel"):
    kernels.check_plan(kernels.ExecutionPlan(4, "fast"))
  with pytest.raises(TypeError, match="ExecutionPlan"):
    kernels.check_plan((4, "gram"))


def test_cluster_at_models_argument_errors():
  params, batch = _problem()
  with pytest.raises(ValueError, match="key"):
    kernels.cluster_at_models(
        _loss, params, batch, radius=1.0, num_iters=2,
        message_fn=lambda g, i, k: g)
  with pytest.raises(ValueError, match="`weights` must have shape"):
    kernels.cluster_at_models(_loss, params, batch, radius=1.0, num_iters=2,
                              weights=np.ones(N + 1))


def test_cluster_at_models_vmaps_over_groups():
  """Vmapping over independent groups equals running each group alone."""
  params, batch = _problem(seed=5)
  two = jax.tree.map(lambda a: np.stack([a, a[::-1]]), (params, batch))
  fn = lambda p, b: kernels.cluster_at_models(
      _loss, p, b, radius=prfl.quantile_radius(0.5), num_iters=4,
      plan=kernels.ExecutionPlan(3, "gram")).centers
  both = jax.jit(jax.vmap(fn))(*two)
  for g in range(2):
    one = jax.jit(fn)(*jax.tree.map(lambda a, g=g: a[g], two))
    jax.tree.map(lambda a, r, g=g: np.testing.assert_allclose(
        a[g], r, **tolerances.model(1e-5, 1e-6, scale=np.max(np.abs(r)))),
        both, one)
