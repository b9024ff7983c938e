"""Federated-Clustering rounds/s with the client axis sharded over 1, 2, 4 devices.

Runs on fake CPU devices (`--xla_force_host_platform_device_count`); the script
re-executes itself with that flag when fewer devices are visible. Fake host
devices share this machine's cores, so this shows that sharded rounds are
correct and what the SPMD partitioning costs, not a speed-up; on real devices
(GPUs/TPUs, or hosts joined with `jax.distributed.initialize`) the per-device
work shrinks with the device count.

  python -m benchmarks.bench_sharding --clients 16 --rounds 5
"""

import argparse
import os
import subprocess
import sys
import time

import jax
import numpy as np

from prfl_jax import sharding
from benchmarks import common


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--devices", default="1,2,4")
  p.add_argument("--clients", type=int, default=16)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--num-groups", type=int, default=1)
  p.add_argument("--rounds", type=int, default=5, help="timed rounds")
  p.add_argument("--plan", default="1:gram",
                 help="CHUNK:KERNEL execution plan")
  p.add_argument("--out", default="sharding_cpu.json")
  args = p.parse_args(argv)
  counts = [int(c) for c in args.devices.split(",")]
  if jax.device_count() < max(counts):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count="
                        f"{max(counts)}").strip()
    return subprocess.call([sys.executable, "-m", "benchmarks.bench_sharding"]
                           + (argv if argv is not None else sys.argv[1:]),
                           env=env)

  alg = common.algorithm(
      "fc", common.mlp_loss, lr=0.1, momentum=0.0, quantile=0.2,
      num_iters=10, groups=args.num_groups,
      **common.plan_settings(args.plan))
  params, batch = common.mnist_like_federation(args.clients, args.batch_size)
  step = jax.jit(alg.step)
  key = jax.random.PRNGKey(1)
  info = common.machine_info()
  rows, reference = [], None
  for ndev in counts:
    mesh = sharding.client_mesh(jax.devices()[:ndev])
    state = sharding.shard_clients(alg.init(params), mesh, name="state")
    sbatch = sharding.shard_clients(batch, mesh, name="batch")
    t0 = time.perf_counter()
    state, _ = jax.block_until_ready(step(state, sbatch, key))
    first = time.perf_counter() - t0
    times = []
    for r in range(args.rounds):
      t0 = time.perf_counter()
      state, _ = jax.block_until_ready(
          step(state, sbatch, jax.random.fold_in(key, r)))
      times.append(time.perf_counter() - t0)
    flat = np.concatenate([np.asarray(x).ravel()
                           for x in jax.tree.leaves(state.params)])
    if reference is None:
      reference = flat
    t = float(np.median(times))
    rows.append(dict(devices=ndev, time_s=t, rounds_per_s=1 / t,
                     compile_and_first_s=first,
                     max_abs_diff=float(np.max(np.abs(flat - reference))),
                     sharding=str(state.params["Dense_0"]["kernel"].sharding.spec)))
    print(f"  {ndev} device(s): {t:.3f} s/round", flush=True)
  base = rows[0]["time_s"]
  for r in rows:
    r["vs_1_device"] = base / r["time_s"]
  info["loadavg_end"] = os.getloadavg()
  print(f"\nFederated-Clustering round, MLP 784-200-10, N={args.clients}, "
        f"batch {args.batch_size}, G={args.num_groups}, plan "
        f"{args.plan}; {os.cpu_count()} CPU cores shared by "
        f"{jax.device_count()} fake host devices.")
  print("NOTE: fake host devices share the same cores: this measures "
        "correctness and SPMD overhead, not a speed-up.")
  print(common.format_table(rows, [
      ("devices", "devices", "{}"), ("time_s", "s/round", "{:.3f}"),
      ("rounds_per_s", "rounds/s", "{:.2f}"),
      ("vs_1_device", "x 1 device", "{:.2f}"),
      ("compile_and_first_s", "compile+1st s", "{:.1f}"),
      ("max_abs_diff", "maxdiff vs 1", "{:.1e}"),
      ("sharding", "params spec", "{}")]))
  print(f"load average start {info['loadavg']} end {info['loadavg_end']}")
  print("saved", common.save_json(args.out, dict(args=vars(args), machine=info,
                                                 rows=rows)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
