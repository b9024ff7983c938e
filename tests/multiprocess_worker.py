"""One process of the multi-process test (tests/test_multiprocess.py).

  python tests/multiprocess_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR

With NUM_PROCESSES > 1 it joins a `jax.distributed` CPU cluster (gloo
collectives) on localhost:PORT; with 1 it is the single-process reference
(run it with 2 fake host devices for the same mesh). Either way it runs the
same program: every process builds only its own clients' rows, assembles the
global federation with `prfl.sharding.shard_local_clients`, and trains
Federated-Clustering (mini-batches, groups, an attack, checkpoints), FedAvg
and a cohort run of Federated-Clustering (4 of 8 clients per round, one
dropping out) with `prfl.train`; every run (two chunks each) must compile its
chunk once. Process 0 writes the final states and histories to
OUT_DIR/<name>.npz; the FC run's checkpoints go to OUT_DIR/fc_ckpt.
"""

import os
import sys

import jax


def main(process_id: int, num_processes: int, port: int, out: str):
  if num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=num_processes,
        process_id=process_id, initialization_timeout=60)
  import numpy as np  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  import prfl_jax as prfl  # pylint: disable=import-outside-toplevel
  from prfl_jax import sharding  # pylint: disable=import-outside-toplevel

  n, dim = 8, 3
  mesh = sharding.client_mesh()
  assert mesh.size == 2, mesh
  rows = sharding.local_clients(n, mesh)
  assert rows.stop - rows.start == n * len(jax.local_devices()) // 2, rows
  # Stand-in for loading only this process's clients from storage.
  full = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=2,
                                        clients_per_cluster=4, dim=dim,
                                        num_samples=6)[0]
  mine = lambda tree: jax.tree.map(lambda x: np.asarray(x)[rows], tree)
  local = lambda tree, name: sharding.shard_local_clients(
      mine(tree), mesh, num_clients=n, name=name)
  data = prfl.data.FederatedData(
      train=local(full.train, "train"), test=local(full.test, "test"),
      clusters=np.asarray(full.clusters))
  params = local(np.zeros((n, dim), np.float32), "params")
  # A full host copy works as well: every process keeps its own rows.
  mask = sharding.shard_clients(np.arange(n) == n - 1, mesh, name="byzantine")
  algorithms = {
      "fc": prfl.algorithms.federated_clustering(
          prfl.data.regression_loss, optax.sgd(0.05, momentum=0.9),
          radius=prfl.quantile_radius(0.5), num_groups=2,
          attack=prfl.attacks.gaussian(1.0)),
      "fedavg": prfl.algorithms.fedavg(prfl.data.regression_loss,
                                       optax.sgd(0.05)),
      # 4 of the 8 clients per round, one of them dropping out.
      "cohort": prfl.participation.cohort(
          prfl.algorithms.federated_clustering(
              prfl.data.regression_loss, optax.sgd(0.05, momentum=0.9),
              radius=prfl.quantile_radius(0.5)),
          cohort_size=4, dropout=0.25),
  }
  # `train`'s chunk program (dense or cohort), compiled (or read from the
  # cache) once per run although the run has two chunks.
  chunk_compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _, fun_name=None, **kw: chunk_compiles.append(name) if (
          event == "/jax/core/compile/backend_compile_duration" and
          fun_name in ("jit(chunk)", "jit(device_chunk)")) else None)
  for name, alg in algorithms.items():
    result = prfl.train(
        alg, params, data, byzantine=mask, num_rounds=4, eval_every=2,
        key=jax.random.key(1), batch_size=2, eval_fn=prfl.data.regression_eval,
        checkpoint_path=os.path.join(out, f"{name}_ckpt"), verbose=False)
    assert chunk_compiles.count(name) == 1, (name, chunk_compiles)
    sharded = result.state.clients["params"] if name == "cohort" else (
        result.state.params)
    assert not sharded.is_fully_addressable or num_processes == 1
    final = sharding.to_host(result.state)
    if jax.process_index() == 0:
      leaves = jax.tree_util.tree_flatten_with_path(final)[0]
      np.savez(os.path.join(out, f"{name}.npz"),
               **{jax.tree_util.keystr(p): x for p, x in leaves},
               **{f"history/{k}": v for k, v in result.history.items()
                  if k != "elapsed_s"})
  print(f"process {process_id}: done", flush=True)
  if num_processes > 1:
    jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
