"""Explicit padding: a batch whose rows are partly not examples.

Clients own different numbers of examples, but a stack needs one shape, so a
client with fewer examples than a batch (or than the largest client, in a
dense `FederatedData`) fills the rest with padding rows. Which rows are real
is never read off the data's values (a label -1 can be a class): it is the
per-client count `FederatedData.num_examples`, and every batch drawn from such
data is a `Padded(examples, mask)` that tells the loss which rows to use.

  loss_fn(params, batch):                      # one client
    examples, mask = prfl.data.unpad(batch)    # mask [B] bool, or all True
    x, y = examples
    ...per-example losses..., then prfl.data.masked_mean(values, mask)

`prfl.models.classifier_loss`, `mlp_classifier_loss` and `classifier_eval`
do this already.
"""

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Padded:
  """Examples of which only `mask` rows are real.

  Attributes:
    examples: the user's batch pytree, leaves `[B, ...]` (one client) or
      `[N, B, ...]` (stacked).
    mask: bool `[B]` (or `[N, B]`): True for real examples, False for
      padding rows, whose values are arbitrary and must not count.
  """
  examples: PyTree
  mask: jax.Array

  def __iter__(self):
    raise TypeError(
        "this batch is a prfl.data.Padded(examples, mask): the federation "
        "has clients with fewer examples than the batch or than the largest "
        "client, and padding rows must not count in the loss. Read "
        "`examples, mask = prfl.data.unpad(batch)` and average with "
        "`prfl.data.masked_mean`, or use prfl.models.classifier_loss.")


def unpad(batch: PyTree):
  """`(examples, mask)` of a batch; mask is None for a plain batch.

  Args:
    batch: a `Padded`, or the user's pytree of examples (all rows real).

  Returns:
    `(examples, mask)`: mask bool `[B]`, or None when every row is real.
  """
  if isinstance(batch, Padded):
    return batch.examples, batch.mask
  return batch, None


def masked_mean(values: jax.Array, mask: Optional[jax.Array]) -> jax.Array:
  """Mean of per-example `values [B]` over the rows where `mask` is True.

  Padding rows count 0 even when their values are NaN or Inf; with no real
  row the mean is 0 (and so is its gradient). `mask=None`: the plain mean.
  """
  if mask is None:
    return jnp.mean(values)
  total = jnp.sum(jnp.where(mask, values, 0.0))
  return total / jnp.maximum(jnp.sum(mask), 1).astype(total.dtype)


def example_mask(num_examples: jax.Array, width: int) -> jax.Array:
  """bool `[N, width]`: row j of client i is real iff `j < num_examples[i]`."""
  return jnp.arange(width)[None, :] < jnp.asarray(num_examples)[:, None]


def check_num_examples(num_examples, num_clients: int, width: int):
  """Validates `FederatedData.num_examples` (concrete values only).

  Raises:
    ValueError: unless it is an integer array `[num_clients]` with every
      count in `[1, width]`; a count of 0 is an empty client, which has no
      loss to train on.
  """
  shape, dtype = np.shape(num_examples), getattr(num_examples, "dtype", None)
  if shape != (num_clients,) or dtype is None or not np.issubdtype(
      dtype, np.integer):
    raise ValueError(
        f"`num_examples` must be an integer array [{num_clients}] (real "
        f"training examples per client), got {dtype} of shape {shape}.")
  if isinstance(num_examples, jax.core.Tracer):
    return
  counts = np.asarray(num_examples)
  empty = np.flatnonzero(counts < 1)
  if empty.size:
    raise ValueError(
        f"`num_examples` gives client(s) {empty[:10].tolist()} no training "
        "example; every client needs at least one (drop empty clients).")
  if counts.max() > width:
    raise ValueError(
        f"`num_examples` has a count {counts.max()} larger than the {width} "
        "rows of `train`.")
