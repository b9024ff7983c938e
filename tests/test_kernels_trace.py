"""The automatic analysis of any loss (prfl_jax.kernels.trace) and the ghost
kernel built on it, against materialised per-client gradients.

Every loss below is checked the same way (`_check`): for one model, the ghost
kernel's `[N, N]` Gram matrix, client losses and a combination of the
clients' gradients equal those of `gradients.all_pairs_grads` (plain autodiff,
float64 Gram), with every recognised layer through the ghost Gram and with the
FLOP rule's choice; and, for a few of them, `cluster_at_models` gives the
Gram kernel's centres under the default plan (and the full vmap for the
CNN; each plan is a compile).
"""

import warnings

from flax import linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import gradients
from prfl_jax import kernels
from prfl_jax.kernels import base
from prfl_jax.kernels import ghost
from prfl_jax.kernels import trace
from tests import tolerances

N, B, D, H, K = 4, 3, 5, 6, 3

# The plans that differ in kind for a convolution: the full vmap over models
# (per-model kernels become a grouped convolution) and the default (chunk 1
# on CPU: one model at a time). Chunks of c run the same per-model code under
# a vmap of c, and for dense layers every plan does: test_ghost.py::
# test_cluster_at_models_matches_direct checks every plan there, so the
# dense losses here get the default plan only (each plan is a compile).
CONV_PLANS = [kernels.ExecutionPlan(None, "ghost"), kernels.ExecutionPlan()]
DEFAULT_PLAN = [kernels.ExecutionPlan()]


def _rng(seed=0):
  return np.random.default_rng(seed)


def _f32(rng, *shape, scale=1.0):
  return (scale * rng.normal(size=shape)).astype(np.float32)


