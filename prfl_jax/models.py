"""Models of the paper's experiments.

Two forms: the paper's MLP as pure functions of Flax-layout params, and Flax
linen modules (MLP, CNN, VGG-16, VGG-8) with masked classifier losses.
The multi-layer perceptron of the MNIST experiments (Werner et al., 2023,
§5.2: 784-200-10, ReLU) keeps its parameters as `flax.linen.Dense` does
(`{"Dense_0": {"kernel": [in, out], "bias": [out]}, ...}`, the names a compact
Flax MLP gets), so params trained with Flax can be used here and vice versa.
Its losses are plain `loss_fn(params, batch)` functions; Federated-Clustering's
ghost kernel finds their dense layers by itself (`prfl_jax.kernels.trace`).
"""

from typing import Any, Callable, Sequence

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.data import padded


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
  """Mean softmax cross-entropy of an MLP on one client's batch.

  Args:
    params: from `mlp_init`.
    batch: `(x [B, ...], y [B] int)`, or a `prfl.data.Padded` of it, whose
      padding rows do not count (nor do rows with a label < 0).
  """
  (x, y), mask = padded.unpad(batch)
  logp = jax.nn.log_softmax(mlp_apply(params, x))
  valid = y >= 0 if mask is None else (y >= 0) & mask
  picked = jnp.take_along_axis(logp, jnp.where(valid, y, 0)[:, None],
                               axis=1)[:, 0]
  return -jnp.sum(jnp.where(valid, picked, 0.0)) / jnp.maximum(
      jnp.sum(valid), 1)


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


# ----------------------------------------------------------------------------
# Flax linen models of the paper's experiments and their classifier losses.
#
# Written the way a Flax user writes them and used through pure
# `model.apply(variables, x)`; `init_stacked` gives every client the same
# initial variables (leaves `[N, ...]`), as in the paper's experiments.
# Images are NHWC (`[B, H, W, C]`), the layout `prfl_jax.data` returns.
# ----------------------------------------------------------------------------

# VGG configurations: conv widths, "M" = 2x2 max-pool with stride 2.
VGG_CONFIGS = {
    # Simonyan & Zisserman (2015), configuration D: 13 conv layers.
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512,
              "M", 512, 512, 512, "M"),
    # The authors' CIFAR-100 model (github.com/liehe/PRFL, cifar100/vgg.py,
    # `my_cfg["D"]`): 5 conv layers, each followed by a max-pool.
    "vgg8": (16, "M", 32, "M", 64, "M", 128, "M", 512, "M"),
}


def _check_features(features, name: str):
  features = tuple(features)
  if not features or any(
      not isinstance(f, (int, np.integer)) or isinstance(f, bool) or f < 1
      for f in features):
    raise ValueError(
        f"`{name}` must be a non-empty sequence of positive integers, got "
        f"{features!r}.")


def _check_images(x: jax.Array, model: str):
  if x.ndim != 4:
    raise ValueError(
        f"{model} takes images [batch, height, width, channels], got an input "
        f"of shape {x.shape}; add a channel axis to grey-scale images "
        "(x[..., None]).")


def _max_pool(x: jax.Array, model: str, min_size: int) -> jax.Array:
  """2x2 max-pool with stride 2 (floor, as torch.nn.MaxPool2d(2))."""
  if x.shape[1] < 2 or x.shape[2] < 2:
    raise ValueError(
        f"{model}: a 2x2 max-pool met a {x.shape[1]}x{x.shape[2]} feature map; "
        f"the input is too small for this model (it needs at least "
        f"{min_size}x{min_size} pixels).")
  return nn.max_pool(x, window_shape=(2, 2), strides=(2, 2))


class MLP(nn.Module):
  """ReLU multi-layer perceptron on flattened inputs.

  `MLP(features=(200, 10))` is the paper's 784-200-10 MNIST model (Werner et
  al., 2023, §5.2). Its params are `{"Dense_l": {"kernel", "bias"}}`, the
  layout of `mlp_init`.

  Attributes:
    features: output sizes of the dense layers; the last is the number of
      classes. ReLU between layers, none after the last.
  """
  features: Sequence[int] = (200, 10)

  def __post_init__(self):
    _check_features(self.features, "features")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """`x [B, ...]` (flattened to `[B, in]`) -> logits `[B, features[-1]]`."""
    x = x.reshape((x.shape[0], -1))
    for i, size in enumerate(self.features):
      x = nn.Dense(size)(x)
      if i < len(self.features) - 1:
        x = nn.relu(x)
    return x


