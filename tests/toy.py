"""Toy federations shared by the algorithm tests."""

import jax
import jax.numpy as jnp


def quadratic(x, batch):
  """Mean of 0.5 (x - c)^2 over the client's scalar targets c (batch `[B]`)."""
  return 0.5 * jnp.mean((x - batch) ** 2)


def linreg_federation(key, num_clusters=2, per_cluster=3, dim=4, samples=4):
  """K clusters of linear-regression clients, batch leaves `[N, B, ...]`.

  Returns:
    `(loss_fn, (a [N, B, d], y [N, B]), zero params [N, d])`.
  """
  a_key, x_key = jax.random.split(key)
  n = num_clusters * per_cluster
  a = jax.random.normal(a_key, (n, samples, dim))
  optima = jax.random.normal(x_key, (num_clusters, dim))
  y = jnp.einsum("nbd,nd->nb", a, jnp.repeat(optima, per_cluster, axis=0))
  loss = lambda w, b: 0.5 * jnp.mean((b[0] @ w - b[1]) ** 2)
  return loss, (a, y), jnp.zeros((n, dim))
