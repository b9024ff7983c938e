"""Tests of prfl_jax.kernels.ghost: Gram matrices of gradients from tokens."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import gradients
from prfl_jax import kernels
from prfl_jax import models
from prfl_jax.kernels import base
from prfl_jax.kernels import ghost
from prfl_jax.kernels import trace
from benchmarks import check_ghost_precision
from tests import tolerances

N, B = 7, 4


def plan(chunk_size=1, kernel="auto"):
  """The execution-plan keyword of a factory (one place to rename)."""
  return {"plan": prfl.ExecutionPlan(chunk_size, kernel)}

SIZES = (6, 9, 5, 3)  # Three dense layers; only the first sees the data.


def _loss(params, batch):
  """MLP with a scalar `temp` outside the dense layers (materialised)."""
  x, y = batch
  logits = models.mlp_apply({k: v for k, v in params.items() if k != "temp"},
                            x)
  logp = jax.nn.log_softmax(logits * params["temp"])
  return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def _problem(seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), N)
  params = jax.vmap(lambda k: models.mlp_init(k, SIZES))(keys)
  params["temp"] = jnp.linspace(0.5, 1.5, N)
  rng = np.random.default_rng(seed)
  # Two groups of clients with different label rules.
  x = rng.normal(size=(N, B, SIZES[0])).astype(np.float32)
  y = np.where(np.arange(N)[:, None] < 4, x[..., 0] > 0,
               2 * (x[..., 1] > 0)).astype(np.int32)
  return params, (jnp.asarray(x), jnp.asarray(y))


@pytest.fixture
def always_ghost(monkeypatch):
  """Every recognised layer through (*), whatever it costs."""
  monkeypatch.setattr(ghost, "uses_ghost", lambda *args, **kw: True)


def _tree_gram(grads):
  flat = np.concatenate([np.asarray(g, np.float64).reshape(g.shape[0], -1)
                         for g in jax.tree.leaves(grads)], axis=1)
  return flat @ flat.T


def _ctx(loss, params, batch, **options):
  problem = base.Problem(loss, batch, 1.0, 1, jnp.ones((N,)))
  one = lambda t: jax.tree.map(lambda a: a[0], t)
  return ghost.prepare(problem, params, trace.analyse(loss, one(params),
                                                      one(batch)),
                       ghost.Options(**options))


def test_one_weight_gram_by_hand(always_ghost):
  """N=2, B=1, scalar layer: <g_j, g_k> = (x_j x_k + 1) r_j r_k."""
  del always_ghost

  def loss(params, batch):
    x, y = batch
    h = x @ params["lin"]["kernel"] + params["lin"]["bias"]
    return 0.5 * jnp.sum(jnp.square(h - y))

  model = {"lin": {"kernel": jnp.array([[2.0]]), "bias": jnp.array([0.5])}}
  x = jnp.array([[[1.0]], [[-3.0]]])
  y = jnp.array([[[0.0]], [[1.0]]])
  r = np.array([2.0 * 1 + 0.5, 2.0 * -3 + 0.5 - 1])  # Residuals 2.5, -6.5.
  xs = np.array([1.0, -3.0])
  expected = (np.outer(xs, xs) + 1) * np.outer(r, r)
  ctx = _ctx(loss, jax.tree.map(lambda a: a[None], model), (x, y))
  assert ctx.ghost == (True,)
  assert ctx.shared[0] is not None  # The input is the data.
  out = ghost.ghost_grads(ctx, model, (x, y))
  np.testing.assert_allclose(out.gram, expected, **tolerances.model(1e-6))
  np.testing.assert_allclose(out.losses, 0.5 * r**2, **tolerances.model(1e-6))
  assert out.materialised == {}


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_block_gram_matches_plain(n, monkeypatch):
  """The symmetric split gives the plain block sums, even and odd N."""
  del monkeypatch
  rng = np.random.default_rng(n)
  a = rng.normal(size=(n * 3, 4))
  d = rng.normal(size=(n * 3, 2))
  ka = a @ a.T + 1
  plain = (ka * (d @ d.T)).reshape(n, 3, n, 3).sum(axis=(1, 3))
  out = ghost._block_gram(jnp.asarray(ka, jnp.float32),
                          jnp.asarray(d, jnp.float32), n, True, 4)
  np.testing.assert_allclose(out, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, m, blocks", [
    (2, 2, [(2, 2)]),  # 4 rows = _MIN_SPLIT_ROWS: one block, no split.
    (2, 3, [(1, 1)] * 3),  # 6 rows: split down to single clients.
    (2, 5, [(1, 1)] * 3),  # A single client above the limit: not split.
    (3, 3, [(1, 1)] * 4 + [(1, 2)]),  # 1 + 2 clients, the 2 split again.
])
def test_block_gram_splits_where_it_should(n, m, blocks, monkeypatch):
  """`_block_gram` splits exactly when it has >= 2 clients and more than
  `min_rows` rows, and computes each off-diagonal block once; the
  result stays the plain block sums. The `_cross` calls are recorded as
  `(n1, n2)` (client counts of each block).

  Mutations seen to fail (issue 12's mutation run): the stop test
  `n < 2 or rows <= min_rows` written with `and` (a single client
  above the limit then splits into an empty half and fails), as
  `n <= 2` or `n < 3` (two clients above the limit are no longer split, so
  the off-diagonal block is computed twice), and `rows < min_rows`
  (a block of exactly the limit is split).
  """
  calls = []
  cross = ghost._cross

  def recording_cross(ka, d1, d2, n1, n2):
    calls.append((n1, n2))
    return cross(ka, d1, d2, n1, n2)

  monkeypatch.setattr(ghost, "_cross", recording_cross)
  rng = np.random.default_rng(m)
  a = rng.normal(size=(n * m, 3))
  d = rng.normal(size=(n * m, 2))
  ka = a @ a.T + 1
  plain = (ka * (d @ d.T)).reshape(n, m, n, m).sum(axis=(1, 3))
  out = ghost._block_gram(jnp.asarray(ka, jnp.float32),
                          jnp.asarray(d, jnp.float32), n, True, 4)
  assert sorted(calls) == blocks
  np.testing.assert_allclose(out, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend, splits", [("cpu", True), ("gpu", False),
                                             ("tpu", False)])
def test_block_gram_splits_on_cpu_only(backend, splits, monkeypatch):
  """The split is XLA:CPU's: on an H100 it gave FC rounds 4e-2 off (see
  `ghost._MIN_SPLIT_ROWS`), so by default an accelerator computes one
  block; `kernel(split=...)` forces it either way on any backend.

  Mutation seen to fail: the default split resolved to True on every
  backend.
  """
  params, batch = _problem()
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  assert _ctx(_loss, params, batch).options.split == splits
  for forced in (True, False):
    assert _ctx(_loss, params, batch, split=forced).options.split == forced


@pytest.mark.parametrize("always", [True, False])
def test_ghost_grads_match_materialised(always, monkeypatch):
  """Gram, losses and combinations equal those of materialised gradients.

  With `always`, the three dense layers go through (*) (only the first one's
  input Gram is shared); otherwise the FLOP rule materialises some from
  tokens. `temp` is outside every product and materialised by autodiff.
  Mutation: a `_cross` that drops `ka *` fails this test.
  """
  if always:
    monkeypatch.setattr(ghost, "uses_ghost", lambda *args, **kw: True)
  params, batch = _problem()
  ctx = _ctx(_loss, params, batch)
  analysis = ctx.analysis
  assert len(analysis.groups) == 3 and len(analysis.autodiff) == 1
  assert [g.shared_input for g in analysis.groups] == [True, False, False]
  if always:
    assert ctx.ghost == (True, True, True)
    assert [s is not None for s in ctx.shared] == [True, False, False]
  # Jitted: one compile each (op by op, the slowest test of the suite).
  ghost_grads = jax.jit(lambda model: ghost.ghost_grads(ctx, model, batch))
  pairs = jax.jit(lambda p: gradients.all_pairs_grads(_loss, p, batch))
  for i in (0, 4):
    model = jax.tree.map(lambda a, i=i: a[i], params)
    out = ghost_grads(model)
    losses, grads = pairs(jax.tree.map(lambda a, i=i: a[i:i + 1], params))
    gram = _tree_gram(jax.tree.map(lambda g: g[0], grads))
    np.testing.assert_allclose(out.gram, gram, **tolerances.model(
        2e-5, 1e-6, scale=np.max(np.abs(gram))))
    np.testing.assert_allclose(out.losses, losses[0],
                               **tolerances.model(1e-6))
    coefs = jnp.linspace(-1.0, 2.0, N)
    combined = ghost.combine(ctx, coefs, out, jnp.ones((N,), bool),
                             jax.tree.structure(model))
    expected = jax.tree.map(lambda g: jnp.tensordot(coefs, g[0], axes=1),
                            grads)
    jax.tree.map(lambda c, e: np.testing.assert_allclose(
        c, e, **tolerances.model(2e-5, 1e-6, scale=np.max(np.abs(e)))),
        combined, expected)


def test_uses_ghost_counts_flops():
  # MNIST MLP, N = B = 32: the 784 x 200 data layer goes through (*), the
  # 200 x 10 output layer is cheaper materialised.
  assert ghost.uses_ghost(32, 32, 784, 200, shared=True)
  assert not ghost.uses_ghost(32, 32, 200, 10, shared=False)
  # R = 6, N = 2, p = 3, q = 4: (*) costs 36*4 (+ 2*36*3); materialised
  # 2*(6+4)*12 = 240.
  assert ghost.uses_ghost(2, 3, 3, 4, shared=True)  # 144 < 240
  assert not ghost.uses_ghost(2, 3, 3, 4, shared=False)  # 360 > 240


PLANS = [kernels.ExecutionPlan(None, "ghost"), kernels.ExecutionPlan(1, "ghost"),
         kernels.ExecutionPlan(3, "ghost"), kernels.ExecutionPlan()]
CASES = ["plain", "weights", "nan"]


def _pairwise(plans, cases):
  """(plan, case, always) for every plan and case; `always` alternates so
  that every pair of the three values also occurs. The 12 other
  combinations are marked `slow` (`python -m pytest -m slow`)."""
  return [pytest.param(p, c, a, marks=() if a == ((i + j) % 2 == 0) else
                       pytest.mark.slow)
          for i, p in enumerate(plans) for j, c in enumerate(cases)
          for a in (True, False)]


def _case(case):
  """`_problem(seed=1)` with the weights and data of `case`."""
  params, (x, y) = _problem(seed=1)
  weights = None
  if case == "weights":
    weights = jnp.array([1.0, 1.0, 0.0, 1.0, 2.0, 1.0, 0.0])
  elif case == "nan":  # Client 5's data make its gradients NaN.
    x = x.at[5, 0, 0].set(jnp.nan)
  return params, (x, y), weights


def _cluster(case, plan):
  params, batch, weights = _case(case)
  return jax.jit(lambda p, b: kernels.cluster_at_models(
      _loss, p, b, radius=prfl.quantile_radius(0.5), num_iters=6,
      weights=weights, plan=plan))(params, batch)


@functools.lru_cache(maxsize=None)
def _direct(case):
  """The direct kernel's result, computed once per case and process (it
  does not depend on `uses_ghost`)."""
  return _cluster(case, kernels.ExecutionPlan(None, "direct"))


@pytest.mark.parametrize("plan, case, always", _pairwise(PLANS, CASES),
                         ids=str)
def test_cluster_at_models_matches_direct(plan, case, always, monkeypatch):
  """Every ghost plan gives the direct kernel's centres, losses, norms and
  balls, with each layer through (*) (`always`) or by the FLOP rule."""
  if always:
    monkeypatch.setattr(ghost, "uses_ghost", lambda *args, **kw: True)
  out, ref = _cluster(case, plan), _direct(case)
  ok = np.ones(N, bool)
  if case == "nan":  # Client 5's own centre is its own NaN gradient.
    ok[5] = False
  jax.tree.map(lambda a, r: np.testing.assert_allclose(
      np.asarray(a)[ok], np.asarray(r)[ok], **tolerances.model(
          1e-4, 1e-6, scale=np.max(np.abs(np.asarray(r)[ok])))),
               out.centers, ref.centers)
  np.testing.assert_allclose(out.own_loss[ok], ref.own_loss[ok],
                             **tolerances.model(1e-6))
  np.testing.assert_allclose(out.own_grad_norm[ok], ref.own_grad_norm[ok],
                             **tolerances.model(1e-5))
  np.testing.assert_array_equal(out.inside[ok], ref.inside[ok])
  assert 0 < np.sum(ref.inside) < ref.inside.size
  if case == "nan":
    assert not np.any(np.asarray(out.inside)[:, 5])


def test_federated_clustering_ghost_matches_gram():
  params, batch = _problem(seed=2)
  states = []
  for kernel in ("ghost", "gram"):
    alg = prfl.algorithms.federated_clustering(
        _loss, optax.sgd(0.1), radius=prfl.quantile_radius(0.4), num_iters=4,
        num_groups=2, plan=prfl.ExecutionPlan(1, kernel))
    state = alg.init(params)
    step = jax.jit(alg.step)
    for r in range(3):
      state, _ = step(state, batch, jax.random.PRNGKey(r))
    states.append(state)
  jax.tree.map(lambda a, r: np.testing.assert_allclose(
      a, r, **tolerances.model(1e-4, 1e-6, scale=np.max(np.abs(r)))),
               states[0].params, states[1].params)


def test_errors_name_the_argument():
  params, batch = _problem()
  with pytest.raises(ValueError, match="ExecutionPlan.kernel='ghost'"):
    kernels.cluster_at_models(
        _loss, params, batch, radius=1.0, num_iters=2,
        plan=kernels.ExecutionPlan(1, "ghost"), message_fn=lambda g, i, k: g,
        key=jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="`attack`"):
    prfl.algorithms.federated_clustering(
        _loss, optax.sgd(0.1), radius=1.0, attack=prfl.attacks.bit_flip(),
        plan=prfl.ExecutionPlan(1, "ghost"))


def test_auto_kernel_picks_ghost_only_where_it_applies():
  params, batch = _problem()
  resolve = lambda loss, messages=False, kernel="auto": kernels.resolve_plan(
      kernels.ExecutionPlan(kernel=kernel), loss, params, batch,
      messages=messages)
  assert resolve(_loss).plan == kernels.ExecutionPlan(
      tolerances.default_chunk(N), "ghost")
  assert resolve(_loss, messages=True).kernel == "gram"
  assert resolve(_loss, kernel="direct").kernel == "direct"
  assert prfl.ExecutionPlan() == ("auto", "auto")
  # With an attack, the default plan falls back to the Gram kernel. Jitted
  # (op by op, 24 CPU-seconds): the two plans are then one program.
  flip = lambda g, i, k: jax.tree.map(lambda a: -a, g)
  run = lambda plan: jax.jit(lambda p, b: kernels.cluster_at_models(
      _loss, p, b, radius=1.0, num_iters=2, message_fn=flip,
      key=jax.random.PRNGKey(0), plan=plan))(params, batch)
  out = run(prfl.ExecutionPlan())
  ref = run(prfl.ExecutionPlan(tolerances.default_chunk(N), "gram"))
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
def test_fixed_radius_ghost_rounds_match_gram(chunk, always_ghost):
  """A fixed radius on the ghost path: FC's rounds equal the Gram kernel's.

  A quantile radius ignores a uniform shift of the distances; a fixed one
  does not. Mutation seen to fail: dropping `+ G_ii` when the ghost kernel
  centres the Gram matrix (every squared distance shrinks by ||g_i||^2, so
  more clients fall inside the balls).
  """
  del always_ghost
  loss = _loss
  params, batch = _problem(seed=3)
  radius = _median_pair_distance(loss, params, batch)
  out, fractions = _fc_rounds(loss, params, batch, radius, chunk, "ghost")
  ref, ref_fractions = _fc_rounds(loss, params, batch, radius, 1, "gram")
  jax.tree.map(lambda a, r: np.testing.assert_allclose(
      a, r, **tolerances.model(1e-4, 1e-6, scale=np.max(np.abs(r)))),
               out, ref)
  np.testing.assert_allclose(fractions, ref_fractions, rtol=1e-6)
  assert all(1 / N < f < 1 for f in ref_fractions)  # Balls that decide.


def test_split_block_gram_above_256_rows_with_fixed_radius(always_ghost):
  """N * B = 9 * 32 = 288 rows > `_MIN_SPLIT_ROWS`: the ghost kernel's
  symmetric split (not monkeypatched; on CPU, one block on an accelerator)
  gives FC the Gram kernel's rounds with a fixed radius.

  Mutations seen to fail: the lower-left block of the split written as zeros
  instead of `off.T`; dropping `+ G_ii` when the ghost kernel
  centres its Gram matrix.
  """
  # The problem `benchmarks/check_ghost_precision.py` runs on a device.
  loss, params, (x, y) = check_ghost_precision.problem()
  batch = (jnp.asarray(x), jnp.asarray(y))
  del always_ghost
  assert x.shape[0] * x.shape[1] > ghost._MIN_SPLIT_ROWS
  radius = _median_pair_distance(loss, params, batch)
  out, fractions = _fc_rounds(loss, params, batch, radius, None, "ghost")
  ref, ref_fractions = _fc_rounds(loss, params, batch, radius, 1, "gram")
  jax.tree.map(lambda a, r: np.testing.assert_allclose(
      a, r, **tolerances.model(1e-4, 1e-6, scale=np.max(np.abs(r)))),
               out, ref)
  np.testing.assert_allclose(fractions, ref_fractions, rtol=1e-6)
  assert all(1 / x.shape[0] < f < 1 for f in ref_fractions)
