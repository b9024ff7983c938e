"""Empirical constants of Assumptions 4 and 5 (Werner et al., 2023, §3.2, §5.1).

At client i's model `x_i`, with `f_bar_i` the mean loss of i's true cluster:

* intra-cluster ratio (eq. (exp-intra-cluster-variance)), bounded by `A^2`:
  `||grad f_i(x_i) - grad f_bar_i(x_i)||^2 / ||grad f_bar_i(x_i)||^2`;
* inter-cluster separation (eq. (exp-inter-cluster-variance), `D = 0`), bounded
  below by `Delta^2`: `min_{j not~ i} ||grad f_i(x_i) - grad f_j(x_i)||^2`.
"""

from typing import Any

import jax
import jax.numpy as jnp

from prfl_jax import gradients
from prfl_jax import tree as tree_lib

PyTree = Any


def assumption_constants(loss_fn, params: PyTree, batch: PyTree,
                         clusters: jax.Array) -> dict:
  """Per-client estimates of the quantities bounded by `A^2` and `Delta^2`.

  Args:
    loss_fn: loss for one client.
    params: leaves `[N, ...]`, client i's model.
    batch: leaves `[N, B, ...]` (full local data for exact gradients).
    clusters: `[N]` int true clusters.

  Returns:
    `{"intra_ratio": [N], "inter_sq_dist": [N], "cluster_grad_sq": [N]}`
    (`inter_sq_dist` is +inf for a client when every client is in its
    cluster; `cluster_grad_sq` is `||grad f_bar_i(x_i)||^2`, the ratio's
    denominator, which tells when the ratio is dominated by rounding).
  """
  _, grads = gradients.all_pairs_grads(loss_fn, params, batch)  # [N, N, ...]
  same = (clusters[:, None] == clusters[None, :]).astype(jnp.float32)
  weights = same / jnp.sum(same, axis=1, keepdims=True)

  def per_model(g, w, i, mask):
    mean = tree_lib.weighted_mean(g, w)
    own = jax.tree.map(lambda x: x[i], g)
    diff = jax.tree.map(jnp.subtract, own, mean)
    ratio = tree_lib.vdot(diff, diff) / tree_lib.vdot(mean, mean)
    d2 = tree_lib.sq_distances(jax.tree.map(lambda x: x[i][None], g), g)[0]
    return ratio, jnp.min(jnp.where(mask, jnp.inf, d2)), tree_lib.vdot(
        mean, mean)

  n = clusters.shape[0]
  ratio, inter, mean_sq = jax.vmap(per_model)(grads, weights, jnp.arange(n),
                                              same > 0)
  return {"intra_ratio": ratio, "inter_sq_dist": inter,
          "cluster_grad_sq": mean_sq}