def _batch(seed=0, x_shape=(B, D)):
  rng = _rng(seed + 100)
  x = _f32(rng, N, *x_shape)
  x[N // 2:] += 1.5  # Two groups of clients.
  y = rng.integers(0, K, (N, x_shape[0])).astype(np.int32)
  return jnp.asarray(x), jnp.asarray(y)


def _ce(logits, y):
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _tree_gram(grads):
  flat = np.concatenate([np.asarray(g, np.float64).reshape(g.shape[0], -1)
                         for g in jax.tree.leaves(grads)], axis=1)
  return flat @ flat.T


def _ghost_vs_autodiff(loss, params, batch, always, monkeypatch):
  """Ghost Gram / losses / combination at model 0 vs autodiff (one jit)."""
  if always:
    monkeypatch.setattr(ghost, "uses_ghost", lambda *args, **kw: True)
  problem = base.Problem(loss, batch, 1.0, 1, jnp.ones((N,)))
  coefs = jnp.linspace(-1.0, 2.0, N)

  one = lambda t: jax.tree.map(lambda a: a[0], t)

  @jax.jit
  def run(params, batch):
    ctx = ghost.prepare(problem._replace(batch=batch), params,
                        trace.analyse(loss, one(params), one(batch)))
    model = jax.tree.map(lambda a: a[0], params)
    out = ghost.ghost_grads(ctx, model, batch)
    combined = ghost.combine(ctx, coefs, out, jnp.ones((N,), bool),
                             jax.tree.structure(model))
    losses, grads = gradients.all_pairs_grads(
        loss, jax.tree.map(lambda a: a[:1], params), batch)
    return out, combined, losses[0], jax.tree.map(lambda g: g[0], grads)

  out, combined, losses, grads = run(params, batch)
  ref = _tree_gram(grads)
  np.testing.assert_allclose(out.gram, ref, rtol=1e-4,
                             atol=1e-5 * np.abs(ref).max())
  np.testing.assert_allclose(out.losses, losses, rtol=1e-5, atol=1e-6)
  expected = jax.tree.map(lambda g: jnp.tensordot(coefs, g, axes=1), grads)
  jax.tree.map(lambda c, e: np.testing.assert_allclose(
      c, e, rtol=1e-4, atol=1e-5 * (1 + np.abs(e).max())), combined, expected)
  analysis = trace.analyse(loss, one(params), one(batch))
  if always:
    assert len(out.tokens) == len(analysis.groups)
  monkeypatch.undo()
  return analysis


def _plans_vs_gram(loss, params, batch, plans):
  run = lambda plan: jax.jit(lambda p, b: kernels.cluster_at_models(
      loss, p, b, radius=prfl.quantile_radius(0.5), num_iters=5, plan=plan)
                             )(params, batch)
  ref = run(kernels.ExecutionPlan(1, "gram"))
  assert 0 < np.sum(ref.inside) < ref.inside.size
  for plan in plans:
    out = run(plan)
    jax.tree.map(lambda a, r: np.testing.assert_allclose(
        a, r, **tolerances.model(2e-4, 1e-5 * (1 + np.abs(r).max()),
                                 scale=np.abs(r).max())),
                 out.centers, ref.centers)
    np.testing.assert_array_equal(out.inside, ref.inside)
    np.testing.assert_allclose(out.own_loss, ref.own_loss,
                               **tolerances.model(1e-5))


def _check(loss, params, batch, monkeypatch, plans=()):
  """What the module docstring says, for the execution plans `plans` (none
  by default, to keep the tests fast); returns the analysis."""
  for always in (True, False):
    analysis = _ghost_vs_autodiff(loss, params, batch, always, monkeypatch)
  if plans:
    _plans_vs_gram(loss, params, batch, plans)
  return analysis


def _stack(init, seed=0):
  return jax.vmap(init)(jax.random.split(jax.random.PRNGKey(seed), N))


# --- plain JAX ---------------------------------------------------------------


def _mlp_params(key):
  k1, k2, k3 = jax.random.split(key, 3)
  return {"w1": jax.random.normal(k1, (D, H)) / D**0.5,
          "b1": 0.1 * jax.random.normal(k3, (H,)),
          "w2": jax.random.normal(k2, (H, K)) / H**0.5,
          "b2": jnp.zeros((K,))}


def _user_mlp(p, batch):
  """The MLP as a user writes it: plain products, optax cross-entropy."""
  x, y = batch
  h = jax.nn.relu(x @ p["w1"] + p["b1"])
  return _ce(h @ p["w2"] + p["b2"], y)


def test_user_written_mlp_every_leaf_recognised(monkeypatch):
  params = _stack(_mlp_params)
  analysis = _check(_user_mlp, params, _batch(), monkeypatch,
                    plans=DEFAULT_PLAN)
  assert analysis.autodiff == ()
  names = ["b1", "b2", "w1", "w2"]  # Leaf order of the dict.
  assert [(names[g.weight.leaf], names[g.bias.leaf])
          for g in analysis.groups] == [("w1", "b1"), ("w2", "b2")]
  assert [g.shared_input for g in analysis.groups] == [True, False]


def test_dense_layouts_transposed_reshaped_and_batched(monkeypatch):
  """`w @ x.T`, `x @ v.T`, a flat weight reshaped, and an einsum with a batch
  (group) dimension over heads, whose biases broadcast in different ways."""

  def init(key):
    ks = jax.random.split(key, 5)
    return {"wt": jax.random.normal(ks[0], (H, D)) / D**0.5,  # [out, in]
            "flat": jax.random.normal(ks[1], (H * 2 * 2,)) / H**0.5,
            "heads": jax.random.normal(ks[2], (2, 2, K)),  # [G, in, out]
            "hb": 0.1 * jax.random.normal(ks[3], (2, 1, K)),
            "v": jax.random.normal(ks[4], (K, 2 * K)) / K}

  def loss(p, batch):
    x, y = batch
    h = jnp.tanh((p["wt"] @ x.T).T)  # W is the lhs: out [H, B].
    h = h @ p["flat"].reshape(H, 4)  # [B, 4]
    hh = jnp.transpose(h.reshape(B, 2, 2), (1, 0, 2))  # [2, B, 2]
    z = jnp.einsum("gbi,gio->gbo", hh, p["heads"]) + p["hb"]  # [2, B, K]
    logits = jnp.sum(z, axis=0) @ p["v"][:, :K].T  # A slice, transposed.
    return _ce(logits, y)

  analysis = _check(loss, _stack(init), _batch(), monkeypatch)
  assert analysis.autodiff == ()
  heads = [g for g in analysis.groups if g.layer.groups == 2]
  assert len(heads) == 1 and heads[0].bias is not None


def test_shared_weight_used_twice_concatenates_tokens(monkeypatch):
  """sum_u a_u^T d_u = [a_1; a_2]^T [d_1; d_2]; the bias only on one use.

  Mutation: giving every token the bias column (1 instead of 0 for sites
  without the bias) in `ghost._input_tokens` fails this test.
  """
  def init(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"w": jax.random.normal(k1, (D, D)) / D**0.5,
            "b": 0.3 * jax.random.normal(k2, (D,)),
            "out": jax.random.normal(k3, (D, K)) / D**0.5}

  def loss(p, batch):
    x, y = batch
    h = jnp.tanh(x @ p["w"] + p["b"])
    h = jnp.tanh(h @ p["w"])  # The same weight again, without bias.
    return _ce(h @ p["out"], y)

  analysis = _check(loss, _stack(init), _batch(), monkeypatch,
                    plans=DEFAULT_PLAN)
  shared = [g for g in analysis.groups if len(g.sites) == 2]
  assert len(shared) == 1 and shared[0].bias is not None
  assert [s.bias is not None for s in shared[0].sites] == [True, False]
  assert not shared[0].shared_input  # The second use sees h.


def test_weight_used_in_two_orientations_is_materialised(monkeypatch):
  def init(key):
    return {"w": jax.random.normal(key, (D, K)) / D**0.5}

  def loss(p, batch):
    x, y = batch
    logits = x @ p["w"]
    back = logits @ p["w"].T  # [B, D]: the transpose, another layout.
    return _ce(logits, y) + 0.1 * jnp.mean(jnp.square(back - x))

  analysis = _check(loss, _stack(init), _batch(), monkeypatch)
  assert analysis.groups == () and analysis.autodiff == (0,)
  assert "layout" in analysis.notes[0]


def test_parameter_outside_any_product_is_materialised(monkeypatch):
  """A scale `h * s` and a weight also in a regulariser go to autodiff."""
  def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (D, H)) / D**0.5,
            "s": jnp.linspace(0.5, 1.5, H),
            "w2": jax.random.normal(k2, (H, K)) / H**0.5}

  def loss(p, batch):
    x, y = batch
    h = jax.nn.relu(x @ p["w1"]) * p["s"]
    return _ce(h @ p["w2"], y) + 0.01 * jnp.sum(jnp.square(p["w2"]))

  analysis = _check(loss, _stack(init), _batch(), monkeypatch)
  assert [g.weight.leaf for g in analysis.groups] == [1]  # w1 (s=0, w2=2).
  assert analysis.autodiff == (0, 2)


