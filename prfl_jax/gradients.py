"""Per-client and all-pairs gradients of a one-client loss.

Notation (Werner et al., 2023, Algorithm 1): client `j`'s stochastic gradient at
client `i`'s model is `g_j(x_i)`.

`loss_fn(params, batch) -> scalar` is written for ONE client: unstacked params
and that client's batch (leaves `[B, ...]`). Batching over clients and models is
done here, with `jax.vmap`, in one place. Clustering the all-pairs gradients of
a round (Federated-Clustering's inner loop) is `prfl_jax.kernels`.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib

PyTree = Any
LossFn = Callable[[PyTree, PyTree], jax.Array]


def check_loss_fn(loss_fn: LossFn, params: PyTree, batch: PyTree):
  """Checks, without compiling, that `loss_fn` maps one client to a scalar.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    params: stacked params, leaves `[N, ...]`.
    batch: stacked batch, leaves `[N, B, ...]`.

  Raises:
    TypeError: if `loss_fn` is not callable or does not return a real scalar.
    ValueError: if `params` and `batch` disagree on the number of clients.
  """
  if not callable(loss_fn):
    raise TypeError(f"`loss_fn` must be callable, got {type(loss_fn)}.")
  n = tree_lib.num_leading(params, "params")
  nb = tree_lib.num_leading(batch, "batch")
  if n != nb:
    raise ValueError(
        f"`params` has {n} clients but `batch` has {nb}; their leading axes "
        "must match.")
  one = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      np.shape(x)[1:], jnp.result_type(x)), t)
  try:
    out = jax.eval_shape(loss_fn, one(params), one(batch))
  except Exception as e:  # pylint: disable=broad-except
    raise TypeError(
        f"`loss_fn(params, batch)` failed on one client's params and batch: "
        f"{e}") from e
  if (not isinstance(out, jax.ShapeDtypeStruct) or out.shape != () or
      not jnp.issubdtype(out.dtype, jnp.floating)):
    raise TypeError(
        "`loss_fn(params, batch)` must return a real scalar for one client, "
        f"got {out}.")


def client_grads(loss_fn: LossFn, params: PyTree, batch: PyTree):
  """Every client's loss and gradient at its own model.

  Args:
    loss_fn: loss for one client.
    params: leaves `[N, ...]`.
    batch: leaves `[N, B, ...]`.

  Returns:
    `(losses [N], grads)`, grads leaves `[N, ...]`: `g_i(x_i)`.
  """
  return jax.vmap(jax.value_and_grad(loss_fn))(params, batch)


def all_pairs_grads(loss_fn: LossFn, params: PyTree, batch: PyTree):
  """`g_j(x_i)` for every model i and client j, as one nested vmap.

  Args:
    loss_fn: loss for one client.
    params: leaves `[M, ...]` (models).
    batch: leaves `[N, B, ...]` (clients).

  Returns:
    `(losses [M, N], grads)`, grads leaves `[M, N, ...]`, entry `[i, j]` is
    client j's loss / gradient at model i.
  """
  per_client = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0))
  return jax.vmap(per_client, in_axes=(0, None))(params, batch)
