"""Models as users write them, shared by the benchmarks.

MLPs of the paper's MNIST shape (784-200-10, ReLU, softmax cross-entropy):
`user_loss` in plain JAX (a dict of arrays, `x @ w1 + b1`, optax's
cross-entropy, as issue 21's user wrote it), `flax_loss` (two
`flax.linen.Dense`), `eqx_loss` (`equinox.nn.MLP`, split into arrays and
static parts as Equinox users do for functional training) and the library's
`prfl.models.mlp_classifier_loss` (`LOSSES["library"]`).

CNNs (`Spec`, `SPECS`): Flax linen modules, 3x3 convolutions with SAME
padding, each followed by ReLU and a 2x2 max-pool, then dense layers; the
loss is `optax.softmax_cross_entropy_with_integer_labels` of `model.apply`.
"""

import dataclasses
from typing import Sequence

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import common


def user_loss(p, batch):
  """The MNIST MLP's loss as a user writes it (params a flat dict)."""
  x, y = batch
  h = jax.nn.relu(x @ p["w1"] + p["b1"])
  logits = h @ p["w2"] + p["b2"]
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


class FlaxMLP(nn.Module):
  """784-200-10 with `flax.linen.Dense` (params: Dense_0, Dense_1)."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(common.HIDDEN)(x))
    return nn.Dense(common.OUT_DIM)(x)


def flax_loss(params, batch):
  x, y = batch
  logits = FlaxMLP().apply({"params": params}, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def to_user(params):
  return {"w1": params["Dense_0"]["kernel"], "b1": params["Dense_0"]["bias"],
          "w2": params["Dense_1"]["kernel"], "b2": params["Dense_1"]["bias"]}


def from_user(p):
  return {"Dense_0": {"kernel": p["w1"], "bias": p["b1"]},
          "Dense_1": {"kernel": p["w2"], "bias": p["b2"]}}


# name -> (loss_fn, library params -> its params, its centres -> library).
LOSSES = {
    "library": (common.mlp_loss, lambda p: p, lambda c: c),
    "user": (user_loss, to_user, from_user),
    "flax": (flax_loss, lambda p: p, lambda c: c),
}


def eqx_mlp(key):
  """One `equinox.nn.MLP` 784-200-10 (ReLU)."""
  return eqx.nn.MLP(common.IN_DIM, common.OUT_DIM, common.HIDDEN, depth=1,
                    activation=jax.nn.relu, key=key)


def eqx_federation(num_clients: int, batch_size: int, seed: int = 0):
  """`(loss_fn, params [N, ...], batch)` of N Equinox MLPs.

  As Equinox users train functionally: `params, static =
  eqx.partition(model, eqx.is_array)`, and the loss recombines them.
  """
  keys = jax.random.split(jax.random.key(seed), num_clients)
  models = eqx.filter_vmap(eqx_mlp)(keys)
  params, static = eqx.partition(models, eqx.is_array)

  def loss_fn(params, batch):
    x, y = batch
    model = eqx.combine(params, static)
    logits = jax.vmap(model)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  _, batch = common.mnist_like_federation(num_clients, batch_size, seed)
  return loss_fn, params, batch


@dataclasses.dataclass(frozen=True)
class Spec:
  """A CNN: 3x3 convs each followed by ReLU and a 2x2 max-pool, then MLP."""
  name: str
  image: tuple  # (H, W, C)
  convs: tuple  # output channels
  dense: tuple  # hidden widths
  classes: int

  def scaled(self, divisor: int) -> "Spec":
    """The same network with every width divided by `divisor` (>= 1)."""
    div = lambda ws: tuple(max(1, w // divisor) for w in ws)
    return dataclasses.replace(self, convs=div(self.convs),
                               dense=div(self.dense))


SPECS = {
    "cnn": Spec("cnn", (28, 28, 1), (32, 64), (256,), 10),
    # The user CNN of issue 21: conv 16 - pool - conv 32 - pool - dense 64.
    "cnn_small": Spec("cnn_small", (28, 28, 1), (16, 32), (64,), 10),
    "vgg8": Spec("vgg8", (32, 32, 3), (64, 128, 256, 512, 512), (512, 512),
                 100),
}


class ConvNet(nn.Module):
  """The Flax model of a `Spec`, as a user writes it."""
  convs: Sequence[int]
  dense: Sequence[int]
  classes: int

  @nn.compact
  def __call__(self, x):
    for c in self.convs:
      x = nn.relu(nn.Conv(c, (3, 3))(x))
      x = nn.max_pool(x, (2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    for h in self.dense:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.classes)(x)


def make_loss(spec: Spec):
  """`loss_fn(params, (images [B, H, W, C], labels [B]))`, as a user writes it."""
  model = ConvNet(spec.convs, spec.dense, spec.classes)

  def loss_fn(params, batch):
    images, labels = batch
    logits = model.apply(params, images)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, labels).mean()

  return model, loss_fn


def federation(spec: Spec, num_clients: int, batch_size: int, seed: int):
  """Stacked Flax params (one init per client) and random images and labels."""
  model, _ = make_loss(spec)
  keys = jax.random.split(jax.random.key(seed), num_clients)
  params = jax.jit(jax.vmap(lambda k: model.init(
      k, jnp.zeros((1,) + spec.image, jnp.float32))))(keys)
  rng = np.random.default_rng(seed)
  images = rng.random((num_clients, batch_size) + spec.image,
                      dtype=np.float32)
  labels = rng.integers(0, spec.classes, (num_clients, batch_size),
                        dtype=np.int32)
  return params, (jnp.asarray(images), jnp.asarray(labels))


def flat_centers(centers) -> np.ndarray:
  """`[N, P]`, leaves in `jax.tree` order."""
  leaves = jax.tree.leaves(centers)
  n = leaves[0].shape[0]
  return np.concatenate([np.asarray(l).reshape(n, -1) for l in leaves], 1)
