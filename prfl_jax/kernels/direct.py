"""The direct kernel: Threshold-Clustering on the materialised gradients.

Like the Gram kernel (`kernels.gram`), the N gradients at model i are
materialised, but every clustering step measures distances from the gradients
themselves (`clustering.threshold_clustering_with_info(method="direct")`,
`O(N P)` per step). It is the most literal reading of Algorithm 2 and a check
on the Gram algebra.
"""

import jax
import jax.numpy as jnp

from prfl_jax import clustering
from prfl_jax import tree as tree_lib
from prfl_jax.kernels import base
from prfl_jax.kernels import gram


def _prepare(problem, params, analysis):
  del problem, params, analysis
  return None


def _cluster(problem: base.Problem, ctx, index, x_i) -> base.PairsOutput:
  del ctx
  losses, grads = gram.client_losses_and_grads(problem.loss_fn, x_i,
                                               problem.batch)
  own = jax.tree.map(lambda g: g[index], grads)
  center, info = clustering.threshold_clustering_with_info(
      gram.messages(problem, index, grads),
      jax.tree.map(lambda g: g[None], own), radius=problem.radius,
      num_iters=problem.num_iters, weights=problem.weights)
  own_norm = jnp.sqrt(tree_lib.sq_norms(jax.tree.map(lambda g: g[None], own)))
  return base.PairsOutput(jax.tree.map(lambda c: c[0], center), losses[index],
                          own_norm[0], info.inside[0],
                          base.owner_coefs(info.coefs[0], index))


base.register_kernel("direct", base.Kernel(_prepare, _cluster))
