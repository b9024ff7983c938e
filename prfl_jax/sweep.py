"""A whole hyperparameter sweep as one XLA program.

A training run is one `lax.scan` over rounds of `alg.step`; a sweep is one
`jax.vmap` of that run over a grid of hyperparameters and seeds (DESIGN.md).
Hyperparameters are arrays, so the algorithm is built inside the vmapped
function from traced values, e.g.

  def make_algorithm(hp):
    return prfl.algorithms.federated_clustering(
        loss_fn, optax.sgd(hp["lr"]), radius=prfl.quantile_radius(hp["q"]),
        num_iters=10)

  hparams, keys = prfl.sweep.grid(jnp.arange(3), lr=jnp.array([.01, .1]),
                                  q=jnp.array([.2, .5]))
  result = jax.jit(lambda h, k: prfl.sweep.sweep(
      make_algorithm, h, params, train, num_rounds=200, keys=k))(hparams, keys)
  result.metrics["loss"]  # [G, num_rounds], G = 3 * 2 * 2

Every grid point runs exactly what `run(make_algorithm, hp, ...)` runs alone
(same keys, same rounds); only XLA's batching of the operations differs, so
results agree up to float rounding. Library code does not jit: the caller does.
"""

import itertools
from typing import Any, Callable, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax.algorithms import base

PyTree = Any
MakeAlgorithm = Callable[[PyTree], base.Algorithm]


class SweepResult(NamedTuple):
  """Final state and per-round metrics of one run or of a vmapped sweep."""
  state: PyTree  # Algorithm state after num_rounds; leaves [G, ...] in a sweep.
  metrics: PyTree  # alg.step metrics per round; leaves [(G,) num_rounds, ...].
  final: PyTree  # evaluate(state), or None; leaves [(G,) ...].


def grid(seeds, **axes):
  """Cartesian product of seeds and named hyperparameter values.

  Args:
    seeds: 1-D integer array of seeds `[S]`.
    **axes: name -> 1-D array of values, e.g. `lr=jnp.array([0.01, 0.1])`.

  Returns:
    `(hparams, keys)`: `hparams` a dict name -> `[G]` array (plus `"seed"`),
    `keys` `[G]` PRNG keys (`jax.random.PRNGKey(seed)`), with
    `G = S * prod(len(values))`, seeds varying slowest, the last axis fastest.

  Raises:
    ValueError: if an axis is not one-dimensional or is empty.
  """
  named = {"seed": np.asarray(seeds)}
  named.update({k: np.asarray(v) for k, v in axes.items()})
  for name, values in named.items():
    if values.ndim != 1 or values.shape[0] == 0:
      raise ValueError(
          f"`{name}` must be a non-empty 1-D array of values, got shape "
          f"{values.shape}.")
  index = np.array(list(itertools.product(
      *[range(len(v)) for v in named.values()])), dtype=np.int64)
  hparams = {name: jnp.asarray(values[index[:, col]])
             for col, (name, values) in enumerate(named.items())}
  keys = jax.vmap(jax.random.PRNGKey)(hparams["seed"])
  return hparams, keys


def run(make_algorithm: MakeAlgorithm, hparams: PyTree, params, data,
        num_rounds: int, *, key: jax.Array,
        evaluate: Optional[Callable[[PyTree], PyTree]] = None,
        init_kwargs: Optional[dict] = None) -> SweepResult:
  """One training run: `alg.init`, then `num_rounds` of `alg.step` in a scan.

  Args:
    make_algorithm: `make_algorithm(hparams) -> Algorithm`; hparams may be
      traced (e.g. `optax.sgd(hparams["lr"])`, `quantile_radius(hparams["q"])`).
    hparams: pytree of scalar arrays for this run.
    params: initial stacked params (leaves `[N, ...]`), or a function
      `params(key) -> stacked params` for a per-run initialisation.
    data: a fixed batch (leaves `[N, B, ...]`, e.g. the full local datasets),
      or a sampler `data(key) -> batch` called once per round.
    num_rounds: rounds (>= 1).
    key: PRNG key of this run; split into init, sampling and step keys.
    evaluate: optional `evaluate(final_state) -> pytree`, e.g. test metrics.
    init_kwargs: keyword arguments of `alg.init` (e.g. `byzantine=mask`).

  Returns:
    `SweepResult` (metrics leaves `[num_rounds, ...]`).

  Raises:
    ValueError: if `num_rounds` is not a positive integer.
  """
  base.check_positive_int(num_rounds, "num_rounds")
  alg = make_algorithm(hparams)
  init_key, key = jax.random.split(key)
  state = alg.init(params(init_key) if callable(params) else params,
                   **(init_kwargs or {}))

  def body(carry, _):
    state, key = carry
    key, sample_key, step_key = jax.random.split(key, 3)
    batch = data(sample_key) if callable(data) else data
    state, metrics = alg.step(state, batch, step_key)
    return (state, key), metrics

  (state, _), metrics = lax.scan(body, (state, key), None, length=num_rounds)
  final = None if evaluate is None else evaluate(state)
  return SweepResult(state, metrics, final)


def sweep(make_algorithm: MakeAlgorithm, hparams: PyTree, params, data,
          num_rounds: int, *, keys: jax.Array,
          evaluate: Optional[Callable[[PyTree], PyTree]] = None,
          init_kwargs: Optional[dict] = None) -> SweepResult:
  """`run` for every grid point at once: one vmap over a scan over rounds.

  Args:
    make_algorithm: as in `run`.
    hparams: pytree whose leaves are `[G]` arrays (e.g. from `grid`).
    params, data, num_rounds, evaluate, init_kwargs: as in `run`, shared by
      every grid point (a callable `params` / `data` gets each run's keys).
    keys: `[G]` PRNG keys, one per grid point.

  Returns:
    `SweepResult` with a leading grid axis G on every leaf.

  Raises:
    ValueError: if the leaves of `hparams` and `keys` disagree on G.
  """
  sizes = {np.shape(x)[0] if np.ndim(x) else None
           for x in jax.tree.leaves(hparams)}
  g = np.shape(keys)[0] if np.ndim(keys) else None
  if sizes != {g} or g is None:
    raise ValueError(
        f"every leaf of `hparams` and `keys` needs the same leading grid axis; "
        f"got hparams sizes {sorted(map(str, sizes))} and keys shape "
        f"{np.shape(keys)}.")
  one = lambda hp, key: run(make_algorithm, hp, params, data, num_rounds,
                            key=key, evaluate=evaluate,
                            init_kwargs=init_kwargs)
  return jax.vmap(one)(hparams, keys)


__all__ = ["SweepResult", "grid", "run", "sweep"]
