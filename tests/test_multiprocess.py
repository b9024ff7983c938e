"""Two `jax.distributed` CPU processes give exactly the one-process result.

tests/multiprocess_worker.py runs the same program (Federated-Clustering with
mini-batches, groups, an attack and checkpoints, then FedAvg, through
`prfl.train`) as two processes with one CPU device each, every process
holding half of the clients (`prfl.sharding.shard_local_clients`, i.e.
`jax.make_array_from_process_local_data`), and as one process with two
(fake) devices: the same mesh, the same partitioned program. The final
states and histories must agree bit for bit, and the two-process checkpoints
must restore in this (one-device) process.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import optax
import pytest

import prfl_jax as prfl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "multiprocess_worker.py")
TIMEOUT_S = 420  # All three processes together; a healthy run takes ~15-30 s.


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run_all(commands, timeout):
  """Runs `(argv, env)` commands at once; kills all if one fails or hangs.

  Returns:
    list of `(returncode, output)`.
  """
  procs = [subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
           for argv, env in commands]
  deadline = time.monotonic() + timeout
  try:
    while any(p.poll() is None for p in procs):
      failed = any(p.poll() not in (None, 0) for p in procs)
      if failed or time.monotonic() > deadline:
        break  # A peer that died leaves the others waiting in a collective.
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
  return [(p.wait(), p.stdout.read()) for p in procs]


def _env(xla_flags):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=(
      os.environ.get("XLA_FLAGS", "") + " " + xla_flags).strip())
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


def test_two_processes_equal_one_process_and_checkpoints_restore_in_one(
    tmp_path):
  """Failed before: no multi-process path existed (`train` fetched results
  with `jax.device_get`, which cannot read arrays spanning processes, and
  the msgpack checkpoint needed the whole state in one process).

  The cohort run (each process holding half of the clients' data and
  state, every round's cohort gathered across both) must equal the
  one-process run bit for bit as well. Every process compiles each run's
  chunk once (seen to fail, two compiles, without `train` and the cohort
  driver placing the state by its layout before the first chunk).
  """
  if "jax_cpu_collectives_implementation" not in jax.config.values:
    pytest.skip("this jax has no CPU collectives (gloo) for multi-process "
                "CPU runs")
  port = _free_port()
  multi, single = tmp_path / "two_processes", tmp_path / "one_process"
  multi.mkdir()
  single.mkdir()
  commands = [([sys.executable, WORKER, str(i), "2", str(port), str(multi)],
               _env("")) for i in range(2)]
  commands.append(([sys.executable, WORKER, "0", "1", "0", str(single)],
                   _env("--xla_force_host_platform_device_count=2")))
  results = _run_all(commands, TIMEOUT_S)
  report = "\n".join(f"--- process {i}: exit {rc}\n{out[-3000:]}"
                     for i, (rc, out) in enumerate(results))
  assert all(rc == 0 for rc, _ in results), report
  for i, (_, out) in enumerate(results):
    assert f"process {i % 2}: done" in out, report

  for name in ("fc", "fedavg", "cohort"):
    two, one = np.load(multi / f"{name}.npz"), np.load(single / f"{name}.npz")
    assert sorted(two.files) == sorted(one.files)
    params = ".clients['params']" if name == "cohort" else ".params"
    assert params in two.files and "history/train/loss" in two.files
    for k in two.files:
      np.testing.assert_array_equal(two[k], one[k], err_msg=f"{name} {k}")
    assert np.all(np.isfinite(two[params]))

  # The two-process checkpoints restore in this one-device process.
  algs = {
      "fc": prfl.algorithms.federated_clustering(
          prfl.data.regression_loss, optax.sgd(0.05, momentum=0.9),
          radius=prfl.quantile_radius(0.5), num_groups=2,
          attack=prfl.attacks.gaussian(1.0)),
      "fedavg": prfl.algorithms.fedavg(prfl.data.regression_loss,
                                       optax.sgd(0.05)),
  }
  for name, alg in algs.items():
    assert prfl.checkpoint.rounds(multi / f"{name}_ckpt") == [2, 4]
    target = alg.init(np.zeros((8, 3), np.float32))
    state = prfl.checkpoint.restore(multi / f"{name}_ckpt", target)
    saved = np.load(multi / f"{name}.npz")
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    assert {jax.tree_util.keystr(p) for p, _ in leaves} <= set(saved.files)
    for path, x in leaves:
      np.testing.assert_array_equal(x, saved[jax.tree_util.keystr(path)])
    assert int(state.round) == 4
