"""Stacked-client pytrees: every leaf carries a leading client axis.

A federation of N clients is one pytree whose leaves all have shape
`[num_clients, ...]`. The helpers here build such stacks and compute the
quantities Threshold-Clustering needs (squared distances, weighted means, Gram
matrices) directly on the pytree, without flattening whole models into one copy.

Precision: every contraction here (Gram matrices, weighted combinations and
means, inner products) runs at `lax.Precision.HIGHEST`, whatever
`jax_default_matmul_precision` says: on GPUs JAX's default float32 matmul is
TF32 (10-bit mantissa) and on TPUs bf16, which would put errors of ~1e-3
relative into distances (read off Gram entries by cancellation,
`|a|^2 + |b|^2 - 2<a, b>`) and into the centres Threshold-Clustering decides
ball membership with. The model's own forward/backward is not computed here
and follows the user's precision.
"""

from typing import Any, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

PyTree = Any


def num_leading(tree: PyTree, name: str = "tree") -> int:
  """Returns the common leading-axis size of every leaf of `tree`.

  Args:
    tree: pytree whose leaves all have a leading axis of the same size.
    name: argument name used in error messages.

  Raises:
    ValueError: if `tree` has no leaves, a scalar leaf, or leaves whose
      leading axes differ.
  """
  leaves = jax.tree.leaves(tree)
  if not leaves:
    raise ValueError(f"`{name}` has no array leaves.")
  sizes = set()
  for leaf in leaves:
    shape = np.shape(leaf)
    if not shape:
      raise ValueError(
          f"`{name}` has a scalar leaf; every leaf needs a leading axis.")
    sizes.add(shape[0])
  if len(sizes) != 1:
    raise ValueError(
        f"`{name}` leaves have different leading axes {sorted(sizes)}; "
        "every leaf must share the same leading axis.")
  return sizes.pop()


def check_same_structure(a: PyTree, b: PyTree, a_name: str, b_name: str):
  """Raises ValueError unless `a` and `b` have the same trailing leaf shapes."""
  sa, sb = jax.tree.structure(a), jax.tree.structure(b)
  if sa != sb:
    raise ValueError(
        f"`{a_name}` and `{b_name}` have different tree structures: "
        f"{sa} vs {sb}.")
  for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if np.shape(la)[1:] != np.shape(lb)[1:]:
      raise ValueError(
          f"`{a_name}` and `{b_name}` leaves differ in shape past the leading "
          f"axis: {np.shape(la)} vs {np.shape(lb)}.")


def broadcast(tree: PyTree, num_clients: int) -> PyTree:
  """Copies one (unstacked) pytree to `num_clients` clients.

  Args:
    tree: pytree of arrays, e.g. one model's parameters.
    num_clients: size of the new leading axis.

  Returns:
    pytree with every leaf of shape `[num_clients, *leaf.shape]`.
  """
  if num_clients < 1:
    raise ValueError(f"`num_clients` must be >= 1, got {num_clients}.")
  return jax.tree.map(
      lambda x: jnp.broadcast_to(jnp.asarray(x), (num_clients,) + jnp.shape(x)),
      tree)


def stack(trees: Sequence[PyTree]) -> PyTree:
  """Stacks a sequence of same-structure pytrees along a new leading axis."""
  if not trees:
    raise ValueError("`trees` is empty.")
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: PyTree) -> list:
  """Inverse of `stack`: a list with one pytree per leading index."""
  n = num_leading(tree)
  return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(n)]


def client_keys(key: jax.Array, num_clients: int) -> jax.Array:
  """One independent PRNG key per client, shape `[num_clients]` (of keys)."""
  return jax.random.split(key, num_clients)


def take(tree: PyTree, indices: jax.Array) -> PyTree:
  """Gathers `tree[indices]` on every leaf (leading axis)."""
  return jax.tree.map(lambda x: jnp.take(x, indices, axis=0), tree)


_HIGHEST = lax.Precision.HIGHEST


