"""Sharding the client axis of a federation over a `jax.sharding.Mesh`.

A federation is a stack: every leaf of the params, the optimizer state and the
client data has a leading client axis of size N (DESIGN.md). To run it on
several devices, that axis is split over a one-dimensional mesh with a
`NamedSharding(mesh, PartitionSpec("clients"))`; scalars (e.g. the round
counter) are replicated. The algorithms are unchanged: jitting a round on
sharded inputs lets XLA's SPMD partitioner place the work and insert the
communication (e.g. the all-gathers that the all-pairs gradients
`g_j(x_i)` need, since every model meets every client's data).

  mesh = prfl.sharding.client_mesh()            # all devices, axis "clients"
  state = prfl.sharding.shard_clients(alg.init(params), mesh)
  batch = prfl.sharding.shard_clients(batch, mesh, name="batch")
  state, metrics = jax.jit(alg.step)(state, batch, key)

Across processes (hosts), call `jax.distributed.initialize()` first;
`client_mesh()` then spans every process's devices, and the same program runs
in every process (benchmarks/README.md). Each process then needs only the rows
of its own devices: `local_clients(n, mesh)` says which, `shard_local_clients`
assembles the global arrays from every process's rows, and `to_host` reads a
result back as NumPy in every process:

  rows = prfl.sharding.local_clients(n, mesh)      # e.g. slice(0, n // 2)
  train = prfl.sharding.shard_local_clients(load(rows), mesh, num_clients=n)
"""

import math
from typing import Any, Optional, Sequence

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

PyTree = Any

CLIENT_AXIS = "clients"


def client_mesh(devices: Optional[Sequence[jax.Device]] = None,
                axis_name: str = CLIENT_AXIS) -> Mesh:
  """A one-dimensional mesh whose single axis carries the clients.

  Args:
    devices: devices to use, in order; default `jax.devices()` (all devices of
      all processes once `jax.distributed` is initialised).
    axis_name: name of the mesh axis.

  Returns:
    `Mesh` of shape `[len(devices)]`.

  Raises:
    ValueError: if `devices` is empty.
  """
  devices = jax.devices() if devices is None else list(devices)
  if not devices:
    raise ValueError("`devices` is empty; a mesh needs at least one device.")
  return Mesh(np.asarray(devices), (axis_name,))


def client_sharding(mesh: Mesh, axis_name: str = CLIENT_AXIS) -> NamedSharding:
  """`NamedSharding` that splits the leading (client) axis over `axis_name`."""
  return NamedSharding(mesh, PartitionSpec(axis_name))


def replicated(mesh: Mesh) -> NamedSharding:
  """`NamedSharding` that keeps a full copy on every device of `mesh`."""
  return NamedSharding(mesh, PartitionSpec())


def _axis_size(mesh: Mesh, axis_name: str) -> int:
  if axis_name not in mesh.shape:
    raise ValueError(
        f"`mesh` has no axis {axis_name!r}; its axes are "
        f"{tuple(mesh.shape)}.")
  return mesh.shape[axis_name]


def client_shardings(tree: PyTree, mesh: Mesh, *, name: str = "tree",
                     axis_name: str = CLIENT_AXIS) -> PyTree:
  """The sharding of every leaf of a stacked pytree (see `shard_clients`).

  Args:
    tree: pytree whose non-scalar leaves all have the leading client axis N.
    mesh: the mesh.
    name: argument name used in error messages.
    axis_name: mesh axis that carries the clients.

  Returns:
    pytree of `NamedSharding`, same structure as `tree`.

  Raises:
    ValueError: if the non-scalar leaves disagree on N, or N is not divisible
      by the size of the mesh axis.
  """
  size = _axis_size(mesh, axis_name)
  leading = sorted({np.shape(x)[0] for x in jax.tree.leaves(tree)
                    if np.ndim(x)})
  if len(leading) > 1:
    raise ValueError(
        f"`{name}` leaves have different leading axes {leading}; every "
        "non-scalar leaf must have the client axis first.")
  if leading and leading[0] % size:
    n = leading[0]
    raise ValueError(
        f"`{name}` has N={n} clients, which is not divisible by the {size} "
        f"devices of the mesh axis {axis_name!r}; pad the federation with "
        "weight-0 clients or use a divisor of N devices.")
  split, whole = client_sharding(mesh, axis_name), replicated(mesh)
  return jax.tree.map(lambda x: split if np.ndim(x) else whole, tree)


