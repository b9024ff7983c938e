"""Models of the paper's experiments, as pure functions of Flax-layout params.

The multi-layer perceptron of the MNIST experiments (Werner et al., 2023,
§5.2: 784-200-10, ReLU) keeps its parameters as `flax.linen.Dense` does
(`{"Dense_0": {"kernel": [in, out], "bias": [out]}, ...}`, the names a compact
Flax MLP gets), so params trained with Flax can be used here and vice versa.
Its losses are plain `loss_fn(params, batch)` functions; Federated-Clustering's
ghost kernel finds their dense layers by itself (`prfl_jax.kernels.trace`).
"""

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def layer_names(num_layers: int) -> tuple:
  """`("Dense_0", ..., "Dense_{num_layers - 1}")`."""
  return tuple(f"Dense_{i}" for i in range(num_layers))


def mlp_init(key: jax.Array, sizes: Sequence[int]) -> dict:
  """One MLP's params, initialised as `flax.linen.Dense` does.

  Args:
    key: PRNG key.
    sizes: `(in, hidden..., out)`, e.g. `(784, 200, 10)`.

  Returns:
    `{"Dense_l": {"kernel": [sizes[l], sizes[l + 1]], "bias": [sizes[l + 1]]}}`
    with LeCun-normal kernels and zero biases.

  Raises:
    ValueError: if `sizes` has fewer than two entries or a non-positive one.
  """
  sizes = tuple(sizes)
  if len(sizes) < 2 or any(
      not isinstance(s, (int, np.integer)) or s < 1 for s in sizes):
    raise ValueError(
        f"`sizes` must be at least two positive integers (in, ..., out), got "
        f"{sizes}.")
  keys = jax.random.split(key, len(sizes) - 1)
  init = jax.nn.initializers.lecun_normal()
  return {name: {"kernel": init(k, (d_in, d_out), jnp.float32),
                 "bias": jnp.zeros((d_out,), jnp.float32)}
          for name, k, d_in, d_out in zip(layer_names(len(sizes) - 1), keys,
                                          sizes[:-1], sizes[1:])}


def mlp_apply(params: dict, x: jax.Array) -> jax.Array:
  """ReLU MLP on flattened inputs.

  Args:
    params: from `mlp_init`.
    x: `[B, ...]`, flattened to `[B, in]`.

  Returns:
    logits `[B, out]`.
  """
  names = layer_names(len(params))
  h = x.reshape(x.shape[0], -1)
  for i, name in enumerate(names):
    h = h @ params[name]["kernel"] + params[name]["bias"]
    if i < len(names) - 1:
      h = jax.nn.relu(h)
  return h


def softmax_cross_entropy(params: dict, batch) -> jax.Array:
  """Mean softmax cross-entropy of an MLP on one client's `(x [B, ...], y [B])`."""
  x, y = batch
  logp = jax.nn.log_softmax(mlp_apply(params, x))
  return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def mlp_classifier_loss(num_layers: int):
  """`loss_fn(params, batch)` of an MLP with `num_layers` dense layers.

  Args:
    num_layers: number of dense layers (2 for the paper's 784-200-10 MLP);
      the params must have exactly that many (`mlp_init`).

  Returns:
    `softmax_cross_entropy`, checking the number of layers.

  Raises:
    ValueError: if `num_layers` is not a positive integer.
  """
  if not isinstance(num_layers, (int, np.integer)) or num_layers < 1:
    raise ValueError(
        f"`num_layers` must be a positive integer, got {num_layers!r}.")

  def loss(params, batch):
    if len(params) != num_layers:
      raise ValueError(
          f"`params` must have {num_layers} dense layers "
          f"{layer_names(num_layers)}, got {sorted(params)}.")
    return softmax_cross_entropy(params, batch)
  return loss
