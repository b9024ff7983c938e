"""Tests of prfl_jax.models: the paper's MLP in flax.linen.Dense layout."""

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax import models


class _FlaxMLP(nn.Module):
  sizes: tuple

  @nn.compact
  def __call__(self, x):
    for i, size in enumerate(self.sizes):
      x = nn.Dense(size)(x)
      if i < len(self.sizes) - 1:
        x = nn.relu(x)
    return x


def test_params_are_those_of_a_flax_mlp():
  params = models.mlp_init(jax.random.PRNGKey(0), (784, 200, 10))
  assert jax.tree.map(np.shape, params) == {
      "Dense_0": {"kernel": (784, 200), "bias": (200,)},
      "Dense_1": {"kernel": (200, 10), "bias": (10,)}}
  x = jax.random.normal(jax.random.PRNGKey(1), (5, 784))
  flax_params = _FlaxMLP((200, 10)).init(jax.random.PRNGKey(2), x)["params"]
  assert jax.tree.map(np.shape, flax_params) == jax.tree.map(np.shape, params)
  logits = models.mlp_apply(params, x)
  np.testing.assert_allclose(
      logits, _FlaxMLP((200, 10)).apply({"params": params}, x), rtol=1e-5,
      atol=1e-6)
  # LeCun-normal kernels (std 1/sqrt(fan_in)), zero biases.
  assert abs(float(jnp.std(params["Dense_0"]["kernel"])) - 784**-0.5) < 2e-3
  assert not np.any(params["Dense_1"]["bias"])


def test_classifier_loss_is_cross_entropy():
  params = models.mlp_init(jax.random.PRNGKey(0), (12, 7, 3))
  x = jax.random.normal(jax.random.PRNGKey(1), (6, 3, 4))  # Flattened to 12.
  y = jnp.array([0, 2, 1, 1, 0, 2])
  loss = models.mlp_classifier_loss(2)
  logits = _FlaxMLP((7, 3)).apply({"params": params}, x.reshape(6, -1))
  p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  expected = -np.mean(np.log(p[np.arange(6), y]))
  np.testing.assert_allclose(loss(params, (x, y)), expected, rtol=1e-5)
  with pytest.raises(ValueError, match="3 dense layers"):
    models.mlp_classifier_loss(3)(params, (x, y))
  with pytest.raises(ValueError, match="`num_layers`"):
    models.mlp_classifier_loss(0)


def test_classifier_loss_layers_are_found_by_the_ghost_kernel():
  """Both dense layers (kernel and bias) are recognised in the plain loss."""
  from prfl_jax.kernels import trace  # pylint: disable=g-import-not-at-top
  params = models.mlp_init(jax.random.PRNGKey(0), (12, 7, 3))
  batch = (jnp.zeros((6, 12)), jnp.zeros((6,), jnp.int32))
  analysis = trace.analyse(models.mlp_classifier_loss(2), params, batch)
  assert analysis.autodiff == ()
  assert len(analysis.groups) == 2
  assert all(g.bias is not None for g in analysis.groups)


@pytest.mark.parametrize("sizes", [(5,), (5, 0), (5, 2.5), ()])
def test_mlp_init_rejects_bad_sizes(sizes):
  with pytest.raises(ValueError, match="`sizes`"):
    models.mlp_init(jax.random.PRNGKey(0), sizes)


# ----------------------------------------------------------------------------
# Flax linen models (MLP, CNN, VGG), classifier losses, stacked init.
# ----------------------------------------------------------------------------

MNIST, DIGITS, CIFAR = (28, 28, 1), (8, 8, 1), (32, 32, 3)


def _num_params(variables) -> int:
  return sum(int(np.prod(np.shape(v))) for v in jax.tree.leaves(variables))


def _shapes(model, shape, batch=2):
  """Variables and output as shapes only (`jax.eval_shape`: nothing runs)."""
  x = jax.ShapeDtypeStruct((batch,) + shape, jnp.float32)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)
  return variables, jax.eval_shape(model.apply, variables, x)


def _conv(c_in, c_out):  # 3x3 kernel + bias.
  return 9 * c_in * c_out + c_out


def _dense(d_in, d_out):
  return d_in * d_out + d_out


