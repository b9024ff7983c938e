"""Spectral filters: CAF and Divide-and-Conquer (DnC).

Both look at the direction of largest variance of the rows and remove or
down-weight the rows that stick out along it. Eigenvectors are computed
exactly from the `[N, N]` Gram matrix: the weighted covariance
`sum_i s_i (x_i - mu)(x_i - mu)^T` (shares `s_i` summing to 1) has the same
non-zero eigenvalues as `M = sqrt(s_i s_j) <x_i - mu, x_j - mu>`, and if
`M u = lambda u` the projection of `x_i - mu` on the unit eigenvector in
parameter space is `(K sqrt(s) u)_i / sqrt(lambda)`, `K` the centred Gram.
"""

from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.aggregators import base

PyTree = base.PyTree
Aggregator = base.Aggregator
_HIGHEST = lax.Precision.HIGHEST


def top_direction(g: jax.Array, share: jax.Array):
  """Top eigenvalue of the `share`-weighted covariance and every row's
  squared projection on its eigenvector.

  Args:
    g: `[N, N]` Gram matrix of the rows (finite).
    share: `[N]` non-negative, summing to 1 (0 for rows outside the
      covariance; their projections are still returned).

  Returns:
    `(lambda [], tau [N])`: `tau_i = ((x_i - mu)^T v)^2`, `mu = sum_i
    share_i x_i`, `v` the unit top eigenvector (0 where lambda is 0).
  """
  r = jnp.dot(g, share, precision=_HIGHEST)
  centred = g - r[:, None] - r[None, :] + jnp.dot(share, r)
  root = jnp.sqrt(jnp.maximum(share, 0.0))
  values, vectors = jnp.linalg.eigh(root[:, None] * centred * root[None, :])
  lam, u = values[-1], vectors[:, -1]
  proj = jnp.dot(centred, root * u, precision=_HIGHEST)
  tau = jnp.where(lam > 0, jnp.square(proj) / jnp.where(lam > 0, lam, 1.0),
                  0.0)
  return lam, tau


