"""Chunks of cohort rounds for `prfl.train`: device or host data and state.

Every chunk of L rounds is one jitted `lax.scan`. Its cohorts are drawn first
on the host, with the keys the step itself would use (`Cohort.members`), so
the chunk's clients are known before it runs:

* client data on the device (`FederatedData`): the scan gathers each round's
  C batches from the `[N, M, ...]` arrays (O(C B) per round);
* client data on the host (`HostData`, ragged, NumPy or memory-mapped): the
  chunk's `[L, C, B, ...]` batches are gathered with one `np.take` per leaf
  and transferred while the previous chunk runs (a one-thread prefetch);
* client state on the host (`state_on_host`): the rows of the chunk's U
  distinct clients are gathered, the scan runs on `[U, ...]` rows with local
  indices, and the rows are scattered back after the chunk.

Round r's keys are those of full-participation `train`: `fold_in(key, r)`
split into a batch key and a step key; the cohort comes from the step key
and client c's batch from `fold_in(batch_key, c)`. So results depend on
neither the chunk length (`eval_every`) nor where a run was resumed, nor on
where data and state live.
"""

import concurrent.futures
import os
from typing import Any, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import sharding
from prfl_jax.data import federated
from prfl_jax.data import padded
from prfl_jax.data import ragged as ragged_lib
from prfl_jax.participation import cohorts as cohort_lib

PyTree = Any


class Keys(NamedTuple):
  """The keys and cohorts of a chunk's rounds, drawn ahead."""
  index: jax.Array  # [L, A] int32 sorted cohort (arriving clients).
  batch: jax.Array  # [L] batch keys.
  step: jax.Array  # [L] keys of the wrapped algorithm's step.


def draw_chunk(alg: cohort_lib.Cohort, key: jax.Array, num_clients: int,
               rounds: jax.Array) -> Keys:
  """Cohorts and keys of `rounds` (`[L]` int32), as the step would draw them."""
  def one(r):
    batch_key, step_key = jax.random.split(jax.random.fold_in(key, r))
    _, inner_key = jax.random.split(step_key)
    return alg.members(step_key, num_clients).index, batch_key, inner_key
  return Keys(*jax.vmap(one)(rounds))


def on_host(keys: Keys) -> Keys:
  """The chunk's draws as NumPy (keys as their raw data), for any process.

  Host arrays are replicated into a jitted chunk whatever devices or
  processes its state spans; `with_keys` turns the raw data back into keys.
  """
  return Keys(np.asarray(keys.index),
              np.asarray(jax.random.key_data(keys.batch)),
              np.asarray(jax.random.key_data(keys.step)))


def with_keys(keys: Keys, impl) -> Keys:
  """Inverse of `on_host` inside jit (`impl`: the run key's PRNG impl)."""
  wrap = lambda k: jax.random.wrap_key_data(k, impl=impl)
  return Keys(keys.index, wrap(keys.batch), wrap(keys.step))


def device_batch(train: PyTree, counts: Optional[jax.Array],
                 index: jax.Array, batch_key: jax.Array,
                 batch_size: Optional[int]) -> PyTree:
  """The cohort's batches from device data `[N, M, ...]`: `[A, B, ...]`."""
  if batch_size is None:
    rows = cohort_lib.tree_lib.take(train, index)
    if counts is None:
      return rows
    return padded.Padded(rows, padded.example_mask(counts[index],
                                                   federated.num_rows(train)))
  m = federated.num_rows(train)
  n = None if counts is None else counts[index]
  rows = federated.batch_rows(
      ragged_lib.client_batch_keys(batch_key, index), m, batch_size, n)
  batch = jax.tree.map(lambda x: x[index[:, None], rows], train)
  if counts is None:
    return batch
  return padded.Padded(batch, rows < n[:, None])


def host_batches(data: ragged_lib.HostData, keys: Keys,
                 batch_size: int) -> padded.Padded:
  """The chunk's batches `[L, A, B, ...]` gathered on the host (NumPy)."""
  counts = data.train.counts
  rows, mask = jax.jit(ragged_lib.batch_rows, static_argnums=(3, 4))(
      keys.batch, keys.index, jnp.asarray(counts, jnp.int32),
      int(counts.max()), batch_size)
  return ragged_lib.gather(data.train, np.asarray(keys.index),
                           np.asarray(rows), np.asarray(mask))