@pytest.mark.parametrize("model, shape, expected", [
    # 784-200-10: the paper's MNIST MLP.
    (models.MLP((200, 10)), MNIST, _dense(784, 200) + _dense(200, 10)),
    (models.MLP((200, 10)), DIGITS, _dense(64, 200) + _dense(200, 10)),
    # Two 2x2 pools: 28 -> 14 -> 7, 8 -> 4 -> 2, 32 -> 16 -> 8.
    (models.CNN(10), MNIST,
     _conv(1, 32) + _conv(32, 64) + _dense(7 * 7 * 64, 128) + _dense(128, 10)),
    (models.CNN(10), DIGITS,
     _conv(1, 32) + _conv(32, 64) + _dense(2 * 2 * 64, 128) + _dense(128, 10)),
    (models.CNN(100), CIFAR,
     _conv(3, 32) + _conv(32, 64) + _dense(8 * 8 * 64, 128) +
     _dense(128, 100)),
    # Configuration D: 64,64,M,128,128,M,256x3,M,512x3,M,512x3,M; 1x1x512 left.
    (models.vgg16(10), CIFAR,
     _conv(3, 64) + _conv(64, 64) + _conv(64, 128) + _conv(128, 128) +
     _conv(128, 256) + 2 * _conv(256, 256) + _conv(256, 512) +
     5 * _conv(512, 512) + 2 * _dense(512, 512) + _dense(512, 10)),
    (models.vgg8(100), CIFAR,
     _conv(3, 16) + _conv(16, 32) + _conv(32, 64) + _conv(64, 128) +
     _conv(128, 512) + 2 * _dense(512, 512) + _dense(512, 100)),
])
def test_parameter_counts(model, shape, expected):
  variables, out = _shapes(model, shape)
  assert _num_params(variables) == expected
  num_classes = model.features[-1] if isinstance(model, models.MLP) else (
      model.num_classes)
  assert out.shape == (2, num_classes)


def test_vgg16_parameter_count_is_the_known_number():
  # torchvision's vgg16 features have 14,714,688 weights; + 512-512-10 head.
  variables, _ = _shapes(models.vgg16(10), CIFAR, batch=1)
  assert _num_params(variables) == 14_714_688 + 262_656 + 262_656 + 5_130
  names = sorted(variables["params"])
  assert sum(n.startswith("Conv_") for n in names) == 13
  assert sum(n.startswith("Dense_") for n in names) == 3


@pytest.mark.parametrize("model, shape, ok", [
    (models.MLP((200, 10)), MNIST, True),
    (models.MLP((200, 10)), DIGITS, True),
    (models.MLP((200, 10)), CIFAR, True),
    (models.CNN(10), MNIST, True),
    (models.CNN(10), DIGITS, True),
    (models.CNN(10), CIFAR, True),
    (models.CNN(10, channels=(8, 8, 8, 8)), DIGITS, False),  # 8->4->2->1->?
    (models.vgg16(10), CIFAR, True),
    (models.vgg8(10), CIFAR, True),
    (models.vgg16(10), MNIST, False),  # 28->14->7->3->1->? (5 pools)
    (models.vgg8(10), DIGITS, False),
])
def test_output_shapes_or_clear_error_on_small_inputs(model, shape, ok):
  if ok:
    assert _shapes(model, shape, batch=3)[1].shape == (3, 10)
  else:
    with pytest.raises(ValueError, match="too small"):
      _shapes(model, shape, batch=3)


def test_flax_mlp_has_the_layout_of_mlp_init():
  x = jax.random.normal(jax.random.PRNGKey(1), (4,) + MNIST)
  variables = models.MLP((200, 10)).init(jax.random.PRNGKey(0), x)
  params = models.mlp_init(jax.random.PRNGKey(2), (784, 200, 10))
  assert jax.tree.map(np.shape, variables["params"]) == jax.tree.map(
      np.shape, params)
  logits = models.mlp_apply(params, x)
  np.testing.assert_allclose(models.MLP((200, 10)).apply({"params": params}, x),
                             logits, rtol=1e-5, atol=1e-6)


def test_vgg_conv_kernels_are_he_normal_over_fan_out():
  variables = jax.jit(models.vgg8(10).init)(jax.random.PRNGKey(0),
                                            jnp.ones((1,) + CIFAR))
  kernel = variables["params"]["Conv_4"]["kernel"]  # [3, 3, 128, 512]
  assert kernel.shape == (3, 3, 128, 512)
  np.testing.assert_allclose(float(jnp.std(kernel)), (2 / (9 * 512)) ** 0.5,
                             rtol=0.02)


def test_images_must_have_a_channel_axis():
  with pytest.raises(ValueError, match="channel"):
    models.CNN(10).init(jax.random.PRNGKey(0), jnp.ones((2, 28, 28)))