class CNN(nn.Module):
  """Small convolutional network: two conv blocks and two dense layers.

  Each block is a 3x3 'SAME' convolution, ReLU and a 2x2 max-pool; then a
  dense ReLU layer and the output layer. On 28x28 inputs the feature map
  before the dense layers is 7x7x64, on 8x8 (scikit-learn's digits) 2x2x64.

  Attributes:
    num_classes: number of output logits.
    channels: output channels of the two conv layers.
    hidden: width of the hidden dense layer.
  """
  num_classes: int = 10
  channels: Sequence[int] = (32, 64)
  hidden: int = 128

  def __post_init__(self):
    validation.check_positive_int(self.num_classes, "num_classes")
    validation.check_positive_int(self.hidden, "hidden")
    _check_features(self.channels, "channels")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """`x [B, H, W, C]` -> logits `[B, num_classes]`."""
    _check_images(x, "CNN")
    min_size = 2 ** len(self.channels)
    for c in self.channels:
      x = nn.relu(nn.Conv(c, kernel_size=(3, 3), padding="SAME")(x))
      x = _max_pool(x, "CNN", min_size)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(self.num_classes)(x)


class VGG(nn.Module):
  """VGG network without batch normalisation (Simonyan & Zisserman, 2015).

  3x3 'SAME' convolutions with ReLU and 2x2 max-pools as the configuration
  says, then a `hidden` ReLU head and the output layer; on 32x32 CIFAR images
  the five pools leave a 1x1x512 map, so the head is 512-512-num_classes, as
  in the paper's CIFAR experiments (§5.3: VGG-16 on CIFAR-10, VGG-8 on
  CIFAR-100). Convolution kernels are He-normal over fan-out, as the authors'
  PyTorch code initialises them (`normal(0, sqrt(2 / (9 * out)))`); dense
  layers keep Flax's LeCun-normal. The authors' head also has dropout; this
  one does not, so `apply` stays a pure, deterministic function.

  Attributes:
    config: `"vgg16"`, `"vgg8"` (see `VGG_CONFIGS`) or a sequence of conv
      widths and `"M"` (max-pool).
    num_classes: number of output logits.
    hidden: widths of the hidden dense layers.
  """
  config: Any = "vgg16"
  num_classes: int = 10
  hidden: Sequence[int] = (512, 512)

  def __post_init__(self):
    layers = self.layers()
    if not any(v != "M" for v in layers):
      raise ValueError(f"`config` has no conv layer: {self.config!r}.")
    _check_features([v for v in layers if v != "M"], "config (conv widths)")
    validation.check_positive_int(self.num_classes, "num_classes")
    if self.hidden:
      _check_features(self.hidden, "hidden")
    super().__post_init__()

  def layers(self) -> tuple:
    """The configuration as a tuple of conv widths and "M"."""
    if isinstance(self.config, str):
      if self.config not in VGG_CONFIGS:
        raise ValueError(
            f"`config` must be one of {sorted(VGG_CONFIGS)} or a sequence of "
            f"conv widths and 'M', got {self.config!r}.")
      return VGG_CONFIGS[self.config]
    return tuple(self.config)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """`x [B, H, W, C]` -> logits `[B, num_classes]`."""
    _check_images(x, "VGG")
    layers = self.layers()
    min_size = 2 ** sum(v == "M" for v in layers)
    conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
    for v in layers:
      if v == "M":
        x = _max_pool(x, "VGG", min_size)
      else:
        x = nn.relu(nn.Conv(v, kernel_size=(3, 3), padding="SAME",
                            kernel_init=conv_init)(x))
    x = x.reshape((x.shape[0], -1))
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
    return nn.Dense(self.num_classes)(x)


