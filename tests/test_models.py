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