def test_calls_jit_checkpoint_custom_jvp_are_entered(monkeypatch):
  """Layers inside `jax.jit`, `jax.checkpoint` and a custom_jvp function."""
  @jax.custom_jvp
  def dense_act(x, w):
    return jnp.tanh(x @ w)

  @dense_act.defjvp
  def _(primals, tangents):
    x, w = primals
    dx, dw = tangents
    y = dense_act(x, w)
    return y, (1 - y**2) * (dx @ w + x @ dw)

  def loss(p, batch):
    x, y = batch
    h = jax.jit(lambda x, w, b: jax.nn.relu(x @ w + b))(x, p["w1"], p["b1"])
    h = jax.checkpoint(dense_act)(h, p["w2"])
    return _ce(h @ p["w3"], y)

  def init(key):
    k = jax.random.split(key, 3)
    return {"w1": jax.random.normal(k[0], (D, H)) / D**0.5,
            "b1": jnp.full((H,), 0.1),
            "w2": jax.random.normal(k[1], (H, H)) / H**0.5,
            "w3": jax.random.normal(k[2], (H, K)) / H**0.5}

  analysis = _check(loss, _stack(init), _batch(), monkeypatch)
  assert analysis.autodiff == ()
  assert len(analysis.groups) == 3


def test_parameter_inside_scan_is_materialised(monkeypatch):
  def init(key):
    k1, k2 = jax.random.split(key)
    return {"w": jax.random.normal(k1, (D, D)) / D**0.5,
            "out": jax.random.normal(k2, (D, K)) / D**0.5}

  def loss(p, batch):
    x, y = batch
    h, _ = lax.scan(lambda h, _: (jnp.tanh(h @ p["w"]), None), x, None,
                    length=2)
    return _ce(h @ p["out"], y)

  analysis = _check(loss, _stack(init), _batch(), monkeypatch)
  assert analysis.autodiff == (1,)  # "w" (leaves: out=0, w=1).
  assert any("scan" in note for note in analysis.notes)


