"""Attacks whose strength is chosen every round against the defence in use.

* `optimised_alie`, `optimised_ipm`: ByzFL's line search over the strength
  tau of ALIE (`mu + tau * sd`) or IPM (`-tau * mu`), maximising an
  objective, by default ByzFL's: the distance between the defender's
  aggregate (Byzantine rows included) and the benign mean.
* `min_max`, `min_sum` (Shejwalkar and Houmansadr, 2021): the largest
  `gamma` for which `mu + gamma * p` stays as close to the benign rows as
  they are to each other.

`mu` and `sd` are the benign rows' coordinate-wise mean and standard
deviation; every Byzantine client sends the same vector. Against an
objective of distances alone (`threshold_objective`) the search may run on
`span_coordinates`, N + 2 numbers per row instead of the model's P.
"""

import math
import numbers
from typing import Callable

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax import clustering
from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.aggregators import base as agg_base
from prfl_jax.attacks import base

Attack = base.Attack
PyTree = base.PyTree
# objective(attacked messages [N, ...], honest messages [N, ...], byzantine
# [N]) -> scalar to maximise.
Objective = Callable


def _norms(rows: PyTree) -> jax.Array:
  """`[N]` l2 norms: each row brought to largest |entry| in [0.5, 1) by its
  own power of two 2^k first and the norm multiplied back by 2^-k (k = 0
  for a row not finite): exact, so `sqrt(sq_norms)` as before where the
  squares neither overflow nor underflow, and right for float32 rows ~1e19
  or ~1e-22."""
  peaks = agg_base.row_peaks(rows)
  _, e = jnp.frexp(peaks.astype(jnp.result_type(peaks, jnp.float32)))
  return agg_base.times_power_of_two(jnp.sqrt(tree_lib.sq_norms(
      agg_base.times_power_of_two(rows, -e))), e)


def aggregator_objective(aggregator) -> Objective:
  """ByzFL's: `||aggregator(attacked) - benign mean||`."""
  def objective(attacked, honest, byzantine):
    mean, _ = base.benign_stats(honest, byzantine)
    out = aggregator(attacked)
    return _norms(jax.tree.map(lambda a, m: (a - m)[None], out, mean))[0]
  return objective


def threshold_objective(radius, num_iters: int) -> Objective:
  """Federated-Clustering's view: how far the attack moves the estimates.

  Threshold-Clustering (the defender's `radius` and `num_iters`) is
  started at every Byzantine client's honest message, as if it were a
  benign owner of that cluster (`cluster_and_assign(method="gram")`: one
  Gram matrix for all starts); the objective is the mean distance between
  the estimates with and without the Byzantine rows.
  """
  clustering.check_radius(radius, 1)
  validation.check_positive_int(num_iters, "num_iters")

  def centres(points, starts, weights):
    return clustering.cluster_and_assign(
        points, starts, radius=radius, num_iters=num_iters, weights=weights,
        method="gram")[0]

  def objective(attacked, honest, byzantine):
    n = byzantine.shape[0]
    clean = centres(honest, honest, (~byzantine).astype(jnp.float32))
    moved = centres(attacked, honest, jnp.ones((n,), jnp.float32))
    gap = _norms(jax.tree.map(jnp.subtract, moved, clean))
    return jnp.sum(jnp.where(byzantine, gap, 0.0)) / jnp.maximum(
        jnp.sum(byzantine), 1)
  return objective


def _check_search(evals, start, delta, ratio):
  validation.check_positive_int(evals, "evals")
  for name, value in (("start", start), ("delta", delta)):
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or
        not math.isfinite(value)):
      raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
  if delta == 0:
    raise ValueError("`delta` must be non-zero.")
  if (isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or
      not 0.5 < ratio < 1):
    raise ValueError(f"`ratio` must be in (0.5, 1), got {ratio!r}.")


def line_search(score, evals: int, start: float, delta: float,
                ratio: float) -> jax.Array:
  """ByzFL's search for the tau maximising `score(tau)` (jit-compatible).

  Expansion from `start`: try `best + delta`; on improvement keep it and
  double `delta`, else shrink `delta` by `ratio` and switch to contraction,
  which tries `best + delta` and shrinks `delta` by `ratio` after every
  try; `evals` evaluations in all (the first at `start`).
  """
  def body(_, carry):
    best, best_y, step, expanding = carry
    x = best + step
    y = score(x)
    better = y > best_y
    best = jnp.where(better, x, best)
    best_y = jnp.where(better, y, best_y)
    step = jnp.where(expanding & better, 2.0 * step, ratio * step)
    return best, best_y, step, expanding & better

  init = (jnp.asarray(start, jnp.float32), score(jnp.asarray(
      start, jnp.float32)), jnp.asarray(delta, jnp.float32),
          jnp.asarray(True))
  return lax.fori_loop(0, evals - 1, body, init)[0]


