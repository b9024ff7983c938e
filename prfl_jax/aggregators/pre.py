"""Pre-aggregators: transforms of the messages placed in front of a rule.

A pre-aggregator is a pure function

  pre(messages, weights=None, key=None) -> (messages, weights)

from N rows (leaves `[N, ...]`, optional `[N]` weights) to M rows (leaves
`[M, ...]`, `[M]` float32 weights; M = N except for `bucketing`). Absent
rows (weight 0, or any NaN/Inf entry) come out as zero rows of weight 0, so
the rule after it never sees them. `compose(pre_1, ..., rule)` chains
them in front of any aggregator; in front of Federated-Clustering they
transform each model's N gradients before Threshold-Clustering.

Counts (f, k) count present rows, as in the aggregators.
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.aggregators import base
from prfl_jax.aggregators import neighbours

PyTree = base.PyTree
PreAggregator = Callable[..., tuple]


def nnm(num_byzantine: int) -> PreAggregator:
  """Nearest-neighbour mixing, NNM (Allouah et al., 2023, Algorithm 1).

  Every present row i becomes the (weighted) mean of its n - f nearest
  present rows, itself included (ties: lower index), n the present count:

    NNM(x)_i = 1/(n - f) * sum_{j in N_i} x_j.

  Args:
    num_byzantine: f, with f < N.

  Raises:
    ValueError: on a negative `num_byzantine`; when traced, if `f >= N`.

  References:
    Allouah, Farhadkhani, Guerraoui, Gupta, Pinot and Stephan, 2023, "Fixing
    by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
    AISTATS, Algorithm 1; ByzFL's `NNM`.
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)

  def pre(messages, weights=None, key=None):
    del key  # Unused.
    n = tree_lib.num_leading(messages, "messages")
    base.check_num_byzantine(num_byzantine, n, "NNM", factor=1)
    n, weights, present, zeroed = base.prepare(messages, weights)
    mixed = neighbours.neighbour_means(zeroed, weights, present,
                                       jnp.arange(n),
                                       jnp.sum(present) - num_byzantine)
    return tree_lib.where(present, mixed, zeroed), weights
  return pre


def bucket_means(messages: PyTree, order: jax.Array, bucket_size: int,
                 weights=None):
  """Bucketing's averaging for a given order of the rows.

  The present rows, taken in `order` (absent rows skipped), are cut into
  consecutive buckets of `bucket_size` (the last one may be smaller); each
  bucket's output row is the weighted mean of its members and its weight
  the mean of their weights (1 for unit weights: every bucket counts once,
  as in ByzFL). Returns `ceil(N / bucket_size)` rows; buckets left empty
  (absent rows) have weight 0.

  Args:
    messages: leaves `[N, ...]`.
    order: `[N]` permutation of the rows.
    bucket_size: s >= 1.
    weights: optional `[N]`.
  """
  validation.check_positive_int(bucket_size, "bucket_size")
  n, weights, present, zeroed = base.prepare(messages, weights)
  num_buckets = -(-n // bucket_size)
  position = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n))
  # Present rows first, in `order`; then the absent ones.
  rank = jnp.argsort(jnp.lexsort((position, ~present)))
  member = (rank[None, :] // bucket_size ==
            jnp.arange(num_buckets)[:, None]) & present[None, :]  # [B, N]
  coefs = jnp.where(member, weights[None, :], 0.0)
  total = jnp.sum(coefs, axis=1)
  means = tree_lib.combine(
      coefs / jnp.where(total > 0, total, 1.0)[:, None], zeroed)
  size = jnp.sum(member, axis=1)
  return means, jnp.where(size > 0, total / jnp.maximum(size, 1), 0.0)


