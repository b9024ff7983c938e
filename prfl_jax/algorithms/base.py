"""The `Algorithm(init, step)` interface shared by every method, and helpers.

Like optax's `GradientTransformation`, an algorithm is a NamedTuple of two pure
functions built by a lowercase factory that keeps hyperparameters in a closure:

  state = alg.init(params, byzantine=None)   # params leaves [N, ...]
  state, metrics = alg.step(state, batch, key)  # batch leaves [N, B, ...]
  state.params                               # personalized models [N, ...]

`metrics` is a dict of scalars (means over benign clients), so a run of rounds
is one `lax.scan`.

A step returns a state of the same shapes as its input, so
`jax.jit(alg.step, donate_argnums=0)` lets XLA write the new state (e.g. the
`[N, ...]` params) over the old one, which then must not be used again;
`prfl.train` donates each chunk's state this way.
"""

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from prfl_jax import tree as tree_lib
from prfl_jax import validation

PyTree = Any


class Algorithm(NamedTuple):
  """A federated algorithm as a pair of pure functions."""
  init: Callable[..., Any]
  step: Callable[[Any, PyTree, jax.Array], tuple]


class Layout(NamedTuple):
  """Which fields of an algorithm's state belong to which client.

  Every state class declares one as its `layout` class attribute, for
  partial participation (`prfl_jax.participation.cohort`): a round gathers
  the cohort's rows of the `clients` fields, steps, and scatters them back.
  `shared` fields are `[N, ...]` copies of one server value (FedAvg's global
  model): a cohort run keeps one copy. Every other field is server state
  (K cluster models, centres, the round counter) that the cohort's step
  updates as a whole.
  """
  clients: tuple  # fields with leaves [N, ...], one row per client.
  shared: tuple = ()  # fields with leaves [N, ...], all rows equal.


def byzantine_mask(byzantine, num_clients: int) -> jax.Array:
  """Validates and returns the `[N]` bool Byzantine mask (all False if None).

  Accepts bools, or integers / floats that are all 0 or 1 (a traced mask is
  checked by dtype only); anything else (0.2, 5, strings) is refused rather
  than cast to True.

  Raises:
    TypeError: if the mask is not of bool, integer or float dtype.
    ValueError: if its shape is not `[num_clients]`, or a concrete value is
      neither 0 nor 1.
  """
  if byzantine is None:
    return jnp.zeros((num_clients,), bool)
  if np.shape(byzantine) != (num_clients,):
    raise ValueError(
        f"`byzantine` must be a bool mask of shape [{num_clients}], got shape "
        f"{np.shape(byzantine)}.")
  dtype = getattr(byzantine, "dtype", None)
  if dtype is None:
    dtype = np.asarray(byzantine).dtype
  if not (dtype == bool or np.issubdtype(dtype, np.integer) or
          np.issubdtype(dtype, np.floating)):
    raise TypeError(
        f"`byzantine` must be a bool mask (True = malicious), got dtype "
        f"{dtype}.")
  if dtype != bool and not isinstance(byzantine, jax.core.Tracer):
    values = np.asarray(byzantine)
    bad = values[(values != 0) & (values != 1)]
    if bad.size:
      raise ValueError(
          "`byzantine` must be a bool mask; numbers are accepted only as 0 or "
          f"1, got {np.unique(bad)[:5].tolist()}.")
  return jnp.asarray(byzantine, bool)


def check_optimizer(optimizer):
  if not isinstance(optimizer, optax.GradientTransformation):
    raise TypeError(
        "`optimizer` must be an optax.GradientTransformation (e.g. "
        f"optax.sgd(0.1)), got {type(optimizer)}.")


check_positive_int = validation.check_positive_int


def check_at_most_clients(count: int, name: str, num_clients: int):
  """Raises ValueError if `count` (e.g. `num_groups`) exceeds N.

  Called by `init` and again by `step` (at trace time), since a cohort run
  steps on the C clients of a cohort rather than on all N.
  """
  if count > num_clients:
    raise ValueError(
        f"`{name}`={count} exceeds the number of clients N={num_clients} "
        "(with cohorts: the clients that arrive each round).")


def init_params(params: PyTree) -> int:
  """Validates stacked params and returns the number of clients N."""
  return tree_lib.num_leading(params, "params")


def apply_updates(optimizer: optax.GradientTransformation, directions: PyTree,
                  opt_state: PyTree, params: PyTree):
  """Per-client optimizer step `x_i <- x_i + optimizer(v_i)` (leaves `[N, ...]`)."""
  def one(d, s, p):
    updates, s = optimizer.update(d, s, p)
    return optax.apply_updates(p, updates), s
  return jax.vmap(one)(directions, opt_state, params)


def benign_mean(values: jax.Array, byzantine: jax.Array) -> jax.Array:
  """Mean of `[N]` values over benign clients; NaN when every client is
  Byzantine (no benign value to report, never a made-up 0)."""
  w = (~byzantine).astype(values.dtype)
  total = jnp.sum(w)
  return jnp.where(
      total > 0,
      jnp.sum(jnp.where(byzantine, 0.0, values)) / jnp.maximum(total, 1.0),
      jnp.nan)


def grad_norms(grads: PyTree) -> jax.Array:
  """`[N]` l2 norms of stacked gradients."""
  return jnp.sqrt(tree_lib.sq_norms(grads))


def attacked(attack: Optional[Callable], messages: PyTree,
             byzantine: jax.Array, key: jax.Array) -> PyTree:
  """Messages after Byzantine clients apply `attack` (unchanged if None)."""
  if attack is None:
    return messages
  return attack(messages, byzantine, key)


def split_batch(batch: PyTree, num_splits: int) -> PyTree:
  """`[N, B, ...]` -> `[num_splits, N, B / num_splits, ...]` micro-batches."""
  def split(x):
    n, b = x.shape[:2]
    if b % num_splits:
      raise ValueError(
          f"the batch size {b} must be divisible by `local_steps`="
          f"{num_splits}; each local step uses B / local_steps examples.")
    x = x.reshape((n, num_splits, b // num_splits) + x.shape[2:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)
