"""Tests of prfl_jax.models: the paper's MLP in flax.linen.Dense layout."""

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax import ghost
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
  logits, inputs = models.mlp_apply(params, x)
  np.testing.assert_allclose(
      logits, _FlaxMLP((200, 10)).apply({"params": params}, x), rtol=1e-5,
      atol=1e-6)
  np.testing.assert_array_equal(inputs["Dense_0"], x)
  np.testing.assert_allclose(
      inputs["Dense_1"], jax.nn.relu(x @ params["Dense_0"]["kernel"]),
      rtol=1e-6)
  # LeCun-normal kernels (std 1/sqrt(fan_in)), zero biases.
  assert abs(float(jnp.std(params["Dense_0"]["kernel"])) - 784**-0.5) < 2e-3
  assert not np.any(params["Dense_1"]["bias"])


def test_classifier_loss_is_cross_entropy_and_a_ghost_loss():
  params = models.mlp_init(jax.random.PRNGKey(0), (12, 7, 3))
  x = jax.random.normal(jax.random.PRNGKey(1), (6, 3, 4))  # Flattened to 12.
  y = jnp.array([0, 2, 1, 1, 0, 2])
  loss = models.mlp_classifier_loss(2)
  assert isinstance(loss, ghost.GhostLoss)
  assert loss.layers == ("Dense_0", "Dense_1")
  logits = _FlaxMLP((7, 3)).apply({"params": params}, x.reshape(6, -1))
  p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  expected = -np.mean(np.log(p[np.arange(6), y]))
  np.testing.assert_allclose(loss(params, (x, y)), expected, rtol=1e-5)
  # Taps are added to the layers' outputs; their gradient is dL/dh.
  taps = {"Dense_1": jnp.zeros((6, 3))}
  d = jax.grad(lambda t: loss.fn(params, (x, y), t)[0])(taps)["Dense_1"]
  onehot = np.eye(3)[y]
  np.testing.assert_allclose(d, (p - onehot) / 6, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("sizes", [(5,), (5, 0), (5, 2.5), ()])
def test_mlp_init_rejects_bad_sizes(sizes):
  with pytest.raises(ValueError, match="`sizes`"):
    models.mlp_init(jax.random.PRNGKey(0), sizes)