def shard_clients(tree: PyTree, mesh: Mesh, *, name: str = "tree",
                  axis_name: str = CLIENT_AXIS) -> PyTree:
  """Places a stacked pytree on `mesh`, split along the client axis.

  Every leaf with a leading axis (params, optimizer state, client data, the
  Byzantine mask: `[N, ...]`) is split into `N / num_devices` clients per
  device; scalar leaves (e.g. the round counter) are replicated.

  Across processes (`jax.distributed`), every process passes the same full
  value of host-local leaves (NumPy, or arrays on its own devices) and keeps
  only its own devices' rows; leaves that already span several processes
  (e.g. a state built from `shard_local_clients` data) are resharded.

  Args:
    tree: pytree of arrays; non-scalar leaves have leading axis N.
    mesh: mesh from `client_mesh`.
    name: argument name used in error messages (e.g. `"batch"`).
    axis_name: mesh axis that carries the clients.

  Returns:
    the same pytree as `jax.Array`s with `NamedSharding`s.

  Raises:
    ValueError: as `client_shardings`.
  """
  return place(tree, client_shardings(tree, mesh, name=name,
                                      axis_name=axis_name))


def place(tree: PyTree, shardings: PyTree) -> PyTree:
  """`jax.device_put(tree, shardings)`, also across processes.

  Across processes (`jax.distributed`), every process passes the same full
  value of host-local leaves and keeps only its own devices' part; leaves
  that already span several processes are resharded.

  Args:
    tree: pytree of arrays.
    shardings: pytree of `jax.sharding.Sharding`, same structure as `tree`.

  Returns:
    `tree` as `jax.Array`s placed by `shardings`.
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)

  def put(x, sharding):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding,
                                        lambda index: host[index])
  return jax.tree.map(put, tree, shardings)


def layout_like(tree: PyTree, data: PyTree,
                num_clients: int) -> Optional[PyTree]:
  """Where `tree` belongs on the mesh that `data`'s client axis is split over.

  A leaf with the leading client axis (`[num_clients, ...]`, e.g. the
  params, the momentum, the Byzantine mask) is split like `data`; any other
  leaf (the round counter, `[K, ...]` cluster models) is replicated. A jitted
  function given these as its inputs' and outputs' shardings sees the same
  layout in every call, so it compiles once (an uncommitted input and a
  replicated output otherwise make the second call compile again).

  Args:
    tree: pytree of arrays (e.g. an algorithm's state).
    data: pytree whose leaves may be split over a mesh (e.g. the clients'
      training data, `[N, ...]`).
    num_clients: N.

  Returns:
    pytree of `NamedSharding`, same structure as `tree`, or None when no leaf
    of `data` is split over a mesh axis (nothing to place).
  """
  for leaf in jax.tree.leaves(data):
    where = getattr(leaf, "sharding", None)
    if isinstance(where, NamedSharding) and where.spec and where.spec[0]:
      mesh, axes = where.mesh, where.spec[0]
      break
  else:
    return None
  size = math.prod(mesh.shape[a] for a in
                   (axes if isinstance(axes, tuple) else (axes,)))
  split, whole = NamedSharding(mesh, PartitionSpec(axes)), replicated(mesh)

  def choose(x):
    shape = np.shape(x)
    return split if shape and shape[0] == num_clients and not (
        num_clients % size) else whole
  return jax.tree.map(choose, tree)


def place_like(tree: PyTree, data: PyTree,
               num_clients: int) -> tuple[PyTree, Optional[PyTree]]:
  """`tree` placed by `layout_like(tree, data, num_clients)`, and the layout.

  What a loop over jitted chunks needs before its first call: the state
  committed to its layout, and the layout to pass as the chunk's output
  sharding, so that every call sees one layout and the chunk compiles once.

  Args:
    tree: pytree of arrays (e.g. an algorithm's state).
    data: pytree whose leaves may be split over a mesh (e.g. the clients'
      training data, `[N, ...]`), or None.
    num_clients: N.

  Returns:
    (tree placed by the layout, layout), or (tree, None) when no leaf of
    `data` is split over a mesh axis.
  """
  layout = layout_like(tree, data, num_clients)
  return (tree if layout is None else place(tree, layout)), layout


def local_clients(num_clients: int, mesh: Mesh, *,
                  axis_name: str = CLIENT_AXIS) -> slice:
  """The clients (rows) that this process's devices hold on `mesh`.

  With `client_mesh()` (devices ordered by process) every process holds one
  contiguous block of `num_clients / jax.process_count()` clients.

  Args:
    num_clients: N, divisible by the size of the mesh axis.
    mesh: the mesh.
    axis_name: mesh axis that carries the clients.

  Returns:
    `slice(start, stop)` into the client axis.

  Raises:
    ValueError: if N is not divisible by the axis size, or this process's
      rows are not contiguous (a mesh whose devices are not grouped by
      process).
  """
  size = _axis_size(mesh, axis_name)
  if num_clients % size:
    raise ValueError(
        f"`num_clients`={num_clients} is not divisible by the {size} devices "
        f"of the mesh axis {axis_name!r}.")
  indices = client_sharding(mesh, axis_name).addressable_devices_indices_map(
      (num_clients,))
  rows = sorted({idx[0].indices(num_clients)[:2] for idx in indices.values()})
  start, stop = rows[0][0], rows[-1][1]
  if sum(b - a for a, b in rows) != stop - start:
    raise ValueError(
        f"this process's devices hold the non-contiguous client blocks {rows} "
        "on `mesh`; order the mesh's devices by process (as `client_mesh()` "
        "does).")
  return slice(start, stop)


def shard_local_clients(tree: PyTree, mesh: Mesh, *, num_clients: int,
                        name: str = "tree",
                        axis_name: str = CLIENT_AXIS) -> PyTree:
  """Global arrays from every process's own rows (multi-process placement).

  Every process calls it with the rows `local_clients(num_clients, mesh)` of
  each non-scalar leaf (`[N / num_processes, ...]`) and the same value of
  every scalar leaf; no process ever holds the whole federation. In one
  process it equals `shard_clients(tree, mesh)`.

  Args:
    tree: pytree; non-scalar leaves `[rows of this process, ...]`.
    mesh: mesh from `client_mesh`.
    num_clients: N, the global number of clients.
    name: argument name used in error messages.
    axis_name: mesh axis that carries the clients.

  Returns:
    the global pytree: non-scalar leaves `[N, ...]` split over `axis_name`,
    scalars replicated.

  Raises:
    ValueError: if a leaf's leading axis is not this process's row count.
  """
  rows = local_clients(num_clients, mesh, axis_name=axis_name)
  count = rows.stop - rows.start
  split, whole = client_sharding(mesh, axis_name), replicated(mesh)

  def place(x):
    x = np.asarray(x)
    if not x.ndim:
      return jax.make_array_from_process_local_data(whole, x, ())
    if x.shape[0] != count:
      raise ValueError(
          f"`{name}` leaves must hold this process's {count} clients "
          f"(rows {rows.start}:{rows.stop} of {num_clients}), got a leaf of "
          f"shape {x.shape}.")
    return jax.make_array_from_process_local_data(
        split, x, (num_clients,) + x.shape[1:])
  return jax.tree.map(place, tree)


def to_host(tree: PyTree) -> PyTree:
  """Every leaf as a NumPy array holding its global value, in every process.

  A collective across processes when a leaf spans several of them (every
  process must call it); otherwise `jax.device_get`.
  """
  def fetch(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(fetch, tree)


__all__ = [
    "CLIENT_AXIS", "client_mesh", "client_sharding", "client_shardings",
    "layout_like", "local_clients", "place", "place_like", "replicated",
    "shard_clients", "shard_local_clients", "to_host",
]
