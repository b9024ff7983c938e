"""Fang et al. (2020)'s full-knowledge attacks on Krum and the trimmed mean.

Written for gradients: the benign update direction is `-sign(mu)` (`mu` the
benign mean gradient), and the attacks push the aggregate the other way.
"""

import math
import numbers

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.aggregators import base as agg_base
from prfl_jax.aggregators import selection as krum_lib
from prfl_jax.attacks import base

Attack = base.Attack


def fang_trimmed_mean(b: float = 2.0) -> Attack:
  """Fang et al.'s attack on the trimmed mean and the median (Section 4.3).

  Per coordinate k, with `s_k = sign(mu_k)` and the benign minimum `lo_k`
  and maximum `hi_k`: where `s_k > 0` every Byzantine row draws a value
  uniformly in `[lo_k / b, lo_k]` (if `lo_k > 0`, else `[b lo_k, lo_k]`),
  elsewhere in `[hi_k, b hi_k]` (if `hi_k > 0`, else `[hi_k, hi_k / b]`):
  values just beyond the benign extreme on the side opposite to the benign
  gradient, which the trimming keeps.

  Args:
    b: how far beyond the extreme, > 1 (the paper: 2).

  References:
    Fang, Cao, Jia and Gong, 2020, "Local Model Poisoning Attacks to
    Byzantine-Robust Federated Learning", USENIX Security, Section 4.3.
  """
  if (isinstance(b, bool) or not isinstance(b, numbers.Real) or
      not math.isfinite(b) or b <= 1):
    raise ValueError(f"`b` must be a number > 1, got {b!r}.")

  def attack(messages, byzantine, key):
    benign = ~byzantine
    mean, _ = base.benign_stats(messages, byzantine)
    leaves, treedef = jax.tree.flatten(messages)
    keys = jax.random.split(key, len(leaves))

    def leaf(x, mu, k):
      mask = benign.reshape((-1,) + (1,) * (x.ndim - 1))
      lo = jnp.min(jnp.where(mask, x, jnp.inf), axis=0)
      hi = jnp.max(jnp.where(mask, x, -jnp.inf), axis=0)
      below = (jnp.where(lo > 0, lo / b, b * lo), lo)
      above = (hi, jnp.where(hi > 0, b * hi, hi / b))
      up = mu > 0
      start = jnp.where(up, below[0], above[0])
      end = jnp.where(up, below[1], above[1])
      u = jax.random.uniform(k, x.shape, x.dtype)
      return start[None] + u * (end - start)[None]

    bad = jax.tree.unflatten(treedef, [
        leaf(x, mu, k) for x, mu, k in zip(leaves, jax.tree.leaves(mean),
                                          keys)])
    return base.replace(messages, byzantine, bad)
  return attack


def fang_krum(num_byzantine: int, *, halvings: int = 20) -> Attack:
  """Fang et al.'s attack on Krum (Section 4.2), for gradients.

  Every Byzantine row sends `-lambda * sign(mu)`. lambda starts at the
  paper's bound, `min_i sum_{l in G_i} ||x_l - x_i|| / ((m - 2c - 1)
  sqrt(d)) + max_i ||x_i|| / sqrt(d)` (i benign, `G_i` its m - c - 2
  nearest benign rows, m rows, c Byzantine, d coordinates; the current
  model is the zero gradient), and is halved `halvings` times; the largest
  lambda for which Krum (told `num_byzantine`) picks a Byzantine row is
  sent, or the last one if none is.

  Args:
    num_byzantine: the f the defender's Krum is told.
    halvings: search steps.

  References:
    Fang, Cao, Jia and Gong, 2020, Section 4.2 ("Attacking Krum").
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)
  validation.check_positive_int(halvings, "halvings")

  def attack(messages, byzantine, key):
    del key  # Unused.
    n = byzantine.shape[0]
    krum_lib.check_krum(num_byzantine, n)
    benign = ~byzantine
    mean, _ = base.benign_stats(messages, byzantine)
    sign = jax.tree.map(lambda m: -jnp.sign(m), mean)
    d = sum(x[0].size for x in jax.tree.leaves(messages))
    # Distances and norms of the benign rows times one power of two 2^k
    # (their median largest |entry| brought to [0.5, 1): exact, and squares
    # of rows of size ~1e19 or ~1e-22 neither overflow nor underflow), so
    # lam0 is found times 2^k and brought back.
    benign_rows = tree_lib.where(benign, messages, jax.tree.map(
        jnp.zeros_like, messages))
    k = agg_base.median_peak_exponent(benign_rows)
    scaled = agg_base.times_power_of_two(benign_rows, k)
    dist = jnp.sqrt(agg_base.pairwise_sq_distances(scaled))
    c = jnp.sum(byzantine)
    count = jnp.maximum(n - c - 2, 1)
    other = jnp.where(benign[None, :] & ~jnp.eye(n, dtype=bool), dist,
                      jnp.inf)
    near = jnp.sort(other, axis=1)
    sums = jnp.sum(jnp.where(jnp.arange(n)[None, :] < count, near, 0.0), 1)
    norms = jnp.sqrt(tree_lib.sq_norms(scaled))
    lam0 = agg_base.times_power_of_two(
        jnp.min(jnp.where(benign, sums, jnp.inf)) /
        (jnp.maximum(n - 2 * c - 1, 1) * math.sqrt(d)) +
        jnp.max(jnp.where(benign, norms, 0.0)) / math.sqrt(d), -k)

    def picks_byzantine(lam):
      attacked = base.replace(messages, byzantine, jax.tree.map(
          lambda s: lam * s, sign))
      score = krum_lib.krum_scores(agg_base.scaled_sq_distances(attacked),
                                   jnp.ones((n,), bool), num_byzantine)
      return byzantine[jnp.argmin(score)]

    def body(_, carry):
      lam, found = carry
      ok = picks_byzantine(lam) & (found < 0)
      return lam / 2, jnp.where(ok, lam, found)

    last, found = lax.fori_loop(0, halvings, body, (lam0, -1.0 * lam0 / lam0))
    lam = jnp.where(found > 0, found, 2 * last)
    return base.replace(messages, byzantine, jax.tree.map(
        lambda s: lam * s, sign))
  return attack