def caf(num_byzantine: int, *, max_iters: int = 1000) -> Aggregator:
  """Covariance-bound agnostic filter, CAF (Allouah, Guerraoui, Stephan, 2025).

  With n present rows and f = `num_byzantine`: weights `c_i = 1`; while
  `sum_i c_i > n - 2 f`:

    mu_c = sum_i c_i x_i / sum_i c_i,
    Sigma_c = sum_i c_i (x_i - mu_c)(x_i - mu_c)^T / sum_i c_i,
    (lambda, v) = top eigenpair of Sigma_c,
    tau_i = ((x_i - mu_c)^T v)^2, c_i <- c_i (1 - tau_i / max_j tau_j);

  the output is the `mu_c` of the smallest `lambda` met. The eigenpair is
  exact (ByzFL's `CAF` takes one power-method step from a random vector).
  `tau` is taken over every present row, also those whose `c_i` is already
  0, as ByzFL does. With f = 0 the loop never runs and the output is the
  mean. Row weights `w_i` start `c_i = w_i` and the loop runs while
  `sum_i c_i > (1 - 2 f / n) sum_i w_i`. The loop also stops when the
  covariance vanishes, or after `max_iters` passes (ByzFL has no cap).

  Args:
    num_byzantine: f, with 2 f < N.
    max_iters: the most filtering passes.

  Raises:
    ValueError: on a negative `num_byzantine` or `max_iters < 1`; when `agg`
      is traced, if `2 f >= N`.

  References:
    Allouah, Guerraoui and Stephan, 2025, "Towards Trustworthy Federated
    Learning with Untrusted Participants", ICML (CAF); ByzFL's `CAF`.
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)
  validation.check_positive_int(max_iters, "max_iters")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    base.check_num_byzantine(num_byzantine, n, "CAF")
    _, weights, present, zeroed = base.prepare(messages, weights)
    # The Gram matrix of the rows times one power of two (largest |entry|
    # brought to [0.5, 1)): every eigenvalue and projection is scaled alike,
    # exactly, CAF's comparisons and ratios are unchanged, and float32 rows
    # ~1e19 (or ~1e-22) no longer overflow (underflow).
    g = tree_lib.gram(base.times_power_of_two(
        zeroed, base.max_peak_exponent(zeroed)))
    count = jnp.sum(present)
    total = jnp.sum(weights)
    stop = (1.0 - 2.0 * num_byzantine / jnp.maximum(count, 1)) * total

    def cond(carry):
      c, _, _, lam, it = carry
      return (jnp.sum(c) > stop) & (lam > 0) & (it < max_iters)

    def body(carry):
      c, best, best_lam, _, it = carry
      share = c / jnp.sum(c)
      lam, tau = top_direction(g, share)
      tau = jnp.where(present, tau, 0.0)
      better = lam < best_lam
      best = jnp.where(better, share, best)
      best_lam = jnp.where(better, lam, best_lam)
      top = jnp.where(jnp.max(tau) > 0, jnp.max(tau), 1.0)
      # Clipped at 0: round-off would leave the top row at -1e-16.
      c = c * jnp.maximum(1.0 - tau / top, 0.0)
      return c, best, best_lam, lam, it + 1

    share0 = weights / jnp.where(total > 0, total, 1.0)
    init = (weights, share0, jnp.asarray(jnp.inf, g.dtype),
            jnp.asarray(jnp.inf, g.dtype), jnp.zeros((), jnp.int32))
    _, best, _, _, _ = lax.while_loop(cond, body, init)
    return tree_lib.weighted_mean(zeroed, best)
  return agg


def dnc(num_byzantine: int, *, num_iters: int = 1, filter_frac: float = 1.0,
        subsample_dim: Optional[int] = None) -> Aggregator:
  """Divide-and-Conquer, DnC (Shejwalkar and Houmansadr, 2021, Algorithm 2).

  With n present rows and f = `num_byzantine`, `num_iters` times: take a
  random set r of `subsample_dim` coordinates (all of them when None or at
  least the dimension P), centre the rows' restrictions at their mean,
  score every row by its squared projection on the top right singular
  vector of the centred matrix, and keep the n - floor(filter_frac * f)
  lowest scores; the rows kept in every pass are averaged. Weights: the
  mean and covariance are weighted, counts are rows.

  Args:
    num_byzantine: f, with 2 f < N.
    num_iters: passes (the paper's niters; 1 by default).
    filter_frac: c, the share of f removed per pass (the paper: 1).
    subsample_dim: b, coordinates per pass (the paper: 10,000); a pass
      then needs `key` (`agg(messages, weights, key=key)`).

  Raises:
    ValueError: on bad arguments; when `agg` is traced, if `2 f >= N`, or a
      subsample is asked for without a key.

  References:
    Shejwalkar and Houmansadr, 2021, "Manipulating the Byzantine: Optimizing
    Model Poisoning Attacks and Defenses for Federated Learning", NDSS,
    Algorithm 2.
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)
  validation.check_positive_int(num_iters, "num_iters")
  base.check_fraction(filter_frac, "filter_frac", 0.0, 2.0)
  if subsample_dim is not None:
    validation.check_positive_int(subsample_dim, "subsample_dim")

  def agg(messages: PyTree, weights: Optional[jax.Array] = None, *,
          key: Optional[jax.Array] = None) -> PyTree:
    n = tree_lib.num_leading(messages, "messages")
    base.check_num_byzantine(num_byzantine, n, "DnC")
    _, weights, present, zeroed = base.prepare(messages, weights)
    # Rows times one power of two, as in `caf`: the scores' ranking is
    # unchanged and nothing overflows.
    flat = base.flatten(base.times_power_of_two(
        zeroed, base.max_peak_exponent(zeroed)))
    size = flat.shape[1]
    subsample = subsample_dim is not None and subsample_dim < size
    if subsample and key is None:
      raise ValueError(
          f"DnC with `subsample_dim`={subsample_dim} < P={size} draws random "
          "coordinates: call agg(messages, weights, key=key).")
    keys = (jax.random.split(key, num_iters) if subsample else
            jnp.zeros((num_iters,)))
    total = jnp.sum(weights)
    share = weights / jnp.where(total > 0, total, 1.0)
    keep_count = jnp.sum(present) - int(filter_frac * num_byzantine)

    def one_pass(k):
      rows = flat
      if subsample:
        rows = flat[:, jax.random.choice(k, size, (subsample_dim,),
                                         replace=False)]
      _, tau = top_direction(jnp.matmul(rows, rows.T, precision=_HIGHEST),
                             share)
      return base.nearest(tau[None, :], present, keep_count)[0]

    good = jnp.all(jax.vmap(one_pass)(keys), axis=0)
    return base.selected_mean(zeroed, weights, good)
  return agg
