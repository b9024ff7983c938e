"""How well a clustering matches the truth, and how far apart its centres are.

Jit-safe versions of the adjusted Rand index and the normalised mutual
information (arithmetic mean of the entropies), read off a weighted
contingency table `[K_true, K_pred]` built with one matmul of one-hot labels,
so the label counts are static and nothing loops over clients. Both follow
scikit-learn's definitions and special cases (`adjusted_rand_score`,
`normalized_mutual_info_score`); a weight of 0 leaves a client out (e.g. a
Byzantine client, whose true cluster means nothing).
"""

from typing import Any

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib

PyTree = Any


def contingency(true_labels: jax.Array, pred_labels: jax.Array, *,
                num_true: int, num_pred: int, weights=None) -> jax.Array:
  """`C[a, b]` = total weight of the clients with true label a, predicted b.

  Args:
    true_labels: `[N]` int in `[0, num_true)`.
    pred_labels: `[N]` int in `[0, num_pred)`.
    num_true, num_pred: static label counts.
    weights: optional `[N]` non-negative weights (default 1).

  Returns:
    `[num_true, num_pred]` float32.
  """
  w = (jnp.ones(true_labels.shape, jnp.float32) if weights is None else
       jnp.asarray(weights, jnp.float32))
  t = jax.nn.one_hot(true_labels, num_true, dtype=jnp.float32) * w[:, None]
  p = jax.nn.one_hot(pred_labels, num_pred, dtype=jnp.float32)
  return jnp.matmul(t.T, p, precision=lax.Precision.HIGHEST)


def _pairs(x: jax.Array) -> jax.Array:
  """`x choose 2`, elementwise."""
  return 0.5 * x * (x - 1.0)


def adjusted_rand_index(table: jax.Array) -> jax.Array:
  """Adjusted Rand index (Hubert and Arabie, 1985) of a contingency table.

  With pair counts `tp` (same cluster in both), `fn` (same true cluster,
  different prediction), `fp` and `tn`:
  `ARI = 2 (tp tn - fn fp) / ((tp + fn)(fn + tn) + (tp + fp)(fp + tn))`,
  and 1 when `fn = fp = 0` (scikit-learn's convention).

  Args:
    table: `[K_true, K_pred]` counts (`contingency`).

  Returns:
    scalar float32 in [-1, 1].
  """
  n = jnp.sum(table)
  tp = jnp.sum(_pairs(table))
  same_true = jnp.sum(_pairs(jnp.sum(table, axis=1)))
  same_pred = jnp.sum(_pairs(jnp.sum(table, axis=0)))
  fn, fp = same_true - tp, same_pred - tp
  tn = _pairs(n) - tp - fn - fp
  denom = (tp + fn) * (fn + tn) + (tp + fp) * (fp + tn)
  perfect = (fn == 0) & (fp == 0)
  ari = 2.0 * (tp * tn - fn * fp) / jnp.where(denom == 0, 1.0, denom)
  return jnp.where(perfect | (denom == 0), 1.0, ari)


def _entropy(counts: jax.Array, n: jax.Array) -> jax.Array:
  p = counts / jnp.where(n > 0, n, 1.0)
  return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)),
                            0.0))


def normalized_mutual_info(table: jax.Array) -> jax.Array:
  """NMI with the arithmetic mean of the two entropies as normaliser.

  `NMI = I(T; P) / ((H(T) + H(P)) / 2)`; 1 when both labellings have one
  class (or none), 0 when the mutual information is 0 (scikit-learn's
  conventions).

  Args:
    table: `[K_true, K_pred]` counts (`contingency`).

  Returns:
    scalar float32 in [0, 1].
  """
  n = jnp.sum(table)
  rows, cols = jnp.sum(table, axis=1), jnp.sum(table, axis=0)
  outer = rows[:, None] * cols[None, :]
  ratio = n * table / jnp.where(outer > 0, outer, 1.0)
  mi = jnp.sum(jnp.where(table > 0, table / jnp.where(n > 0, n, 1.0) *
                         jnp.log(jnp.where(table > 0, ratio, 1.0)), 0.0))
  mi = jnp.maximum(mi, 0.0)
  h = 0.5 * (_entropy(rows, n) + _entropy(cols, n))
  trivial = (jnp.sum(rows > 0) <= 1) & (jnp.sum(cols > 0) <= 1)
  nmi = jnp.clip(mi / jnp.where(h > 0, h, 1.0), 0.0, 1.0)
  return jnp.where(trivial, 1.0, jnp.where(h > 0, nmi, 0.0))


def assignment_stats(assignment: jax.Array, true_clusters: jax.Array, *,
                     num_pred: int, num_true: int, rows: jax.Array) -> dict:
  """`{"ari", "nmi"}` of an assignment against the true clusters.

  Args:
    assignment: `[N]` int predicted clusters in `[0, num_pred)`.
    true_clusters: `[N]` int true clusters in `[0, num_true)`.
    num_pred, num_true: static label counts.
    rows: `[N]` bool, the clients that count (e.g. the benign ones).
  """
  table = contingency(true_clusters, assignment, num_true=num_true,
                      num_pred=num_pred, weights=rows)
  return {"ari": adjusted_rand_index(table),
          "nmi": normalized_mutual_info(table)}


def center_stats(centers: PyTree, *, rtol: float = 1e-3) -> dict:
  """Pairwise distances between K centres and how many of them are distinct.

  Centres k and j coincide when `||c_k - c_j|| <= rtol * max(||c_k||,
  ||c_j||)`; centre k counts as distinct when it coincides with no centre of
  lower index.

  Args:
    centers: pytree, every leaf `[K, ...]`.
    rtol: relative tolerance of "coincide".

  Returns:
    `{"center_dist_min", "center_dist_mean", "distinct_centers"}` (float32
    scalars; the distances are over pairs k != j, 0 when K = 1).
  """
  k = tree_lib.num_leading(centers, "centers")
  d = jnp.sqrt(jnp.maximum(tree_lib.sq_distances(centers, centers), 0.0))
  norms = jnp.sqrt(tree_lib.sq_norms(centers))
  off = ~jnp.eye(k, dtype=bool)
  coincide = off & (d <= rtol * jnp.maximum(norms[:, None], norms[None, :]))
  lower = jnp.tril(coincide, k=-1)  # [k, j]: j < k coincides with k.
  pairs = max(k * (k - 1), 1)
  return {
      "center_dist_min": jnp.min(jnp.where(off, d, jnp.inf)) if k > 1 else
                         jnp.zeros((), d.dtype),
      "center_dist_mean": jnp.sum(jnp.where(off, d, 0.0)) / pairs,
      "distinct_centers": jnp.sum(~jnp.any(lower, axis=1)).astype(
          jnp.float32),
  }
