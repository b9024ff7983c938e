"""Ragged client datasets kept on the host, and their cohorts' batches.

Each client owns its own number of examples, stored back to back: leaves
`[total, ...]` (NumPy, or `np.memmap` for data larger than memory) with
client i's examples at rows `offsets[i]:offsets[i + 1]`. Nothing is padded to
the largest client; only a batch is padded (a client with fewer than B
examples), and it says so with `prfl.data.Padded`.

A cohort's batches are drawn on the host with the same keys as in jit: client
c of round r draws `federated.batch_rows(fold_in(batch_key_r, c), M_max, B,
n_c)` (M_max the largest client), so a dense `FederatedData` padded to M_max
with `num_examples` gives the same batches on the device.

Why plain NumPy gathering and not grain: see docs/design.md ("Streaming
client data"). In short, the rows of a chunk are known ahead from the keys,
so one vectorised `np.take` per leaf per chunk replaces a per-record loader,
and resuming needs no iterator state.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax.data import federated
from prfl_jax.data import padded

PyTree = Any


class Ragged(NamedTuple):
  """Examples of N clients stored back to back on the host."""
  values: PyTree  # leaves [total, ...]: client i's rows offsets[i]:offsets[i+1].
  offsets: np.ndarray  # [N + 1] int64, non-decreasing, offsets[0] = 0.

  @property
  def counts(self) -> np.ndarray:
    """`[N]` examples per client."""
    return np.diff(self.offsets)


class HostData(NamedTuple):
  """A federation whose client data stays on the host (`prfl.train` streams)."""
  train: Ragged  # training examples.
  test: Ragged  # test examples (eval_fn gets a `Padded` of them).
  clusters: np.ndarray  # [N] int: true cluster of each client.


def from_client_ids(values: PyTree, client_ids) -> Ragged:
  """Groups examples by an integer client id `[total]` (ids 0..N-1, all used).

  Returns:
    `Ragged` with clients in id order (examples keep their relative order).

  Raises:
    ValueError: if the ids are not integers `[total]` or some id in
      `0..max` owns no example.
  """
  ids = np.asarray(client_ids)
  total = tree_lib.num_leading(values, "values")
  if ids.shape != (total,) or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(
        f"`client_ids` must be integers [{total}], got {ids.dtype} of shape "
        f"{ids.shape}.")
  order = np.argsort(ids, kind="stable")
  counts = np.bincount(ids, minlength=int(ids.max()) + 1 if total else 0)
  ragged = Ragged(jax.tree.map(lambda x: np.asarray(x)[order], values),
                  np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
  check_ragged(ragged, "client_ids")
  return ragged


def check_ragged(ragged: Ragged, name: str) -> int:
  """Validates a `Ragged` and returns N.

  Raises:
    TypeError: if it is not a `Ragged`.
    ValueError: on bad offsets, leaves of different lengths, or an empty
      client (one with no example), naming the first such clients.
  """
  if not isinstance(ragged, Ragged):
    raise TypeError(f"`{name}` must be a prfl.data.Ragged, got "
                    f"{type(ragged)}.")
  offsets = np.asarray(ragged.offsets)
  total = tree_lib.num_leading(ragged.values, f"{name}.values")
  if (offsets.ndim != 1 or offsets.size < 2 or offsets[0] != 0 or
      offsets[-1] != total or not np.issubdtype(offsets.dtype, np.integer)):
    raise ValueError(
        f"`{name}.offsets` must be integers [N + 1] from 0 to the {total} "
        f"rows of `{name}.values`, got shape {offsets.shape}.")
  counts = np.diff(offsets)
  if np.any(counts < 0):
    raise ValueError(f"`{name}.offsets` must be non-decreasing.")
  empty = np.flatnonzero(counts == 0)
  if empty.size:
    raise ValueError(
        f"`{name}` has {empty.size} empty client(s), e.g. "
        f"{empty[:10].tolist()}: every client needs at least one example.")
  return offsets.size - 1


def check_host_data(data: HostData) -> int:
  """Validates `data` and returns N (before anything is compiled)."""
  if not isinstance(data, HostData):
    raise TypeError(f"`data` must be a prfl.data.HostData, got {type(data)}.")
  n = check_ragged(data.train, "data.train")
  nt = check_ragged(data.test, "data.test")
  if nt != n or np.shape(data.clusters) != (n,):
    raise ValueError(
        f"`data` is inconsistent: train has {n} clients, test {nt}, clusters "
        f"shape {np.shape(data.clusters)}.")
  return n


def client_batch_keys(batch_key: jax.Array, clients: jax.Array) -> jax.Array:
  """`[C]` keys: client c's batch key is `fold_in(batch_key, c)`."""
  return jax.vmap(lambda c: jax.random.fold_in(batch_key, c))(clients)


def batch_rows(batch_keys: jax.Array, clients: jax.Array, counts: jax.Array,
               width: int, batch_size: int):
  """Rows `[..., C, B]` of the clients' batches and their mask.

  Args:
    batch_keys: `[...]` keys, one per round.
    clients: `[..., C]` client ids.
    counts: `[N]` examples per client.
    width: M_max, the largest client's count.
    batch_size: B.

  Returns:
    `(rows, mask)`: int32 `[..., C, B]` positions inside each client (0 on
    padding) and bool `[..., C, B]`.
  """
  def one_round(key, ids):
    n = counts[ids]
    idx = federated.batch_rows(client_batch_keys(key, ids), width,
                               batch_size, n)
    mask = idx < n[:, None]
    return jnp.where(mask, idx, 0), mask
  flat_keys = batch_keys.reshape(-1)
  flat_ids = clients.reshape((-1,) + clients.shape[-1:])
  rows, mask = jax.vmap(one_round)(flat_keys, flat_ids)
  shape = clients.shape + (batch_size,)
  return rows.reshape(shape), mask.reshape(shape)


def gather(ragged: Ragged, clients: np.ndarray, rows: np.ndarray,
           mask: np.ndarray) -> padded.Padded:
  """`Padded` NumPy batches `[..., C, B, ...]` of the clients' rows.

  One `np.take` per leaf: the whole chunk's examples in one call.
  """
  flat = np.asarray(ragged.offsets)[clients][..., None] + rows
  return padded.Padded(
      jax.tree.map(lambda x: np.take(x, flat, axis=0), ragged.values),
      np.asarray(mask))


def padded_block(ragged: Ragged, clients: np.ndarray) -> padded.Padded:
  """Every example of the given clients, padded to their largest count.

  Returns:
    `Padded` with leaves `[len(clients), T, ...]` (T the largest count).
  """
  counts = ragged.counts[clients]
  width = int(counts.max())
  rows = np.arange(width)[None, :]
  mask = rows < counts[:, None]
  return gather(ragged, clients, np.where(mask, rows, 0), mask)