def bucketing(bucket_size: int) -> PreAggregator:
  """Bucketing (Karimireddy, He and Jaggi, 2022, Algorithm 1).

  A uniformly random permutation pi of the rows (from `key`), then the means
  of consecutive buckets of s rows (`bucket_means`):

    Bucketing_s(x) = ( 1/s sum_{i=1}^{s} x_pi(i), 1/s sum_{i=s+1}^{2s}
                       x_pi(i), ... ),

  `ceil(N / s)` output rows.

  Args:
    bucket_size: s >= 1.

  Raises:
    ValueError: on `bucket_size < 1`, or when called without a key.

  References:
    Karimireddy, He and Jaggi, 2022, "Byzantine-Robust Learning on
    Heterogeneous Datasets via Bucketing", ICLR, Algorithm 1; ByzFL's
    `Bucketing`.
  """
  validation.check_positive_int(bucket_size, "bucket_size")

  def pre(messages, weights=None, key=None):
    if key is None:
      raise ValueError("bucketing draws a random permutation: pass `key`.")
    n = tree_lib.num_leading(messages, "messages")
    return bucket_means(messages, jax.random.permutation(key, n),
                        bucket_size, weights)
  return pre


def clipping(threshold: float) -> PreAggregator:
  """Static clipping: `x_i * min(1, c / ||x_i||)` for every row (ByzFL's
  `Clipping`; Karimireddy, He and Jaggi, 2021, discuss it as a baseline).

  Args:
    threshold: c > 0.

  The norms and the clip are `base.clip_rows`'s: a finite row whose squared
  norm overflows (float32 entries ~1e19) is clipped in its own direction.

  Raises:
    ValueError: if `threshold` is not a finite number > 0.
  """
  base.check_positive_float(threshold, "threshold")

  def pre(messages, weights=None, key=None):
    del key  # Unused.
    _, weights, _, zeroed = base.prepare(messages, weights)
    return base.clip_rows(zeroed, threshold), weights
  return pre


def arc(num_byzantine: int) -> PreAggregator:
  """Adaptive robust clipping, ARC (Allouah et al., 2024, Algorithm 1).

  With n present rows, the k = floor(2 f (n - f) / n) largest norms are
  clipped to the (n - k)-th smallest norm (the largest one left alone):
  `x_i * min(1, ||x_pi(n-k)|| / ||x_i||)`, pi sorting the norms ascending.
  k is computed in integers (ByzFL: `int((2 f / n) * (n - f))` in floats).
  Norms are `base.row_norms` and the clip `base.clip_rows`: a finite row
  whose squared norm overflows keeps its norm and is clipped in its own
  direction.

  Args:
    num_byzantine: f >= 0, with f <= N.

  Raises:
    ValueError: on a negative `num_byzantine`; when traced, if `f > N`.

  References:
    Allouah, Guerraoui, Gupta, Jellouli, Rizk and Stephan, 2024, "Boosting
    Robustness by Clipping Gradients in Distributed Learning" (ARC),
    Algorithm 1; ByzFL's `ARC`.
  """
  validation.check_positive_int(num_byzantine, "num_byzantine", minimum=0)

  def pre(messages, weights=None, key=None):
    del key  # Unused.
    n = tree_lib.num_leading(messages, "messages")
    base.check_num_byzantine(num_byzantine, n + 1, "ARC", factor=1)
    _, weights, present, zeroed = base.prepare(messages, weights)
    count = jnp.sum(present)
    k = (2 * num_byzantine * (count - num_byzantine)) // jnp.maximum(count, 1)
    norms = base.row_norms(zeroed)
    ordered = jnp.sort(jnp.where(present, norms, jnp.inf))
    threshold = ordered[jnp.clip(count - k - 1, 0, n - 1)]
    return base.clip_rows(zeroed, threshold), weights
  return pre


