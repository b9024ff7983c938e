"""`fedavg(mesh=)`: the clients' local training spread over devices.

The suite's process has one CPU device, so the two-device case runs in a
child process whose XLA makes two (`--xla_force_host_platform_device_count`).
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl

_CHILD = r"""
import json
import jax, jax.numpy as jnp, numpy as np, optax
import prfl_jax as prfl
from prfl_jax.algorithms.fedavg import local_updates

def loss(x, batch):  # 0.5 * mean_b ||x - c_b||^2
  return 0.5 * jnp.mean(jnp.sum((x[None] - batch) ** 2, -1))

mesh = prfl.sharding.client_mesh()
batch = jnp.array([[[0.0], [4.0]], [[8.0], [0.0]], [[1.0], [3.0]],
                   [[5.0], [7.0]]])
params = jnp.arange(4.0)[:, None]
deltas, losses = jax.jit(lambda p, b: local_updates(
    loss, optax.sgd(0.5), p, b, 2, 1, mesh))(params, batch)
out = {"devices": len(jax.devices()), "deltas": np.ravel(deltas).tolist(),
       "losses": np.asarray(losses).tolist(),
       "sharded": len(deltas.sharding.device_set)}
try:
  local_updates(loss, optax.sgd(0.5), params[:3], batch[:3], 2, 1, mesh)
except ValueError as e:
  out["error"] = str(e)
print(json.dumps(out))
"""


def test_two_devices_train_the_clients_of_one_device():
  """Two devices, two clients each: every client's change and first loss
  by hand, the changes left on both devices, and a clear error when 3
  clients do not divide over 2 devices.

  Seen to fail when the mesh path hands each device the whole batch
  (`in_specs=(spec, PartitionSpec())`) and when it returns one device's
  clients only (`out_specs=PartitionSpec()`).
  """
  # The child runs on the CPU platform wherever the suite runs: on a
  # one-GPU machine its default devices would be that one GPU (an H200 run
  # read 1 device), and the flag below makes CPU devices only.
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=(
      os.environ.get("XLA_FLAGS", "") +
      " --xla_force_host_platform_device_count=2").strip())
  run = subprocess.run([sys.executable, "-c", _CHILD], env=env, check=True,
                       capture_output=True, text=True, timeout=120,
                       cwd=pathlib.Path(__file__).resolve().parents[1])
  out = json.loads(run.stdout.splitlines()[-1])
  assert out["devices"] == 2 and out["sharded"] == 2
  # Client j's two SGD steps (lr 0.5) from x_j on its batches c_a, c_b:
  # x1 = x_j / 2 + c_a / 2, x2 = x1 / 2 + c_b / 2; first loss (x_j - c_a)^2/2.
  x = np.arange(4.0)
  b = np.array([[0.0, 4.0], [8.0, 0.0], [1.0, 3.0], [5.0, 7.0]])
  x1 = x / 2 + b[:, 0] / 2
  np.testing.assert_allclose(out["deltas"], x1 / 2 + b[:, 1] / 2 - x,
                             rtol=1e-6)
  np.testing.assert_allclose(out["losses"], 0.5 * (x - b[:, 0])**2,
                             rtol=1e-6)
  assert "3 clients" in out["error"] and "2 devices" in out["error"]


def test_one_device_mesh_is_the_plain_run():
  def loss(x, batch):
    return 0.5 * jnp.mean(jnp.sum((x[None] - batch) ** 2, -1))
  batch = jnp.arange(12.0).reshape(3, 4, 1)
  runs = []
  for mesh in (None, prfl.sharding.client_mesh(jax.devices()[:1])):
    alg = prfl.algorithms.fedavg(loss, optax.sgd(0.5), local_steps=2,
                                 mesh=mesh)
    runs.append(jax.jit(alg.step)(alg.init(jnp.zeros((3, 1))), batch,
                                  jax.random.key(0))[0].params)
  np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(mesh="cpu", local_steps=2), "one-dimensional"),
    (dict(mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1),
                                 ("a", "b")), local_steps=2),
     "one-dimensional"),
    (dict(mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]), ("a",)),
          local_steps=1), "local_steps"),
])
def test_bad_mesh_is_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    prfl.algorithms.fedavg(lambda p, b: 0.0, optax.sgd(0.5), **kwargs)