def span_coordinates(messages, origin, step):
  """Exact coordinates of the rows, `origin` and `step` in their span.

  Every vector `row_i`, `origin + tau * step` and affine combination of
  them keeps its inner products (hence distances and norms) when written in
  the `R = N + 2` coordinates of `X = U sqrt(L)`, where `G = U L U^T` is the
  Gram matrix of the `[N + 2, P]` stack (one `O(N^2 P)` product; the
  eigendecomposition is `O(N^3)`). An objective of distances alone can then
  be evaluated in `R` dimensions instead of `P`. Non-finite rows are left
  out of the Gram matrix and come back as NaN rows.

  Args:
    messages: leaves `[N, ...]`.
    origin, step: leaves `[...]`.

  Returns:
    `(rows [N, R], origin [R], step [R])`, one-leaf arrays.
  """
  n = tree_lib.num_leading(messages)
  stack = jax.tree.map(lambda m, o, s: jnp.concatenate([m, o[None], s[None]]),
                       messages, origin, step)
  finite = tree_lib.usable(stack)
  stack = tree_lib.where(finite, stack, jax.tree.map(jnp.zeros_like, stack))
  values, vectors = jnp.linalg.eigh(tree_lib.gram(stack))
  coords = vectors * jnp.sqrt(jnp.maximum(values, 0.0))[None, :]
  coords = jnp.where(finite[:, None], coords, jnp.nan)
  return coords[:n], coords[n], coords[n + 1]


def _optimised(direction, objective, evals, start, delta, ratio,
               in_span) -> Attack:
  """Byzantine rows `base + tau * step` with tau from `line_search`."""
  if not callable(objective):
    raise TypeError(f"`objective` must be callable, got {type(objective)}.")
  _check_search(evals, start, delta, ratio)
  if not isinstance(in_span, bool):
    raise TypeError(f"`in_span` must be a bool, got {in_span!r}.")

  def search(messages, origin, step, byzantine):
    vector = lambda tau: jax.tree.map(lambda o, s: o + tau * s, origin, step)
    score = lambda tau: objective(
        base.replace(messages, byzantine, vector(tau)), messages, byzantine)
    return line_search(score, evals, start, delta, ratio)

  def attack(messages, byzantine, key):
    del key  # Unused.
    origin, step = direction(messages, byzantine)
    if in_span:
      tau = search(*span_coordinates(messages, origin, step), byzantine)
    else:
      tau = search(messages, origin, step, byzantine)
    return base.replace(messages, byzantine, jax.tree.map(
        lambda o, s: o + tau * s, origin, step))
  return attack


def optimised_alie(objective: Objective, *, evals: int = 20,
                   start: float = 0.0, delta: float = 10.0,
                   ratio: float = 0.8, in_span: bool = False) -> Attack:
  """ALIE with its strength searched every round (ByzFL's Optimal ALIE).

  Byzantine rows send `mu + tau * sd` (`sd` the sample standard deviation,
  ddof 1, as in ByzFL), tau from `line_search` on `objective`.

  Args:
    objective: what to maximise, e.g. `aggregator_objective(median())` or,
      against Federated-Clustering, `threshold_objective(radius, steps)`.
    evals, start, delta, ratio: the search (ByzFL's defaults).
    in_span: evaluate `objective` on `span_coordinates` (N + 2 numbers per
      row, one Gram matrix per attack instead of those of every
      evaluation). Only for objectives of the rows' distances alone, such
      as `threshold_objective`; not for coordinate-wise aggregators.

  References:
    Baruch, Baruch and Goldberg, 2019 (ALIE); ByzFL's
    `Optimal_ALittleIsEnough` (Allouah et al., 2023).
  """
  def direction(messages, byzantine):
    return base.benign_stats(messages, byzantine, ddof=1)
  return _optimised(direction, objective, evals, start, delta, ratio,
                    in_span)


def optimised_ipm(objective: Objective, *, evals: int = 20,
                  start: float = 0.0, delta: float = 10.0,
                  ratio: float = 0.8, in_span: bool = False) -> Attack:
  """IPM with its strength searched every round (ByzFL's Optimal IPM).

  Byzantine rows send `-tau * mu`, tau from `line_search` on `objective`.

  Args:
    objective, evals, start, delta, ratio, in_span: as in
      `optimised_alie`.

  References:
    Xie, Koyejo and Gupta, 2020 (IPM); ByzFL's
    `Optimal_InnerProductManipulation`.
  """
  def direction(messages, byzantine):
    mean, _ = base.benign_stats(messages, byzantine)
    return jax.tree.map(jnp.zeros_like, mean), jax.tree.map(jnp.negative,
                                                            mean)
  return _optimised(direction, objective, evals, start, delta, ratio,
                    in_span)


_PERTURBATIONS = ("std", "unit", "sign")


