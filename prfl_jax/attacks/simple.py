"""The classic attacks: noise, scaling, sign flip, ALIE, IPM, mimic, NaN/Inf,
and label flipping (a data transform)."""

import jax
import jax.numpy as jnp
from jax.scipy import stats

from prfl_jax.attacks import base

Attack = base.Attack


def none() -> Attack:
  """No attack: Byzantine clients behave honestly."""
  def attack(messages, byzantine, key):
    del byzantine, key  # Unused.
    return messages
  return attack


def gaussian(scale: float = 100.0) -> Attack:
  """Byzantine clients send `N(0, scale^2 I)` noise."""
  def attack(messages, byzantine, key):
    leaves, treedef = jax.tree.flatten(messages)
    keys = jax.random.split(key, len(leaves))
    noise = [scale * jax.random.normal(k, x.shape, x.dtype)
             for k, x in zip(keys, leaves)]
    return base.replace(messages, byzantine, jax.tree.unflatten(treedef, noise))
  return attack


def large(scale: float = 1e4) -> Attack:
  """Large-gradient attack: `scale` times the client's honest message."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    return base.replace(messages, byzantine,
                    jax.tree.map(lambda m: scale * m, messages))
  return attack


def bit_flip() -> Attack:
  """Bit-flipping (sign-flipping) attack: the negated honest message."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    return base.replace(messages, byzantine, jax.tree.map(jnp.negative, messages))
  return attack


def alie(z: float | None = None) -> Attack:
  """A Little Is Enough: `mean - z * std` of the benign messages.

  Args:
    z: deviation in standard deviations. None uses Baruch et al.'s value
      `z = Phi^{-1}((N - s) / N)`, `s = floor(N/2 + 1) - f`, with `f` the
      number of Byzantine clients.
  """
  def attack(messages, byzantine, key):
    del key  # Unused.
    mean, std = base.benign_stats(messages, byzantine)
    if z is None:
      n = byzantine.shape[0]
      f = jnp.sum(byzantine)
      s = jnp.floor(n / 2 + 1) - f
      zz = stats.norm.ppf(jnp.clip((n - s) / n, 1e-6, 1 - 1e-6))
    else:
      zz = z
    bad = jax.tree.map(lambda mu, sd: mu - zz * sd, mean, std)
    return base.replace(messages, byzantine, bad)
  return attack


def ipm(epsilon: float = 0.1) -> Attack:
  """Inner-product manipulation: `-epsilon` times the benign mean."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    mean, _ = base.benign_stats(messages, byzantine)
    return base.replace(messages, byzantine,
                    jax.tree.map(lambda mu: -epsilon * mu, mean))
  return attack


def mimic() -> Attack:
  """Mimic: every Byzantine client copies the first benign client's message."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    target = jnp.argmax(~byzantine)
    return base.replace(messages, byzantine,
                    jax.tree.map(lambda m: m[target], messages))
  return attack


def non_finite(value: float = float("nan")) -> Attack:
  """Byzantine clients send NaN (or +-Inf) messages."""
  def attack(messages, byzantine, key):
    del key  # Unused.
    return base.replace(messages, byzantine,
                    jax.tree.map(lambda m: jnp.full((), value, m.dtype),
                                 messages))
  return attack


def flip_labels(labels: jax.Array, byzantine: jax.Array,
                num_classes: int) -> jax.Array:
  """Label-flipping data transform: `y -> num_classes - 1 - y` for Byzantine.

  Labels < 0 (padding, see `prfl_jax.data.federate`) stay as they are.

  Args:
    labels: `[N, M]` integer labels.
    byzantine: `[N]` bool mask.
    num_classes: number of classes.
  """
  flipped = jnp.where(labels >= 0, num_classes - 1 - labels, labels)
  return jnp.where(byzantine[:, None], flipped, labels)