@pytest.mark.parametrize("make, match", [
    (lambda: models.MLP(()), "features"),
    (lambda: models.MLP((200, 0)), "features"),
    (lambda: models.CNN(0), "num_classes"),
    (lambda: models.CNN(10, channels=(32, -1)), "channels"),
    (lambda: models.VGG("vgg11"), "config"),
    (lambda: models.VGG(("M", "M")), "config"),
    (lambda: models.VGG("vgg8", num_classes=2.5), "num_classes"),
])
def test_models_reject_bad_configurations(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def _linear_apply(params, x):
  return x @ params


def _np_masked_ce(logits, y):
  logits = np.asarray(logits, np.float64)
  logp = logits - logits.max(1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(1, keepdims=True))
  valid = y >= 0
  return -np.mean(logp[valid, y[valid]])


def test_classifier_loss_ignores_padding_like_numpy():
  key_w, key_x = jax.random.split(jax.random.PRNGKey(0))
  params = jax.random.normal(key_w, (5, 4))
  x = jax.random.normal(key_x, (7, 5))
  y = np.array([0, 3, -1, 2, -1, 1, 3], np.int32)
  loss = models.classifier_loss(_linear_apply)
  np.testing.assert_allclose(loss(params, (x, y)),
                             _np_masked_ce(x @ params, y), rtol=1e-5)
  # Padded rows do not matter, whatever their inputs.
  x_other = x.at[np.array([2, 4])].set(1e3)
  np.testing.assert_allclose(loss(params, (x_other, y)), loss(params, (x, y)),
                             rtol=1e-6)
  g = jax.grad(loss)(params, (x_other, y))
  np.testing.assert_allclose(g, jax.grad(loss)(params, (x, y)), rtol=1e-5,
                             atol=1e-7)


def test_all_padding_client_has_zero_loss_and_gradient():
  params = jnp.ones((5, 4))
  x = jnp.ones((3, 5))
  y = jnp.full((3,), -1, jnp.int32)
  loss = models.classifier_loss(_linear_apply)
  value, grad = jax.value_and_grad(loss)(params, (x, y))
  assert float(value) == 0.0
  assert np.all(np.asarray(grad) == 0.0)
  out = models.classifier_eval(_linear_apply)(params, (x, y))
  assert float(out["accuracy"]) == 0.0 and float(out["loss"]) == 0.0


def test_classifier_eval_accuracy_by_hand():
  # Logits are the inputs: predicted classes 1, 0, 2, 2, 0 (ties -> lowest).
  logits = jnp.array([[0., 5., 1.], [2., 1., 0.], [0., 0., 3.], [1., 1., 2.],
                      [4., 4., 0.]])
  y = np.array([1, 2, 2, -1, 0], np.int32)  # right, wrong, right, pad, right.
  out = models.classifier_eval(lambda p, x: x)(None, (logits, y))
  np.testing.assert_allclose(out["accuracy"], 3 / 4)
  np.testing.assert_allclose(out["loss"], _np_masked_ce(logits, y), rtol=1e-5)


def test_classifier_loss_under_vmap_over_stacked_clients():
  model = models.MLP((16, 4))
  n, b = 3, 5
  key_x, key_p = jax.random.split(jax.random.PRNGKey(0))
  x = jax.random.normal(key_x, (n, b) + DIGITS)
  y = np.array([[0, 1, 2, 3, 0], [3, -1, 2, -1, -1], [-1] * 5], np.int32)
  params = models.init_stacked(model, jax.random.PRNGKey(1), x[0], n)
  # Make the clients differ.
  params = jax.tree.map(
      lambda p: p + 0.1 * jax.random.normal(key_p, p.shape), params)
  loss = models.classifier_loss(model.apply)
  stacked, grads = jax.jit(jax.vmap(jax.value_and_grad(loss)))(params, (x, y))
  for i in range(n):
    one = jax.tree.map(lambda p: p[i], params)
    logits = model.apply(one, x[i])
    expected = _np_masked_ce(logits, y[i]) if i < 2 else 0.0
    np.testing.assert_allclose(stacked[i], expected, rtol=2e-5, atol=1e-7)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_init_stacked_gives_every_client_the_same_model():
  model = models.CNN(10, channels=(2, 3), hidden=4)
  x = jnp.ones((7,) + DIGITS)
  params = models.init_stacked(model, jax.random.PRNGKey(3), x, 4)
  single = model.init(jax.random.PRNGKey(3), x[:1])
  for stacked, one in zip(jax.tree.leaves(params), jax.tree.leaves(single)):
    assert stacked.shape == (4,) + one.shape
    for i in range(4):
      np.testing.assert_array_equal(stacked[i], one)


@pytest.mark.parametrize("sample_x, num_clients, match", [
    (jnp.ones((2,) + DIGITS), 0, "num_clients"),
    (jnp.ones((2,) + DIGITS), 2.0, "num_clients"),
    (jnp.ones((0,) + DIGITS), 2, "sample_x"),
    (jnp.float32(1.0), 2, "sample_x"),
])
def test_init_stacked_rejects_bad_arguments(sample_x, num_clients, match):
  with pytest.raises(ValueError, match=match):
    models.init_stacked(models.CNN(10), jax.random.PRNGKey(0), sample_x,
                        num_clients)
