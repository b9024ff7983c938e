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

Across hosts, call `jax.distributed.initialize()` first; `client_mesh()` then
spans every process's devices (see benchmarks/README.md).
"""

from typing import Any, Optional, Sequence

import jax
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
  return jax.device_put(tree, client_shardings(tree, mesh, name=name,
                                               axis_name=axis_name))


__all__ = [
    "CLIENT_AXIS", "client_mesh", "client_sharding", "client_shardings",
    "replicated", "shard_clients",
]
