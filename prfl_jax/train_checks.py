"""`prfl.train`'s checks of its data, resumed state and schedule.

Every check runs on the host before anything is compiled, for both of
`train`'s paths: an `Algorithm` on a dense `FederatedData`, and a cohort
algorithm (`prfl.participation.cohort`) on a `FederatedData` or on streamed
`prfl.data.HostData`.
"""

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import sharding
from prfl_jax.algorithms import base
from prfl_jax.data import federated
from prfl_jax.data import padded
from prfl_jax.participation import cohorts


def resolve_eval_every(eval_every: Optional[int], start_round: int,
                       num_rounds: int) -> int:
  """Rounds per compiled chunk (and between evaluations) of both of `train`'s
  paths: `eval_every`, by default `ceil((start_round + num_rounds) / 20)`
  (about 20 evaluations from round 0, the same chunk length for a run and
  its resumes), and never more than `num_rounds`."""
  if eval_every is None:
    eval_every = max(1, math.ceil((start_round + num_rounds) / 20))
  return min(eval_every, num_rounds)


def check_clusters(clusters: np.ndarray):
  """Raises ValueError unless `clusters` holds non-negative integer ids."""
  if not (np.issubdtype(clusters.dtype, np.integer) and
          (clusters.size == 0 or clusters.min() >= 0)):
    raise ValueError(
        "`data.clusters` must hold non-negative integer cluster ids, got "
        f"dtype {clusters.dtype} with values {np.unique(clusters)[:10]}.")


def _real_rows(tree: Any, num_examples) -> list:
  """`[(name, leaf [N, ...], mask [N, M] or None)]` of a part of the data.

  Rows that are padding (past `num_examples`, or False in a `Padded`'s
  mask) may hold anything and are left out of the checks.
  """
  mask = None
  if isinstance(tree, padded.Padded):
    tree, mask = tree.examples, sharding.to_host(tree.mask)
  elif num_examples is not None:
    mask = sharding.to_host(padded.example_mask(
        num_examples, federated.num_rows(tree)))
  paths, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(jax.tree_util.keystr(path), leaf, mask) for path, leaf in paths]


def check_examples(data: federated.FederatedData):
  """Raises ValueError if there are no clients, clients have no training
  examples or the real rows of `data` hold NaN or Inf (which would silently
  turn those clients' models NaN). Padding rows (`data.num_examples`, or a
  `Padded` test set's mask) are not read.

  Args:
    data: the federation; `data.train` leaves `[N, M, ...]`.
  """
  if np.size(data.clusters) == 0:
    raise ValueError(
        "`data` has no clients (leaves [0, ...]); a run needs at least one.")
  if federated.num_rows(data.train) == 0:
    raise ValueError(
        "`data.train` has 0 examples per client (leaves [N, 0, ...]); every "
        "client needs at least one training example.")
  for part in ("train", "test"):
    tree = getattr(data, part)
    counts = data.num_examples if part == "train" else None
    for name, leaf, mask in _real_rows(tree, counts):
      if not jnp.issubdtype(leaf.dtype, jnp.inexact) or np.ndim(leaf) < 1:
        continue
      bad_rows = ~jnp.isfinite(leaf)
      if mask is not None and np.ndim(leaf) >= 2:
        bad_rows = bad_rows & jnp.asarray(mask).reshape(
            mask.shape + (1,) * (np.ndim(leaf) - 2))
      bad = np.flatnonzero(sharding.to_host(jnp.any(
          bad_rows.reshape(np.shape(leaf)[0], -1), axis=1)))
      if bad.size:
        raise ValueError(
            f"`data.{part}{name}` holds NaN or Inf for clients "
            f"{bad[:10].tolist()}{' ...' if bad.size > 10 else ''}; they "
            "would turn those clients' models NaN: clean or drop them.")


def _expected_state(algorithm, state):
  """`algorithm`'s state for `state`'s clients, traced (nothing is run)."""
  if isinstance(algorithm, cohorts.Cohort):
    if not isinstance(state, cohorts.CohortState):
      raise TypeError(
          f"`initial_state` is a {type(state).__name__}, but a cohort "
          "algorithm builds a CohortState: resume with the algorithm that "
          "wrote the state.")
    n = np.shape(state.clients["byzantine"])[0]
    one = (jax.tree.map(lambda x: x[0], state.clients["params"])
           if "params" in state.clients else state.server["params"])
    return jax.eval_shape(
        lambda one: algorithm.init(cohorts.Replicated(one, n)), one)
  params = getattr(state, "params", None)
  if params is None:
    raise TypeError(
        "`initial_state` must be a prfl_jax algorithm state (with `params`), "
        f"got {type(state).__name__}.")
  return jax.eval_shape(algorithm.init, params)


def check_initial_state(algorithm, state: Any):
  """Raises TypeError/ValueError unless `state` is a state of `algorithm`:
  the same state type, tree structure, leaf shapes and dtypes as
  `algorithm.init` gives for the state's clients (traced, nothing is run).

  Args:
    algorithm: an `Algorithm(init, step)` or a cohort algorithm.
    state: a resumed state, e.g. from `prfl.checkpoint.restore`.
  """
  expected = _expected_state(algorithm, state)
  if type(expected) is not type(state):
    raise TypeError(
        f"`initial_state` is a {type(state).__name__}, but `algorithm` builds "
        f"a {type(expected).__name__}: resume with the algorithm that wrote "
        "the state.")
  got_paths, got_def = jax.tree_util.tree_flatten_with_path(state)
  want_paths, want_def = jax.tree_util.tree_flatten_with_path(expected)
  if got_def != want_def:
    raise ValueError(
        f"`initial_state` has the structure {got_def}, but `algorithm` builds "
        f"{want_def} (other settings, e.g. another optimizer?).")
  for (path, got), (_, want) in zip(got_paths, want_paths):
    shape, dtype = np.shape(got), jnp.result_type(got)
    if shape != want.shape or dtype != want.dtype:
      raise ValueError(
          f"`initial_state{jax.tree_util.keystr(path)}` is {dtype}{list(shape)}"
          f", but `algorithm` builds {want.dtype}{list(want.shape)}.")


def check_resume(algorithm, state: Any, byzantine, num_clients: int):
  """Raises unless `state` is `algorithm`'s, of `num_clients` clients, and
  `byzantine` (if given) repeats its mask.

  Args:
    algorithm: an `Algorithm(init, step)` or a cohort algorithm.
    state: the resumed state (`initial_state`).
    byzantine: `train`'s `byzantine` argument, or None.
    num_clients: N of the data.
  """
  check_initial_state(algorithm, state)
  saved = sharding.to_host(state.byzantine)
  if saved.shape != (num_clients,):
    raise ValueError(
        f"`initial_state` has {saved.shape[0]} clients but `data` has "
        f"{num_clients}.")
  if byzantine is not None:
    if (np.shape(byzantine) != saved.shape or not np.array_equal(
        np.asarray(base.byzantine_mask(byzantine, num_clients)), saved)):
      raise ValueError(
          "`byzantine` differs from `initial_state.byzantine`; the mask is "
          "part of the state, so a resumed run keeps it: leave `byzantine` "
          "out (or pass the state's mask), or start a new run.")