def _perturbation(kind: str, mean, std):
  """Shejwalkar and Houmansadr's `p`: `-sd`, `-mu / ||mu||` or `-sign(mu)`."""
  if kind == "std":
    return jax.tree.map(jnp.negative, std)
  if kind == "sign":
    return jax.tree.map(lambda m: -jnp.sign(m), mean)
  # Scale-safe: sqrt of the squared norm where that is usable, else from
  # the mean brought to largest |entry| 1 (a mean ~1e19 keeps its norm).
  norm = agg_base.row_norms(jax.tree.map(lambda m: m[None], mean))[0]
  return jax.tree.map(lambda m: -m / jnp.maximum(norm, 1e-30), mean)


def _min_max_sum(use_sum: bool, perturbation: str, gamma_init: float,
                 steps: int) -> Attack:
  if perturbation not in _PERTURBATIONS:
    raise ValueError(f"`perturbation` must be one of {_PERTURBATIONS}, got "
                     f"{perturbation!r}.")
  base_check = gamma_init
  if (isinstance(base_check, bool) or not isinstance(base_check,
                                                     numbers.Real) or
      not math.isfinite(base_check) or base_check <= 0):
    raise ValueError(f"`gamma_init` must be a number > 0, got {gamma_init!r}.")
  validation.check_positive_int(steps, "steps")

  def attack(messages, byzantine, key):
    del key  # Unused.
    benign = ~byzantine
    mean, std = base.benign_stats(messages, byzantine)
    p = _perturbation(perturbation, mean, std)
    # Distances among the benign rows times one power of two 2^k (their
    # largest |entry| brought to [0.5, 1)), and the bad vector's gaps to them
    # the same: exact, the comparisons with the bound unchanged, and no
    # square overflows (or underflows) for float32 rows ~1e19 (~1e-22).
    benign_rows = tree_lib.where(benign, messages,
                                 jax.tree.map(jnp.zeros_like, messages))
    k = agg_base.max_peak_exponent(benign_rows)
    scaled = agg_base.times_power_of_two(benign_rows, k)
    g = tree_lib.gram(scaled)
    sq = jnp.diagonal(g)
    pair = benign[:, None] & benign[None, :]
    d2 = jnp.where(pair, jnp.maximum(sq[:, None] + sq[None, :] - 2 * g, 0), 0)
    bound = jnp.max(jnp.sum(d2, axis=1)) if use_sum else jnp.max(d2)

    def fits(gamma):
      bad = jax.tree.map(lambda m, s: (m + gamma * s)[None], mean, p)
      gaps = tree_lib.sq_distances(scaled,
                                   agg_base.times_power_of_two(bad, k))[:, 0]
      gaps = jnp.where(benign, gaps, 0.0)
      return (jnp.sum(gaps) if use_sum else jnp.max(gaps)) <= bound

    def body(_, carry):
      gamma, step, good = carry
      ok = fits(gamma)
      good = jnp.where(ok, gamma, good)
      gamma = jnp.where(ok, gamma + step / 2, gamma - step / 2)
      return gamma, step / 2, good

    g0 = jnp.asarray(gamma_init, jnp.float32)
    # Their code: the first step is gamma_init itself, so the search spans
    # (0, 2 gamma_init).
    _, _, gamma = lax.fori_loop(0, steps, body, (g0, g0, 0.0 * g0))
    return base.replace(messages, byzantine, jax.tree.map(
        lambda m, s: m + gamma * s, mean, p))
  return attack


def min_max(perturbation: str = "std", *, gamma_init: float = 10.0,
            steps: int = 30) -> Attack:
  """Min-Max (Shejwalkar and Houmansadr, 2021, eq. (3)).

  Byzantine rows send `mu + gamma * p` with the largest gamma (found by
  `steps` halvings of a search in (0, 2 gamma_init), their Algorithm 1:
  from gamma_init, step +-s/2 with s halving from gamma_init) such
  that `max_i ||mu + gamma p - x_i|| <= max_{i, j} ||x_i - x_j||` over
  benign i, j: the bad vector is no farther from any benign row than the
  benign rows are from each other.

  Args:
    perturbation: p: `"std"` (`-sd`, their default), `"unit"` (`-mu /
      ||mu||`) or `"sign"` (`-sign(mu)`).
    gamma_init: the search's first gamma (> 0).
    steps: halvings.

  References:
    Shejwalkar and Houmansadr, 2021, "Manipulating the Byzantine: Optimizing
    Model Poisoning Attacks and Defenses for Federated Learning", NDSS.
  """
  return _min_max_sum(False, perturbation, gamma_init, steps)


def min_sum(perturbation: str = "std", *, gamma_init: float = 10.0,
            steps: int = 30) -> Attack:
  """Min-Sum (Shejwalkar and Houmansadr, 2021, eq. (4)).

  As `min_max`, with the condition `sum_i ||mu + gamma p - x_i||^2 <=
  max_i sum_j ||x_i - x_j||^2` over benign rows.

  Args:
    perturbation, gamma_init, steps: as in `min_max`.
  """
  return _min_max_sum(True, perturbation, gamma_init, steps)
