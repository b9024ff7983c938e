"""The kernel interface of the all-pairs engine, and the kernel registry.

A kernel computes, for one model `x_i`, Threshold-Clustering of the N clients'
gradients `{g_j(x_i)}_j` with one centre started at the owner's `g_i(x_i)`
(Werner et al., 2023, Algorithm 1, lines 6-7). It is two functions:

* `prepare(problem, params, analysis) -> ctx`: round-level work shared by all
  models (traced once per round, outside the map over models), e.g. the Gram
  matrices of layer inputs that do not depend on the model. `analysis` is the
  loss's `trace.Analysis`, done once when the plan was resolved (None unless
  the kernel says `needs_analysis` or the plan needed it).
* `cluster(problem, ctx, index, x_i) -> PairsOutput`: one model.

`register_kernel(name, Kernel(...))` makes `ExecutionPlan(kernel=name)` use
it; adding a kernel is one module (`gram.py`, `direct.py`, `ghost.py`). A
`Kernel` may also be given to `ExecutionPlan(kernel=...)` itself (a variant
of a registered kernel, e.g. `ghost.kernel(split=False)`).
"""

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from prfl_jax import clustering

PyTree = Any
# message_fn(honest_messages [N, ...], model_index, key) -> messages [N, ...]
MessageFn = Callable[[PyTree, jax.Array, jax.Array], PyTree]


class Problem(NamedTuple):
  """Everything one round's models share."""
  loss_fn: Callable  # loss_fn(params, batch) -> scalar, for one client.
  batch: PyTree  # leaves [N, B, ...].
  radius: clustering.Radius
  num_iters: int
  weights: jax.Array  # [N], 0 = padding.
  message_fn: Optional[MessageFn] = None
  key: Optional[jax.Array] = None


class PairsOutput(NamedTuple):
  """What `cluster_at_models` returns for every model i."""
  centers: PyTree  # leaves [M, ...]: Threshold-Clustering estimate v_i.
  own_loss: jax.Array  # [M]: f_i(x_i) on client i's batch.
  own_grad_norm: jax.Array  # [M]: ||g_i(x_i)||.
  inside: jax.Array  # [M, N] bool: client j inside model i's final ball.
  # [M, N] weight c_ij of client j's gradient in v_i = sum_j c_ij g_j(x_i)
  # (`owner_coefs`; None if the kernel does not give it).
  coefs: Optional[jax.Array] = None


class Kernel(NamedTuple):
  """One way to cluster the all-pairs gradients (see module docstring)."""
  prepare: Callable[[Problem, PyTree, Any], Any]
  cluster: Callable[[Problem, Any, jax.Array, PyTree], PairsOutput]
  # False: the kernel never builds the messages, so `message_fn` (an attack)
  # cannot be applied to them.
  accepts_messages: bool = True
  # True: `prepare` needs the loss's `trace.Analysis`.
  needs_analysis: bool = False


KERNELS = {}


def register_kernel(name: str, kernel: Kernel):
  """Makes `ExecutionPlan(kernel=name)` use `kernel`."""
  if not isinstance(kernel, Kernel):
    raise TypeError(f"`kernel` must be a kernels.Kernel, got {type(kernel)}.")
  KERNELS[name] = kernel


def owner_centred(gram: jax.Array, index: jax.Array):
  """Gram matrix of `g_j - g_i` from that of the `g_j`, and finiteness.

  `<g_j - g_i, g_k - g_i> = G_jk - G_ji - G_ik + G_ii`. In float32 this loses
  about `eps * ||g_i||^2` in each entry, which matters only when the spread of
  the gradients is below about 1e-3 of their norm.

  Args:
    gram: `[N, N]` Gram matrix of the clients' gradients.
    index: the owner i.

  Returns:
    `(centred [N, N], ok [N] bool)`: `ok[j]` iff `g_j - g_i` is finite (its
    diagonal entry is), which is how `gram_clustering_coefs` reads it.
  """
  col = gram[:, index]
  centred = gram - col[:, None] - col[None, :] + gram[index, index]
  return centred, jnp.isfinite(jnp.diagonal(centred))


def cluster_on_gram(problem: Problem, centred: jax.Array, ok: jax.Array):
  """Threshold-Clustering (one centre) from an owner-centred Gram matrix.

  Args:
    problem: the round's `Problem` (radius, steps, weights).
    centred: `[N, N]` Gram matrix of `z_j - v0`.
    ok: `[N]` bool, the finite points.

  Returns:
    `(a [N], info)`: the centre is `v0 + sum_j a_j (z_j - v0)` (`a_j = 0`
    where not `ok`); `info` is a one-centre `ClusteringInfo`.
  """
  coefs, info = clustering.gram_clustering_coefs(
      centred[None], problem.radius, problem.num_iters, problem.weights)
  return jnp.where(ok, coefs[0], 0.0), info


def owner_coefs(a: jax.Array, index: jax.Array) -> jax.Array:
  """`c` with `g_i + sum_j a_j (g_j - g_i) = sum_j c_j g_j` (owner i)."""
  return a + jax.nn.one_hot(index, a.shape[0], dtype=a.dtype) * (1.0 - a.sum())
