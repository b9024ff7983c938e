"""Tests of prfl_jax.sharding: sharded rounds equal unsharded ones."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax import sharding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in a fresh process: the fake device count must be set before jax starts.
_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax
    import prfl_jax as prfl
    from prfl_jax import sharding
    assert jax.device_count() == 4, jax.devices()

    n, b, d, h, k = 8, 6, 5, 4, 3

    def loss(p, batch):
      x, y = batch
      logits = jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
      return -jnp.mean(jnp.sum(
          jax.nn.log_softmax(logits) * jax.nn.one_hot(y, k), -1))

    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
    params = {"w1": f32(n, d, h), "b1": f32(n, h), "w2": f32(n, h, k),
              "b2": f32(n, k)}
    shift = np.where(np.arange(n) < 4, 0.0, 2.0)[:, None, None]
    batch = ((f32(n, b, d) + shift).astype(np.float32),
             rng.integers(0, k, (n, b)).astype(np.int32))
    kr = jax.random.PRNGKey(1)
    byz = np.arange(n) == 7
    # The same plain loss and params with the ghost kernel (automatic
    # analysis); every dense layer through the ghost Gram, whatever it costs.
    prfl.kernels.ghost.uses_ghost = lambda *args, **kw: True
    ghost_params = {
        "Dense_0": {"kernel": params["w1"], "bias": params["b1"]},
        "Dense_1": {"kernel": params["w2"], "bias": params["b2"]}}
    ghost_loss = prfl.models.mlp_classifier_loss(2)
    first_leaf = lambda t: jax.tree.leaves(t)[0]
    for loss_fn, params, plan, attack in [
        (loss, params, prfl.ExecutionPlan(1, "gram"), prfl.attacks.bit_flip()),
        (ghost_loss, ghost_params, prfl.ExecutionPlan(2, "ghost"), None),
        (loss, params, prfl.ExecutionPlan(), None)]:
      alg = prfl.algorithms.federated_clustering(
          loss_fn, optax.sgd(0.1), radius=prfl.quantile_radius(0.5),
          num_iters=4, num_groups=2, plan=plan, attack=attack)
      step = jax.jit(alg.step)

      def run(state, batch):
        out = []
        for t in range(3):
          state, metrics = step(state, batch, jax.random.fold_in(kr, t))
          out.append(metrics["loss"])
        return state, jnp.stack(out)

      plain, plain_loss = run(alg.init(params, byzantine=byz), batch)
      for ndev in (4,):
        mesh = sharding.client_mesh(jax.devices()[:ndev])
        state = sharding.shard_clients(alg.init(params, byzantine=byz), mesh,
                                       name="state")
        sbatch = sharding.shard_clients(batch, mesh, name="batch")
        assert len(first_leaf(state.params).sharding.device_set) == ndev
        sharded, sharded_loss = run(state, sbatch)
        np.testing.assert_allclose(sharded_loss, plain_loss, rtol=2e-5,
                                   atol=1e-6)
        jax.tree.map(lambda a, r: np.testing.assert_allclose(
            a, r, rtol=2e-5, atol=2e-6), sharded.params, plain.params)
        assert len(first_leaf(sharded.params).sharding.device_set) == ndev

    mesh = sharding.client_mesh()
    try:
      sharding.shard_clients(jax.tree.map(lambda a: a[:6], batch), mesh,
                             name="batch")
    except ValueError as e:
      assert "`batch`" in str(e) and "N=6" in str(e), e
    else:
      raise AssertionError("no ValueError for N=6 on 4 devices")
    try:
      sharding.local_clients(6, mesh)
    except ValueError as e:
      assert "`num_clients`=6" in str(e), e
    else:
      raise AssertionError("no ValueError for 6 clients on 4 devices")
    assert sharding.local_clients(8, mesh) == slice(0, 8)  # One process.
    print("SHARDING_OK")
""")


def test_sharded_rounds_match_unsharded_on_4_fake_devices():
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      " --xla_force_host_platform_device_count=4").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "SHARDING_OK" in proc.stdout


def test_shard_clients_places_leaves_and_replicates_scalars():
  mesh = sharding.client_mesh()
  tree = {"x": jnp.ones((4, 3)), "round": jnp.zeros((), jnp.int32)}
  out = sharding.shard_clients(tree, mesh)
  assert out["x"].sharding.spec == jax.sharding.PartitionSpec("clients")
  assert out["round"].sharding.spec == jax.sharding.PartitionSpec()
  np.testing.assert_array_equal(out["x"], tree["x"])


def test_shard_clients_errors():
  mesh = sharding.client_mesh()
  with pytest.raises(ValueError, match="`params` leaves have different"):
    sharding.shard_clients({"a": jnp.ones((4,)), "b": jnp.ones((3,))}, mesh,
                           name="params")
  with pytest.raises(ValueError, match="no axis 'models'"):
    sharding.shard_clients({"a": jnp.ones((4,))}, mesh, axis_name="models")
  with pytest.raises(ValueError, match="`devices` is empty"):
    sharding.client_mesh([])
  if jax.device_count() > 1:
    n = jax.device_count() + 1
    with pytest.raises(ValueError, match=f"N={n}"):
      sharding.shard_clients(jnp.ones((n,)), mesh, name="batch")


