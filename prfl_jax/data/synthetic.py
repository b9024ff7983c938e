"""The paper's synthetic linear-regression federation (Werner et al., 2023, §5.1).

K clusters of `n_i` clients. Cluster k (1-based) has an optimum `x*_k ~ N(0, I_d)`;
client i in cluster k has a sample matrix `A_i in R^{d x n}` with entries
`N(k, 1)` and targets `y_i = A_i^T x*_k`. With `d = 10 > n = 9` a client's own
system is underdetermined, so local training cannot find `x*_k`; clients of
the same cluster together can.
"""

from typing import Any

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import validation
from prfl_jax.data import padded
from prfl_jax.data.federated import FederatedData

PyTree = Any


def synthetic_regression(key: jax.Array, *, num_clusters: int = 4,
                         clients_per_cluster: int = 4, dim: int = 10,
                         num_samples: int = 9, noise: float = 0.0):
  """Builds the synthetic federation.

  Args:
    key: PRNG key.
    num_clusters: K.
    clients_per_cluster: n_i.
    dim: model dimension d.
    num_samples: samples per client n.
    noise: standard deviation of Gaussian noise added to the targets.

  Returns:
    `(data, x_star)`: `data.train = {"a": [N, n, d], "y": [N, n]}` (rows of
    `a` are the samples, i.e. `A_i^T`), `data.test = {"x_star": [N, d]}`,
    `data.clusters` `[N]` (0-based), and `x_star` `[K, d]`.

  Raises:
    ValueError: on a non-positive size.
  """
  for name, value in (("num_clusters", num_clusters),
                      ("clients_per_cluster", clients_per_cluster),
                      ("dim", dim), ("num_samples", num_samples)):
    validation.check_positive_int(value, name)
  if noise < 0:
    raise ValueError(f"`noise` must be >= 0, got {noise!r}.")
  star_key, a_key, noise_key = jax.random.split(key, 3)
  n = num_clusters * clients_per_cluster
  x_star = jax.random.normal(star_key, (num_clusters, dim))
  clusters = jnp.repeat(jnp.arange(num_clusters, dtype=jnp.int32),
                        clients_per_cluster)
  means = (clusters + 1).astype(jnp.float32)[:, None, None]
  a = means + jax.random.normal(a_key, (n, num_samples, dim))
  # HIGHEST: at TF32/bf16 x_star would not be the exact optimum of the data.
  y = jnp.einsum("nsd,nd->ns", a, x_star[clusters],
                 precision=lax.Precision.HIGHEST)
  y = y + noise * jax.random.normal(noise_key, y.shape)
  data = FederatedData(train={"a": a, "y": y},
                       test={"x_star": x_star[clusters]}, clusters=clusters)
  return data, x_star


def regression_loss(params: jax.Array, batch: PyTree) -> jax.Array:
  """`f_i(x) = (1 / 2B) * ||A x - y||^2` for one client.

  Args:
    params: `[d]` model.
    batch: `{"a": [B, d], "y": [B]}`, or a `prfl.data.Padded` of it (the
      mean is then over the real rows).
  """
  batch, mask = padded.unpad(batch)
  residual = batch["a"] @ params - batch["y"]
  return 0.5 * padded.masked_mean(jnp.square(residual), mask)


def regression_eval(params: jax.Array, test: PyTree) -> dict:
  """`{"error": ||x_i - x*||}` for one client (the paper's Figure 3 metric)."""
  return {"error": jnp.linalg.norm(params - test["x_star"])}