def test_no_recognised_layer_falls_back_and_warns_once():
  def loss(p, batch):
    x, _ = batch
    return jnp.mean(jnp.square(x - p["c"]))

  params = {"c": jnp.asarray(_f32(_rng(), N, D))}
  batch = _batch()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outs = [jax.jit(lambda p, b: kernels.cluster_at_models(
        loss, p, b, radius=1.0, num_iters=3))(params, batch)
            for _ in range(2)]
    plan = kernels.resolve_plan(kernels.ExecutionPlan(), loss, params, batch)
  assert plan.plan == kernels.ExecutionPlan(tolerances.default_chunk(N),
                                            "gram")
  found = [w for w in caught if "found no dense" in str(w.message)]
  assert len(found) == 1, [str(w.message) for w in caught]
  ref = kernels.cluster_at_models(loss, params, batch, radius=1.0,
                                  num_iters=3,
                                  plan=kernels.ExecutionPlan(1, "gram"))
  jax.tree.map(np.testing.assert_array_equal, outs[0].centers, ref.centers)


# --- Flax linen and Equinox -------------------------------------------------


class _FlaxMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(H)(x))
    return nn.Dense(K)(x)


class _FlaxCNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(3, (3, 3))(x))
    x = nn.max_pool(x, (2, 2), (2, 2))
    x = nn.relu(nn.Conv(4, (3, 3), strides=2, padding="VALID",
                        feature_group_count=1)(x))
    x = x.reshape(x.shape[0], -1)
    return nn.Dense(K)(x)


def _flax_loss(module):
  def loss(params, batch):
    x, y = batch
    return _ce(module.apply({"params": params}, x), y)
  return loss


def test_flax_linen_mlp(monkeypatch):
  module = _FlaxMLP()
  params = _stack(lambda k: module.init(k, jnp.zeros((B, D)))["params"])
  analysis = _check(_flax_loss(module), params, _batch(), monkeypatch)
  assert analysis.autodiff == () and len(analysis.groups) == 2
  assert all(g.bias is not None for g in analysis.groups)


def test_flax_linen_cnn(monkeypatch):
  if jax.lax.conv_general_dilated_p not in kernels.rules.RULES:
    pytest.skip("the convolution rule (kernels/conv.py) is not registered")
  module = _FlaxCNN()
  shape = (2, 8, 8, 2)
  params = _stack(lambda k: module.init(k, jnp.zeros(shape))["params"])
  analysis = _check(_flax_loss(module), params,
                    _batch(x_shape=shape), monkeypatch, plans=CONV_PLANS)
  assert analysis.autodiff == () and len(analysis.groups) == 3
  assert all(g.bias is not None for g in analysis.groups)