def vgg16(num_classes: int = 10) -> VGG:
  """VGG-16 (configuration D, no batch norm), 512-512-num_classes head."""
  return VGG(config="vgg16", num_classes=num_classes)


def vgg8(num_classes: int = 100) -> VGG:
  """VGG-8: conv 16-32-64-128-512, each then max-pool; 512-512-num_classes."""
  return VGG(config="vgg8", num_classes=num_classes)


def _masked_cross_entropy(logits: jax.Array, y: jax.Array, mask=None):
  """Per-example softmax cross-entropy, 0 on rows that do not count.

  A row counts when `mask` (a `Padded` batch's) says it is real and its label
  is a class (>= 0; a negative id is no class, e.g. the label -1 that
  `federate` writes into test padding). Returns `(ce [B], counts [B] bool)`.
  """
  valid = y >= 0
  if mask is not None:
    valid = valid & mask
  ce = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), jnp.where(valid, y, 0))
  return jnp.where(valid, ce, 0.0), valid


def classifier_loss(apply_fn: Callable) -> Callable:
  """Mean softmax cross-entropy of one client, ignoring padded examples.

  Args:
    apply_fn: `apply_fn(params, x [B, ...]) -> logits [B, C]`, e.g.
      `model.apply` (then `params` is the variables dict `{"params": ...}`).

  Returns:
    `loss_fn(params, batch) -> scalar` for `batch = (x [B, ...], y [B] int)`
    or a `prfl.data.Padded` of it: the mean over the real rows (the mask's)
    with a class label (`y >= 0`); 0, with zero gradient, when there is none.
    Labels must be < C (not checked under jit).
  """
  def loss_fn(params, batch):
    (x, y), mask = padded.unpad(batch)
    ce, valid = _masked_cross_entropy(apply_fn(params, x), y, mask)
    return jnp.sum(ce) / jnp.maximum(jnp.sum(valid), 1)
  return loss_fn


def classifier_eval(apply_fn: Callable) -> Callable:
  """Accuracy and mean cross-entropy of one client, ignoring padding.

  Args:
    apply_fn: as in `classifier_loss`.

  Returns:
    `eval_fn(params, batch) -> {"accuracy": scalar, "loss": scalar}` for
    `batch = (x [T, ...], y [T] int)` or a `prfl.data.Padded` of it, over the
    real rows with `y >= 0` (both 0 when there is none). Accuracy counts
    `argmax(logits) == y` (ties: the lowest class).
  """
  def eval_fn(params, batch):
    (x, y), mask = padded.unpad(batch)
    logits = apply_fn(params, x)
    ce, valid = _masked_cross_entropy(logits, y, mask)
    count = jnp.maximum(jnp.sum(valid), 1)
    correct = valid & (jnp.argmax(logits, axis=-1) == y)
    return {"accuracy": jnp.sum(correct) / count, "loss": jnp.sum(ce) / count}
  return eval_fn


def init_stacked(model: nn.Module, key: jax.Array, sample_x: jax.Array,
                 num_clients: int):
  """One initial model copied to every client.

  Args:
    model: a Flax module, e.g. `CNN(num_classes=10)`.
    key: PRNG key of the initialisation.
    sample_x: `[B, ...]` example inputs (only `sample_x[:1]` is used, for the
      shapes), e.g. one client's training images.
    num_clients: number of clients N.

  Returns:
    the variables of `model.init(key, sample_x[:1])` with every leaf stacked
    to `[N, ...]`, all clients equal (the paper's experiments start every
    client from the same model); use them with `model.apply` under `vmap`.

  Raises:
    ValueError: if `num_clients < 1` or `sample_x` has no batch axis or an
      empty one.
  """
  validation.check_positive_int(num_clients, "num_clients")
  if np.ndim(sample_x) < 1 or np.shape(sample_x)[0] < 1:
    raise ValueError(
        f"`sample_x` must be a batch [B >= 1, ...] of example inputs, got "
        f"shape {np.shape(sample_x)}.")
  variables = model.init(key, jnp.asarray(sample_x[:1]))
  return tree_lib.broadcast(variables, num_clients)

