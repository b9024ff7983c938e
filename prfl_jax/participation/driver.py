"""`prfl.train`'s cohort path: state, chunk runner and evaluation.

`setup` returns a `Runner` whose `run_chunk(state, first_round, length)`
runs a chunk of rounds (one jitted `lax.scan`, see `run`) and whose
`evaluate(state)` evaluates every registered client, in blocks of
`eval_block` clients, so neither ever holds an `[N, ...]` model stack that
the state does not already hold.
"""

import tempfile
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import sharding
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base
from prfl_jax.data import federated
from prfl_jax.data import ragged as ragged_lib
from prfl_jax.participation import cohorts as cohort_lib
from prfl_jax.participation import run

PyTree = Any


class Runner(NamedTuple):
  state: Any  # CohortState; on the host, `clients` is a run.HostState.
  run_chunk: Callable  # (state, first_round, length) -> (state, metrics).
  evaluate: Callable  # state -> {name: value} (host NumPy), or {}.
  result: Callable  # state -> the CohortState to return / checkpoint.


def summarize(values: dict, clusters: np.ndarray, byzantine: np.ndarray,
              num_clusters: int) -> dict:
  """`train`'s evaluation summary from per-client values `[N]` (NumPy)."""
  benign = ~byzantine
  out = {}
  for name, v in values.items():
    v = np.where(byzantine, 0.0, np.asarray(v, np.float32))
    out[name] = np.float32(v.sum() / max(benign.sum(), 1))
    sums = np.bincount(clusters, v * benign, num_clusters)
    totals = np.bincount(clusters, benign, num_clusters)
    out[name + "/per_cluster"] = np.where(
        totals > 0, sums / np.where(totals > 0, totals, 1), np.nan).astype(
            np.float32)
  return out


def _blocks(n: int, size: int):
  """`[size]` client blocks covering 0..n-1 (the last repeats client n-1)."""
  for start in range(0, n, size):
    block = np.arange(start, start + size)
    yield np.minimum(block, n - 1), min(size, n - start)


def setup(alg: cohort_lib.Cohort, params, data, *, key, batch_size,
          eval_fn, byzantine, initial_state, state_on_host, donate: bool,
          eval_block: int, clusters: np.ndarray,
          num_clusters: int) -> Runner:
  """Builds the cohort run's state and its chunk and evaluation functions."""
  on_host_data = isinstance(data, ragged_lib.HostData)
  n = (ragged_lib.check_host_data(data) if on_host_data else
       federated.check_data(data))
  if initial_state is None and cohort_lib.num_clients(params) != n:
    raise ValueError(f"`params` has {cohort_lib.num_clients(params)} "
                     f"clients but `data` has {n}.")
  if on_host_data and batch_size is None:
    raise ValueError("host (streamed) data needs a `batch_size`.")
  if not on_host_data:
    federated.check_batch_size(batch_size, data.train)
  alg.members(jax.random.key(0), n)  # Checks cohort_size and weights vs N.

  host_dir = None
  if isinstance(state_on_host, str):
    host_dir = tempfile.mkdtemp(prefix="prfl_state_", dir=state_on_host)
  if initial_state is not None:
    state = initial_state
  elif state_on_host and isinstance(params, cohort_lib.Replicated):
    mask = base.byzantine_mask(byzantine, n)
    row, server, clients = alg.init_parts(params.params, n, mask)
    host = (run.HostState(run.to_host(clients), host_dir) if row is None
            else run.HostState.replicated(run.to_host(row), n,
                                          np.asarray(mask), host_dir))
    state = cohort_lib.CohortState(host, server)
  else:
    state = alg.init(params, byzantine=byzantine)
  # On a mesh the state starts and stays by its layout (as in `train`'s
  # dense path): left to XLA, the uncommitted clients' momentum came back
  # replicated and the second chunk compiled again.
  state, layout = (state, None) if state_on_host else sharding.place_like(
      state, None if on_host_data else data.train, n)
  if state_on_host and not isinstance(state.clients, run.HostState):
    state = cohort_lib.CohortState(
        run.HostState(run.to_host(state.clients), host_dir), state.server)
  elif not state_on_host and donate:
    state = jax.tree.map(
        lambda x: x.copy() if isinstance(x, jax.Array) else x, state)
  arrived = alg.num_arrived
  counts = None if on_host_data else data.num_examples
  train_data = None if on_host_data else data.train

  impl = jax.random.key_impl(key)

  def device_chunk(state, keys, index, train_data, counts):
    keys = run.with_keys(keys, impl)
    batch_fn = lambda i: run.device_batch(train_data, counts, keys.index[i],
                                          keys.batch[i], batch_size)
    return run.scan_rounds(alg, state, index, keys.step, batch_fn)

  def host_chunk(state, keys, index, batches):
    keys = run.with_keys(keys, impl)
    return run.scan_rounds(alg, state, index, keys.step, batches)

  donated = 0 if donate and not state_on_host else ()
  device_jit = jax.jit(
      device_chunk, donate_argnums=donated,
      out_shardings=None if layout is None else (layout, None))
  host_jit = jax.jit(host_chunk, donate_argnums=donated)
  draw = jax.jit(lambda rounds: run.draw_chunk(alg, key, n, rounds))

  def prepare(first_round: int, length: int):
    keys = draw(first_round + jnp.arange(length, dtype=jnp.int32))
    batches = (jax.device_put(run.host_batches(data, keys, batch_size))
               if on_host_data else None)
    return run.on_host(keys), batches

  pending = {}

  def run_chunk(state, first_round: int, length: int):
    ahead = pending.pop((first_round, length), None)
    keys, batches = (ahead.result() if ahead is not None else
                     prepare(first_round, length))
    index = keys.index
    if state_on_host:
      host = state.clients
      distinct, clients, local = run.local_index(np.asarray(index),
                                                 length * arrived)
      rows = jax.device_put(host.take(clients))
      inner = cohort_lib.CohortState(rows, state.server)
      index = jnp.asarray(local)
    else:
      inner = state
    if on_host_data:
      inner, metrics = host_jit(inner, keys, index, batches)
    else:
      inner, metrics = device_jit(inner, keys, index, train_data, counts)
    pending[(first_round + length, length)] = run.prefetch(
        prepare, first_round + length, length)
    if state_on_host:
      host.put(distinct, run.to_host(inner.clients))
      return cohort_lib.CohortState(host, inner.server), metrics
    return inner, metrics

  def block_params(state, block):
    if state_on_host:
      rows = cohort_lib.CohortState(jax.device_put(state.clients.take(block)),
                                    state.server)
      return alg.view(rows, jnp.arange(len(block))).params
    return alg.view(state, jnp.asarray(block)).params

  def block_test(block):
    if on_host_data:
      return jax.device_put(ragged_lib.padded_block(data.test, block))
    return tree_lib.take(data.test, jnp.asarray(block))

  values_jit = jax.jit(lambda p, t: jax.vmap(eval_fn)(p, t))

  def evaluate(state):
    if eval_fn is None:
      return {}
    parts = []
    for block, size in _blocks(n, min(eval_block, n)):
      values = values_jit(block_params(state, block), block_test(block))
      values = run.to_host(values)
      parts.append({k: v[:size] for k, v in values.items()})
    values = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    byz = run.to_host(result(state).byzantine)
    return summarize(values, clusters, byz, num_clusters)

  def result(state):
    if isinstance(state.clients, run.HostState):
      return cohort_lib.CohortState(state.clients.tree(), state.server)
    return state

  return Runner(state, run_chunk, evaluate, result)