class HostState:
  """Per-client state rows kept on the host (NumPy or memory-mapped)."""

  def __init__(self, clients: dict, directory: Optional[str] = None):
    leaves, self.treedef = jax.tree.flatten(clients)
    self.leaves = []
    for i, x in enumerate(leaves):
      x = np.asarray(x)
      if directory is None:
        self.leaves.append(np.array(x))
      else:
        mm = np.lib.format.open_memmap(
            os.path.join(directory, f"client_state_{i}.npy"), mode="w+",
            dtype=x.dtype, shape=x.shape)
        mm[...] = x
        self.leaves.append(mm)

  @classmethod
  def replicated(cls, row: dict, num_clients: int, byzantine: np.ndarray,
                 directory: Optional[str] = None) -> "HostState":
    """N copies of one client's rows, never built on the device."""
    state = cls.__new__(cls)
    leaves, state.treedef = jax.tree.flatten(row)
    state.leaves = []
    for i, x in enumerate(leaves):
      x = np.asarray(x)
      if directory is None:
        out = np.empty((num_clients,) + x.shape, x.dtype)
        out[...] = x
      else:
        out = _replicated_file(
            os.path.join(directory, f"client_state_{i}.npy"), x, num_clients)
      state.leaves.append(out)
    state.tree()["byzantine"][...] = byzantine
    return state

  def tree(self) -> dict:
    return jax.tree.unflatten(self.treedef, self.leaves)

  def take(self, clients: np.ndarray) -> dict:
    return jax.tree.unflatten(
        self.treedef, [np.take(x, clients, axis=0) for x in self.leaves])

  def put(self, clients: np.ndarray, rows: dict):
    for x, r in zip(self.leaves, jax.tree.leaves(rows)):
      x[clients] = np.asarray(r)[:len(clients)]


def _replicated_file(path: str, row: np.ndarray, num_clients: int):
  """A `.npy` of `num_clients` copies of `row`, memory-mapped read/write.

  Written with plain file writes (64 MiB at a time), so the copies pass
  through the page cache, not through this process's mapped memory.
  """
  header = {"descr": np.lib.format.dtype_to_descr(row.dtype),
            "fortran_order": False, "shape": (num_clients,) + row.shape}
  per_block = max(1, (64 << 20) // max(row.nbytes, 1))
  block = np.broadcast_to(row, (min(per_block, num_clients),) + row.shape)
  block = np.ascontiguousarray(block).tobytes()
  with open(path, "wb") as f:
    np.lib.format.write_array_header_1_0(f, header)
    for start in range(0, num_clients, per_block):
      rows = min(per_block, num_clients - start)
      f.write(block[:rows * row.nbytes])
  return np.load(path, mmap_mode="r+")


def local_index(index: np.ndarray, width: int):
  """`(clients [width], local [L, A])`: the chunk's distinct clients, padded.

  `clients[:U]` are the U distinct clients (sorted), then copies of the
  first; `local` maps every cohort entry to its row in `clients`.
  """
  distinct = np.unique(index)
  local = np.searchsorted(distinct, index).astype(np.int32)
  pad = np.full(width - distinct.size, distinct[0], distinct.dtype)
  return distinct, np.concatenate([distinct, pad]), local


def scan_rounds(alg: cohort_lib.Cohort, state: cohort_lib.CohortState,
                index: jax.Array, step_keys: jax.Array, batches):
  """`lax.scan` of `alg.apply` over the chunk; batches as xs or a function.

  Args:
    alg: the cohort algorithm.
    state: its state (client rows `[N or U, ...]`).
    index: `[L, A]` rows of every round's cohort in `state`.
    step_keys: `[L]` keys of the wrapped step.
    batches: `[L, A, B, ...]` batches, or `fn(round_position) -> batch`.
  """
  def body(state, xs):
    i, idx, key, batch = xs
    if callable(batches):
      batch = batches(i)
    return alg.apply(state, idx, batch, key)
  length = index.shape[0]
  xs = (jnp.arange(length), index, step_keys,
        None if callable(batches) else batches)
  return lax.scan(body, state, xs)


def prefetch(fn, *args) -> concurrent.futures.Future:
  """Runs `fn(*args)` on a background thread (host gathers overlap XLA)."""
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
  future = pool.submit(fn, *args)
  pool.shutdown(wait=False)
  return future


def to_host(tree: PyTree) -> PyTree:
  return sharding.to_host(tree)
