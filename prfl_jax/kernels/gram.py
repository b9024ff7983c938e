"""The Gram kernel: materialised per-client gradients and their Gram matrix.

For model i, the N gradients `g_j(x_i)` are computed by plain autodiff
(`vmap` of `value_and_grad` over clients, leaves `[N, ...]`), centred at the
owner's `g_i(x_i)` (one elementwise pass), and Threshold-Clustering runs on the
`[N, N]` Gram matrix of the centred gradients (one GEMM per leaf; every
clustering step is then `O(N^2)`, independent of the model size), and the
centre is one `[N] x [N, P]` product. A message that is not finite shows up as
a non-finite diagonal entry of the Gram matrix, so no separate finiteness pass
over the gradients is needed. This kernel works for every loss and every
attack (`message_fn`), and is the reference of the faster ghost kernel.
"""

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax.kernels import base


def centred_gram(points, center):
  """Points centred at `v0`, their Gram matrix and finiteness.

  A point with a NaN or Inf coordinate, or whose squared distance to `v0`
  overflows, has a non-finite Gram diagonal entry; that is how finiteness is
  read, without another pass over the `[N, P]` points.

  Args:
    points: pytree, every leaf `[N, ...]`.
    center: unstacked pytree of the same structure, `v0`.

  Returns:
    `(centred, gram, ok)`: `centred` leaves `[N, ...]` are `z_i - v0`; `gram`
    `[N, N]` their Gram matrix (rows of points that are not `ok` hold NaN/Inf,
    which `clustering.gram_clustering_coefs` reads as "outside every ball");
    `ok` `[N]` bool.
  """
  centred = jax.tree.map(lambda z, v: z - v[None], points, center)
  gram = tree_lib.gram(centred)
  return centred, gram, jnp.isfinite(jnp.diagonal(gram))


def combine_centred(coefs, centred, ok, center):
  """`v0 + sum_i coefs[i] * (z_i - v0)` over the `ok` points (unstacked)."""
  return jax.tree.map(lambda v, s: v + s, center,
                      tree_lib.masked_combination(coefs, centred, ok))


def client_losses_and_grads(loss_fn, x_i, batch):
  """`(losses [N], grads [N, ...])`: every client's loss and gradient at `x_i`."""
  return jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0))(x_i, batch)


def messages(problem: base.Problem, index, grads):
  """The gradients model `index` receives (after `message_fn`, if any)."""
  if problem.message_fn is None:
    return grads
  return problem.message_fn(grads, index,
                            jax.random.fold_in(problem.key, index))


def _prepare(problem, params, analysis):
  del problem, params, analysis
  return None


def _cluster(problem: base.Problem, ctx, index, x_i) -> base.PairsOutput:
  del ctx
  losses, grads = client_losses_and_grads(problem.loss_fn, x_i, problem.batch)
  own = jax.tree.map(lambda g: g[index], grads)
  centred, gram, ok = centred_gram(messages(problem, index, grads), own)
  a, info = base.cluster_on_gram(problem, gram, ok)
  center = combine_centred(a, centred, ok, own)
  own_norm = jnp.sqrt(tree_lib.sq_norms(jax.tree.map(lambda g: g[None], own)))
  return base.PairsOutput(center, losses[index], own_norm[0], info.inside[0],
                          base.owner_coefs(a, index))


base.register_kernel("gram", base.Kernel(_prepare, _cluster))