def _pair_scaled_gaps(zeroed: PyTree):
  """`(d [N, N], r [N, N])`: `||x_i - x_j||` and `max(||x_i||, ||x_j||)`,
  both times 2^(k_ij), k_ij bringing the larger row's largest |entry| into
  [0.5, 1) (rows with finite entries; a zero row sets no scale).

  Each row is brought to largest |entry| in [0.5, 1) by its own power of
  two 2^(k_i) (`base.times_power_of_two`), the Gram matrix is taken on
  those rows, and each pair's entries are brought to the pair's scale by
  the factors 2^(k_ij - k_i) <= 1. Powers of two change no rounding, so
  `d <= t r` is decided as on the rows as given wherever those squares
  neither overflow nor underflow; and rows of any size, rows ~1e19 or
  ~1e-22 whose squares overflow or underflow float32, or small rows beside
  a 1e35 one, are compared: what a pair's factor flushes to 0 is below the
  larger row's rounding.
  """
  peaks = base.row_peaks(zeroed)
  _, e = jnp.frexp(peaks.astype(jnp.result_type(peaks, jnp.float32)))
  scaled = base.times_power_of_two(zeroed, -e)
  g = tree_lib.gram(scaled)
  sq = jnp.diagonal(g)
  norms = jnp.sqrt(tree_lib.sq_norms(scaled))
  k = jnp.where(peaks > 0, -e, 1 << 20)
  pair = jnp.minimum(k[:, None], k[None, :])
  a = base.power_of_two(jnp.minimum(pair - k[:, None], 0), g.dtype)
  b = a.T
  d2 = jnp.maximum(sq[:, None] * a * a + sq[None, :] * b * b - 2.0 * g * a * b,
                   0.0)
  return jnp.sqrt(d2), jnp.maximum(norms[:, None] * a, norms[None, :] * b)


def cap_duplicates(tolerance: float = 1e-3) -> PreAggregator:
  """Near-identical rows share the weight of one: a cap on tied messages.

  Row j is dropped (weight 0) when an earlier present row l < j is within
  `tolerance * max(||x_j||, ||x_l||)` of it; so each group of identical rows
  (and chains of near-identical ones) keeps one row, the lowest-indexed, at
  its own weight. Honest stochastic gradients are never that close, while
  the classic attacks send one vector from every Byzantine client (ALIE,
  IPM, mimic's copies of a benign row): in front of Threshold-Clustering
  the copies then count once, both in the quantile radius and in the
  centre's average (the defence of Federated-Clustering, see
  `docs/design.md`). An attacker can evade it only by spreading its points
  apart, which `attacks.spread_edge` does. Distances come from the Gram
  matrix (`pairwise_sq_distances`), which in float32 cannot tell apart rows
  closer than about 3e-4 of their norm: the default tolerance is 1e-3.
  Each pair is compared at its own scale, a power of two that brings the
  larger row's largest |entry| into [0.5, 1) (`_pair_scaled_gaps`): the
  test is unchanged by a scale, and a power of two changes no rounding, yet
  finite rows whose squares overflow float32 (entries ~1e19) or underflow
  (~1e-20) are told apart, and so are small rows beside a huge one.

  Args:
    tolerance: relative distance below which two rows are one, in [0, 1).

  Raises:
    ValueError: if `tolerance` is outside [0, 1).
  """
  base.check_fraction(tolerance, "tolerance", 0.0, 1.0)

  def pre(messages, weights=None, key=None):
    del key  # Unused.
    n, weights, present, zeroed = base.prepare(messages, weights)
    d, longer = _pair_scaled_gaps(zeroed)
    tied = d <= tolerance * longer
    earlier = jnp.tril(tied & present[None, :], -1)
    keep = present & ~jnp.any(earlier, axis=1)
    return zeroed, jnp.where(keep, weights, 0.0)
  return pre


def compose(*stages) -> base.Aggregator:
  """`compose(pre_1, ..., pre_m, rule)`: the rule after the pre-aggregators.

  Returns `agg(messages, weights=None, key=None)`; `key` is split into one
  key per pre-aggregator (needed by `bucketing`).

  Raises:
    ValueError: if no rule is given.
    TypeError: if a stage is not callable.
  """
  if not stages:
    raise ValueError("`compose` needs at least a rule.")
  for stage in stages:
    if not callable(stage):
      raise TypeError(f"every stage must be callable, got {type(stage)}.")
  pres, rule = stages[:-1], stages[-1]

  def agg(messages: PyTree, weights: Optional[jax.Array] = None,
          key: Optional[jax.Array] = None) -> PyTree:
    keys = ([None] * len(pres) if key is None else
            list(jax.random.split(key, max(len(pres), 1))))
    for pre, k in zip(pres, keys):
      messages, weights = pre(messages, weights, k)
    return rule(messages, weights)
  return agg