def test_equinox_mlp(monkeypatch):
  eqx = pytest.importorskip("equinox")
  keys = jax.random.split(jax.random.PRNGKey(0), N)
  models = eqx.filter_vmap(lambda k: eqx.nn.MLP(D, K, H, 1, key=k))(keys)
  params, static = eqx.partition(models, eqx.is_array)

  def loss(p, batch):
    x, y = batch
    return _ce(jax.vmap(eqx.combine(p, static))(x), y)

  analysis = _check(loss, params, _batch(), monkeypatch, plans=DEFAULT_PLAN)
  # Equinox's vmapped Linear is `w @ x` then a transpose, then the bias.
  assert analysis.autodiff == () and len(analysis.groups) == 2
  assert all(g.bias is not None for g in analysis.groups)


def test_flax_nnx_mlp(monkeypatch):
  nnx = pytest.importorskip("flax.nnx")

  class MLP(nnx.Module):

    def __init__(self, rngs):
      self.l1 = nnx.Linear(D, H, rngs=rngs)
      self.l2 = nnx.Linear(H, K, rngs=rngs)

    def __call__(self, x):
      return self.l2(jax.nn.relu(self.l1(x)))

  graphdef, _ = nnx.split(MLP(nnx.Rngs(0)))
  params = jax.vmap(lambda k: nnx.split(MLP(nnx.Rngs(k)))[1])(
      jax.random.split(jax.random.PRNGKey(0), N))

  def loss(state, batch):
    x, y = batch
    return _ce(nnx.merge(graphdef, state)(x), y)

  analysis = _check(loss, params, _batch(), monkeypatch)
  assert analysis.autodiff == () and len(analysis.groups) == 2
  assert all(g.bias is not None for g in analysis.groups)


# --- transformations --------------------------------------------------------


def test_vmap_over_a_sweep_equals_each_run(monkeypatch):
  """`vmap` of the ghost kernel over two parameter sets (e.g. a sweep)."""
  monkeypatch.setattr(ghost, "uses_ghost", lambda *args, **kw: True)
  two = jax.tree.map(lambda a, b: jnp.stack([a, b]), _stack(_mlp_params, 0),
                     _stack(_mlp_params, 1))
  batch = _batch()
  fn = lambda p, q: kernels.cluster_at_models(
      _user_mlp, p, batch, radius=prfl.quantile_radius(q), num_iters=4,
      plan=kernels.ExecutionPlan(2, "ghost")).centers
  both = jax.jit(jax.vmap(fn))(two, jnp.array([0.5, 0.7]))
  for g, q in enumerate([0.5, 0.7]):
    one = jax.jit(fn)(jax.tree.map(lambda a, g=g: a[g], two), q)
    jax.tree.map(lambda a, r, g=g: np.testing.assert_allclose(
        a[g], r, rtol=1e-5, atol=1e-6), both, one)


def test_bias_detection_rejects_a_bias_over_the_batch():
  """A parameter added per example (shape [B, out]) is no bias: autodiff."""
  def loss(p, batch):
    x, y = batch
    return _ce(x @ p["w"] + p["per_example"], y)

  params = {"w": jnp.ones((D, K)), "per_example": jnp.ones((B, K))}
  analysis = trace.analyse(loss, params, jax.tree.map(lambda a: a[0],
                                                      _batch()))
  assert [g.bias for g in analysis.groups] == [None]
  assert analysis.autodiff == (0,)  # per_example (leaves: per_example, w).


def test_vector_weight_and_scalar_bias_are_recognised():
  """`x @ w + b` with `w [D]` (q = 1) and a scalar `b` (lax broadcasts it)."""
  def loss(p, batch):
    x, _ = batch
    return jnp.mean(jnp.square(x @ p["w"] + p["b"] - 1.0))

  params = {"w": jnp.asarray(_f32(_rng(), N, D)),
            "b": jnp.linspace(-1.0, 1.0, N)}
  analysis = trace.analyse(loss, jax.tree.map(lambda a: a[0], params),
                           jax.tree.map(lambda a: a[0], _batch()))
  (group,) = analysis.groups
  assert (group.layer.q, group.bias.leaf, group.bias_shape) == (1, 0, ())
  assert analysis.autodiff == ()