def test_local_clients_and_shard_local_clients_in_one_process():
  """In one process this process holds every client, and
  `shard_local_clients` equals `shard_clients` (the multi-process case is
  tests/test_multiprocess.py)."""
  mesh = sharding.client_mesh()
  n = 2 * jax.device_count()
  assert sharding.local_clients(n, mesh) == slice(0, n)
  tree = {"x": np.arange(2 * n, dtype=np.float32).reshape(n, 2),
          "round": np.int32(3)}
  out = sharding.shard_local_clients(tree, mesh, num_clients=n, name="data")
  ref = sharding.shard_clients(tree, mesh)
  for k in tree:
    np.testing.assert_array_equal(out[k], ref[k])
    assert out[k].sharding == ref[k].sharding
  host = sharding.to_host(out)
  assert isinstance(host["x"], np.ndarray)
  np.testing.assert_array_equal(host["x"], tree["x"])
  with pytest.raises(ValueError, match=r"`data` leaves must hold this "
                     rf"process's {n} clients \(rows 0:{n} of {n}\)"):
    sharding.shard_local_clients({"x": tree["x"][:-1]}, mesh, num_clients=n,
                                 name="data")
  with pytest.raises(ValueError, match="no axis 'models'"):
    sharding.local_clients(n, mesh, axis_name="models")


_SHARDINGS_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    from prfl_jax import sharding
    assert jax.device_count() == 4, jax.devices()
    mesh = sharding.client_mesh()
    tree = {"x": np.arange(24.0).reshape(8, 3), "mask": np.zeros(8, bool),
            "round": np.int32(3)}
    spec = sharding.client_shardings(tree, mesh, name="state")
    assert spec["x"].spec == P("clients") and spec["mask"].spec == P("clients")
    assert spec["round"].spec == P()
    assert spec["x"].mesh is mesh
    whole = sharding.replicated(mesh)
    assert whole.spec == P() and whole.is_fully_replicated
    assert not spec["x"].is_fully_replicated
    placed = jax.device_put(tree, spec)
    # Each device holds its 2 clients' rows; the scalar is on every device.
    rows = {s.device: np.asarray(s.data) for s in placed["x"].addressable_shards}
    assert len(rows) == 4 and all(r.shape == (2, 3) for r in rows.values())
    np.testing.assert_array_equal(
        np.concatenate([rows[d] for d in mesh.devices]), tree["x"])
    assert all(np.asarray(s.data) == 3 for s in placed["round"].addressable_shards)
    full = jax.device_put(tree["x"], whole)
    assert all(np.asarray(s.data).shape == (8, 3) for s in full.addressable_shards)
    # A second mesh axis name is honoured.
    named = sharding.client_mesh(axis_name="models")
    assert sharding.client_shardings(tree, named, axis_name="models")[
        "x"].spec == P("models")
    try:
      sharding.client_shardings({"x": np.zeros((6, 2))}, mesh, name="params")
    except ValueError as e:
      assert "`params`" in str(e) and "N=6" in str(e), e
    else:
      raise AssertionError("no ValueError for N=6 on 4 devices")
    print("SHARDINGS_OK")
""")


def test_client_shardings_and_replicated_on_4_fake_devices():
  """`client_shardings` splits every leaf with a client axis into 2 rows per
  device and replicates scalars; `replicated` keeps a full copy everywhere.

  Mutations seen to fail: `replicated` returning `PartitionSpec(axis)`;
  `client_shardings` swapping the split and replicated shardings; the
  `axis_name` argument ignored.
  """
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      " --xla_force_host_platform_device_count=4").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-c", _SHARDINGS_SCRIPT], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "SHARDINGS_OK" in proc.stdout


def test_layout_like_splits_client_leaves_like_the_data():
  """`train` places its state by this layout (client leaves split like the
  data, the rest replicated) so that its chunk compiles once on a mesh
  (tests/test_multiprocess.py counts the compiles); `place_like` places it
  so and returns the layout. Seen to fail with `place_like` returning the
  state unplaced."""
  mesh = sharding.client_mesh()
  n = 2 * jax.device_count()
  data = sharding.shard_clients({"x": np.ones((n, 3), np.float32)}, mesh)
  state = {"params": np.zeros((n, 2)), "centres": np.zeros((n + 1, 2)),
           "round": np.int32(0)}
  layout = sharding.layout_like(state, data, n)
  assert layout["params"].spec == jax.sharding.PartitionSpec("clients")
  assert layout["centres"].spec == jax.sharding.PartitionSpec()
  assert layout["round"].spec == jax.sharding.PartitionSpec()
  assert layout["params"].mesh == mesh
  placed, same = sharding.place_like(state, data, n)  # train's one call.
  assert same == layout
  assert placed["params"].sharding == layout["params"]
  assert placed["round"].sharding == layout["round"]
  np.testing.assert_array_equal(placed["centres"], state["centres"])
  assert sharding.layout_like(state, {"x": np.ones((n, 3))}, n) is None
  assert sharding.layout_like(state, {"x": jnp.ones((n, 3))}, n) is None
  unplaced, none = sharding.place_like(state, None, n)  # No mesh: as given.
  assert none is None and unplaced is state
