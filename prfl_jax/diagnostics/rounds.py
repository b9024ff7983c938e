"""Per-round clustering diagnostics, as the algorithms' step metrics.

Algorithms get the true clusters through their factory's optional
`true_clusters` argument (`check_true_clusters`), so `init(params, *,
byzantine=None)` keeps its one signature; `init` checks the size
(`check_num_clients`). Without the truth only the truth-free diagnostics
are reported (effective count, own weight, centre distances).

Two families:
* `assignment_stats`: methods that give every client one of K centres
  (Myopic- and Momentum-Clustering: Threshold-Clustering centres with their
  weights; IFCA, HypCluster, Clustered FL: uniform averages over members);
* `group_stats`: Federated-Clustering, where every client i clusters the
  messages of its group at its own model.
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax.diagnostics import partition
from prfl_jax.diagnostics import weights as weights_lib

PyTree = Any


class Truth(NamedTuple):
  """The true clusters, known to the experimenter only."""
  clusters: jax.Array  # [N] int32 true cluster of every client.
  num_clusters: int  # static: max(clusters) + 1.


def check_true_clusters(true_clusters) -> Optional[Truth]:
  """Validates a factory's `true_clusters` argument.

  Args:
    true_clusters: None, or a concrete `[N]` array of non-negative integer
      cluster ids.

  Returns:
    a `Truth`, or None.

  Raises:
    ValueError: if it is not a 1-D array of non-negative integers.
  """
  if true_clusters is None:
    return None
  if isinstance(true_clusters, jax.core.Tracer):
    raise ValueError("`true_clusters` must be concrete (an array known when "
                     "the algorithm is built), not a traced value.")
  c = np.asarray(true_clusters)
  if c.ndim != 1 or c.size == 0 or c.dtype.kind not in "iu" or c.min() < 0:
    raise ValueError(
        "`true_clusters` must be a non-empty 1-D array of non-negative "
        f"integer cluster ids, got shape {c.shape} dtype {c.dtype}.")
  return Truth(jnp.asarray(c, jnp.int32), int(c.max()) + 1)


def check_num_clients(truth: Optional[Truth], num_clients: int):
  """Raises ValueError unless `truth` (if any) has one id per client."""
  if truth is not None and truth.clusters.shape[0] != num_clients:
    raise ValueError(
        f"`true_clusters` has {truth.clusters.shape[0]} entries but there "
        f"are N={num_clients} clients.")


def assignment_stats(assignment: jax.Array, num_clusters: int,
                     byzantine: jax.Array, truth: Optional[Truth], *,
                     coefs: Optional[jax.Array] = None,
                     row_coefs: Optional[jax.Array] = None,
                     centers=None) -> dict:
  """Diagnostics of a round that sent client i the centre of its cluster.

  Args:
    assignment: `[N]` int cluster of every client, in `[0, num_clusters)`.
    num_clusters: K (static).
    byzantine: `[N]` bool.
    truth: the true clusters, or None.
    coefs: optional `[K, N]` weight of message j in centre k; None: the
      uniform average over each cluster's members.
    row_coefs: optional `[N, N]` weight of message j in client i's
      direction (overrides `coefs`).
    centers: optional centres, leaves `[K, ...]`, for their distances.

  Returns:
    dict of float32 scalars (`weights.combination_stats` over benign
    clients, `partition.center_stats`, and with the truth `"ari"`, `"nmi"`).
  """
  n = assignment.shape[0]
  rows = ~byzantine
  if row_coefs is None:
    row_coefs = (weights_lib.membership_coefs(assignment, num_clusters)
                 if coefs is None else coefs[assignment])
  own = jnp.eye(n, dtype=bool)
  same = byz = None
  if truth is not None:
    same, byz = weights_lib.truth_masks(truth.clusters, truth.clusters,
                                        byzantine)
  out = weights_lib.combination_stats(row_coefs, own, rows, same=same,
                                      byzantine=byz)
  if centers is not None:
    out.update(partition.center_stats(centers))
  if truth is not None:
    out.update(partition.assignment_stats(
        assignment, truth.clusters, num_pred=num_clusters,
        num_true=truth.num_clusters, rows=rows))
  return out


def _spreads(points: PyTree, truth: Truth, rows: jax.Array):
  """`(spread [K_true], means [K_true, ...], d2 [N, K_true], present
  [K_true])` of `cluster_spreads`, with what `separation_stats` reuses."""
  k = truth.num_clusters
  w = rows.astype(jnp.float32)
  onehot = jax.nn.one_hot(truth.clusters, k, dtype=jnp.float32) * w[:, None]
  sizes = jnp.sum(onehot, axis=0)  # [K_true]
  present = sizes > 0
  # Uncounted points (a Byzantine inf or NaN) are zeroed before any sum.
  points = tree_lib.where(rows, points, jax.tree.map(jnp.zeros_like, points))
  means = tree_lib.combine(onehot.T / jnp.where(present, sizes, 1.0)[:, None],
                           points)
  d2 = jnp.maximum(tree_lib.sq_distances(points, means), 0.0)  # [N, K_true]
  own = jnp.take_along_axis(d2, truth.clusters[:, None], axis=1)[:, 0]
  spread = jnp.sqrt(jax.ops.segment_sum(own * w, truth.clusters, k) /
                    jnp.where(present, sizes, 1.0))
  return spread, means, d2, present


def cluster_spreads(points: PyTree, truth: Truth,
                    rows: jax.Array) -> jax.Array:
  """`[K_true]`: every true cluster's root-mean-square distance of its
  counted points to their mean (0 for a cluster without one), of which
  `separation_stats`' `sep_spread` is the maximum.

  Args:
    points: pytree, every leaf `[N, ...]`.
    truth: the true clusters (`[N]` ids, K_true static).
    rows: `[N]` bool, the points that count (the benign clients).
  """
  return _spreads(points, truth, rows)[0]


def separation_stats(points: PyTree, truth: Truth, rows: jax.Array) -> dict:
  """How far the true clusters' points are apart, against their spread.

  The empirical counterparts of Assumptions 8-9 (Werner et al., 2023,
  analysis of Momentum-Clustering: the momenta of one cluster i.i.d., the
  expected momenta of two clusters at least Delta apart) at this round's points (the messages a
  Momentum-Clustering server clusters). With `mu_c` the mean of true
  cluster c's counted points:

  * `sep_spread`: `max_c sqrt(mean_{i in c} ||p_i - mu_c||^2)`, the largest
    root-mean-square spread of a cluster around its mean (sigma);
  * `sep_delta`: `min_{c != c'} ||mu_c - mu_c'||` (Delta); +inf when fewer
    than two clusters have a counted point;
  * `sep_ari`: the ARI against the truth of the assignment of every
    counted point to its nearest true mean. Below 1, even the true clusters'
    means as centres put some points in another cluster: the truth is not a
    fixed point of nearest-centre assignment (one Lloyd step from it moves
    clients), so an assignment by nearest centre cannot settle on it.

  Args:
    points: pytree, every leaf `[N, ...]`.
    truth: the true clusters (`[N]` ids, K_true static).
    rows: `[N]` bool, the points that count (the benign clients).

  Returns:
    `{"sep_spread", "sep_delta", "sep_ari"}`, float32 scalars.
  """
  k = truth.num_clusters
  w = rows.astype(jnp.float32)
  spread, means, d2, present = _spreads(points, truth, rows)
  between = jnp.sqrt(jnp.maximum(tree_lib.sq_distances(means, means), 0.0))
  pair = present[:, None] & present[None, :] & ~jnp.eye(k, dtype=bool)
  nearest = jnp.argmin(jnp.where(present[None, :], d2, jnp.inf), axis=1)
  table = partition.contingency(truth.clusters, nearest, num_true=k,
                                num_pred=k, weights=w)
  return {"sep_spread": jnp.max(spread),
          "sep_delta": jnp.min(jnp.where(pair, between, jnp.inf)),
          "sep_ari": partition.adjusted_rand_index(table)}


def group_stats(coefs: jax.Array, slot_index: jax.Array,
                slot_present: jax.Array, byzantine: jax.Array,
                truth: Optional[Truth]) -> dict:
  """Diagnostics of a Federated-Clustering round (client order).

  Args:
    coefs: `[N, S]` weight of group slot j in client i's estimate.
    slot_index: `[N, S]` int client in slot j of client i's group.
    slot_present: `[N, S]` bool, real (not padding) slots.
    byzantine: `[N]` bool.
    truth: the true clusters, or None.

  Returns:
    dict of float32 scalars (`weights.combination_stats` over benign
    clients).
  """
  n = byzantine.shape[0]
  own = (slot_index == jnp.arange(n)[:, None]) & slot_present
  same = byz = None
  if truth is not None:
    same, byz = weights_lib.truth_masks(
        truth.clusters, truth.clusters[slot_index], byzantine[slot_index],
        slot_present)
  return weights_lib.combination_stats(
      jnp.where(slot_present, coefs, 0.0), own, ~byzantine, same=same,
      byzantine=byz)