def vdot(a: PyTree, b: PyTree) -> jax.Array:
  """Sum over leaves of <a, b> for two unstacked pytrees; a scalar."""
  return sum(jnp.vdot(x, y, precision=_HIGHEST)
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def sq_norms(points: PyTree) -> jax.Array:
  """Squared l2 norm of every point.

  Args:
    points: pytree, every leaf `[N, ...]`.

  Returns:
    `[N]` array, `||z_i||^2` summed over all leaves.
  """
  return sum(
      jnp.sum(jnp.square(x).reshape(x.shape[0], -1), axis=1)
      for x in jax.tree.leaves(points))


def sq_distances(points: PyTree, centers: PyTree) -> jax.Array:
  """Squared distances between every point and every centre.

  Args:
    points: pytree, every leaf `[N, ...]`.
    centers: pytree of the same structure, every leaf `[K, ...]`.

  Returns:
    `[N, K]` array of `||z_i - v_k||^2`.
  """
  def leaf_dist(z, v):
    z = z.reshape(z.shape[0], 1, -1)
    v = v.reshape(1, v.shape[0], -1)
    return jnp.sum(jnp.square(z - v), axis=-1)
  return sum(leaf_dist(z, v) for z, v in zip(jax.tree.leaves(points),
                                             jax.tree.leaves(centers)))


def gram(points: PyTree) -> jax.Array:
  """Gram matrix `G[i, j] = <z_i, z_j>` summed over leaves.

  Computed at full float32 precision (no TF32 or bf16 passes on
  accelerators): distances are read off it by differences of its entries.

  Args:
    points: pytree, every leaf `[N, ...]`.

  Returns:
    `[N, N]` array (0 for a pytree without leaves).
  """
  def leaf_gram(z):
    z = z.reshape(z.shape[0], -1)
    return jnp.matmul(z, z.T, precision=_HIGHEST)
  return sum(leaf_gram(z) for z in jax.tree.leaves(points))


def inner_products(points: PyTree, centers: PyTree) -> jax.Array:
  """`[N, K]` array of `<z_i, v_k>` summed over leaves (one matmul per leaf,
  at full float32 precision like `gram`).

  Args:
    points: pytree, every leaf `[N, ...]`.
    centers: pytree of the same structure, every leaf `[K, ...]`.
  """
  return sum(jnp.matmul(z.reshape(z.shape[0], -1),
                        v.reshape(v.shape[0], -1).T, precision=_HIGHEST)
             for z, v in zip(jax.tree.leaves(points),
                             jax.tree.leaves(centers)))


def combine(coefs: jax.Array, points: PyTree) -> PyTree:
  """Linear combinations of points: `out[k] = sum_i coefs[k, i] * z_i`.

  Args:
    coefs: `[K, N]` array.
    points: pytree, every leaf `[N, ...]`.

  Returns:
    pytree, every leaf `[K, ...]`.
  """
  return jax.tree.map(
      lambda z: jnp.tensordot(coefs.astype(z.dtype), z, axes=1,
                              precision=_HIGHEST), points)


def masked_combination(coefs: jax.Array, points: PyTree,
                       mask: jax.Array) -> PyTree:
  """`sum_i coefs[i] * z_i` over the points where `mask` holds.

  Points outside `mask` are replaced by zeros first, so a NaN or Inf in them
  never reaches the result (`0 * nan` would).

  Args:
    coefs: `[N]` array.
    points: pytree, every leaf `[N, ...]`.
    mask: `[N]` bool.

  Returns:
    unstacked pytree (leaves `[...]`).
  """
  def leaf(z):
    z = jnp.where(mask.reshape((-1,) + (1,) * (z.ndim - 1)), z, 0.0)
    return jnp.tensordot(coefs.astype(z.dtype), z, axes=1, precision=_HIGHEST)
  return jax.tree.map(leaf, points)


def weighted_mean(points: PyTree, weights: jax.Array) -> PyTree:
  """`sum_i w_i z_i / sum_i w_i` over the leading axis (0 if all weights are 0).

  Args:
    points: pytree, every leaf `[N, ...]`.
    weights: `[N]` non-negative weights.

  Returns:
    unstacked pytree (leaves `[...]`).
  """
  total = jnp.sum(weights)
  w = weights / jnp.where(total > 0, total, 1.0)
  return jax.tree.map(lambda z: jnp.tensordot(w.astype(z.dtype), z, axes=1,
                                              precision=_HIGHEST), points)


def all_finite(points: PyTree) -> jax.Array:
  """`[N]` bool: whether every entry of point i is finite, over all leaves."""
  return jnp.all(jnp.stack([
      jnp.all(jnp.isfinite(x).reshape(x.shape[0], -1), axis=1)
      for x in jax.tree.leaves(points)]), axis=0)


def usable(points: PyTree) -> jax.Array:
  """`[N]` bool: whether point i can enter a distance computation.

  The one definition of "finite" that Threshold-Clustering (both kernels)
  and farthest-first use: the squared norm `||z_i||^2`, summed over all
  leaves in the points' own dtype, is finite. That holds iff every
  coordinate is finite and the squared norm does not overflow (e.g. a float32
  coordinate of 1e20 squares to inf), so distances to such a point would be
  meaningless.

  Args:
    points: pytree, every leaf `[N, ...]`.
  """
  return jnp.isfinite(sq_norms(points))


def where(mask: jax.Array, a: PyTree, b: PyTree) -> PyTree:
  """Per-client select: leaf `i` from `a` where `mask[i]`, else from `b`."""
  def sel(x, y):
    m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
    return jnp.where(m, x, y)
  return jax.tree.map(sel, a, b)
