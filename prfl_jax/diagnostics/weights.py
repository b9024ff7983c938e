"""Whose messages a client's update averages, and with what weight.

Every clustering method updates client i with a combination
`v_i = sum_j c_ij z_j` of the round's messages `z_j` (gradients or momenta):
Threshold-Clustering's centre is such a combination with `c_ij >= 0`
(Werner et al., 2023, eq. (t-c-update-rule); `clustering.ClusteringInfo`),
IFCA, HypCluster and Clustered FL average their members uniformly. With the
normalised weights `p_ij = c_ij / sum_j c_ij`:

* effective count `1 / sum_j p_ij^2`: the number of equally weighted
  messages that would average down noise as much (the ground truth averages
  its n_i cluster members: n_i);
* own weight `p_ii`;
* purity `sum_{j ~ i, j benign} p_ij` (the owner's own message included) and
  Byzantine weight `sum_{j Byzantine} p_ij`, when the true clusters are
  known; purity + Byzantine weight + other-cluster weight = 1;
* same-cluster count `sum_j [j ~ i, j benign, j present]`: how many messages
  of the owner's cluster the update could have averaged (its group's, under
  Federated-Clustering's random groups).

Each is averaged over the rows that count (benign owners). A row whose
weights are all 0 (nothing averaged) has effective count 0 and adds 0 to the
other means.
"""

from typing import Optional

import jax
import jax.numpy as jnp


def masked_mean(values: jax.Array, rows: jax.Array) -> jax.Array:
  """Mean of `[M]` values over the rows where `rows` holds (0 if none)."""
  v = jnp.where(rows, values, 0.0)
  return jnp.sum(v) / jnp.maximum(jnp.sum(rows), 1).astype(v.dtype)


def normalise(coefs: jax.Array) -> jax.Array:
  """Rows of `[M, S]` weights scaled to sum 1 (negative / non-finite -> 0)."""
  c = jnp.where(jnp.isfinite(coefs) & (coefs > 0), coefs, 0.0)
  total = jnp.sum(c, axis=1, keepdims=True)
  return c / jnp.where(total > 0, total, 1.0)


def combination_stats(coefs: jax.Array, own: jax.Array, rows: jax.Array, *,
                      same: Optional[jax.Array] = None,
                      byzantine: Optional[jax.Array] = None) -> dict:
  """The module's diagnostics of M updates over S messages each.

  Args:
    coefs: `[M, S]` weights `c_ij` of message j in row i's update.
    own: `[M, S]` bool, the owner's own message (one per row, or none).
    rows: `[M]` bool, the rows averaged (e.g. benign owners).
    same: optional `[M, S]` bool, message j is a benign, present member of
      row i's true cluster (`truth_masks`).
    byzantine: optional `[M, S]` bool, message j is Byzantine.

  Returns:
    `{"effective_count", "own_weight"}`, plus `"purity"` and
    `"same_available"` with `same` and `"byzantine_weight"` with `byzantine`
    (float32 scalars).
  """
  p = normalise(coefs.astype(jnp.float32))
  sq = jnp.sum(p * p, axis=1)
  out = {
      "effective_count": masked_mean(
          jnp.where(sq > 0, 1.0 / jnp.where(sq > 0, sq, 1.0), 0.0), rows),
      "own_weight": masked_mean(jnp.sum(jnp.where(own, p, 0.0), axis=1),
                                rows),
  }
  if same is not None:
    out["purity"] = masked_mean(jnp.sum(jnp.where(same, p, 0.0), axis=1),
                                rows)
    out["same_available"] = masked_mean(
        jnp.sum(same, axis=1).astype(jnp.float32), rows)
  if byzantine is not None:
    out["byzantine_weight"] = masked_mean(
        jnp.sum(jnp.where(byzantine, p, 0.0), axis=1), rows)
  return out


def truth_masks(owner_clusters: jax.Array, point_clusters: jax.Array,
                point_byzantine: jax.Array, present=None):
  """`(same, byzantine)` masks `[M, S]` for `combination_stats`.

  Args:
    owner_clusters: `[M]` true cluster of each row's owner.
    point_clusters: `[S]` or `[M, S]` true cluster of each message.
    point_byzantine: `[S]` or `[M, S]` bool, Byzantine senders.
    present: optional `[S]` or `[M, S]` bool, real messages (False on
      padding).
  """
  point_clusters = jnp.broadcast_to(
      point_clusters, owner_clusters.shape + point_clusters.shape[-1:])
  byz = jnp.broadcast_to(point_byzantine, point_clusters.shape)
  same = (point_clusters == owner_clusters[:, None]) & ~byz
  if present is not None:
    present = jnp.broadcast_to(present, point_clusters.shape)
    same, byz = same & present, byz & present
  return same, byz


def membership_coefs(assignment: jax.Array, num_clusters: int) -> jax.Array:
  """`[N, N]` weights of a uniform average over each client's cluster.

  Row i weights client j by `1 / |S_k|` when both are assigned to cluster k
  (IFCA, HypCluster, Clustered FL average their members this way).
  """
  member = jax.nn.one_hot(assignment, num_clusters, dtype=jnp.float32)
  sizes = jnp.sum(member, axis=0)
  same = jnp.matmul(member, member.T)
  return same / jnp.maximum(sizes[assignment], 1.0)[:, None]
