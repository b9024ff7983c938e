"""Memory of the paper's MNIST configuration, and O(N) rounds vs N single passes.

1. Peak memory: Federated-Clustering on the paper's MNIST setting (N=300
   clients re-shuffled into groups of 20, i.e. `num_groups=15`; MLP
   784-200-10, batch 32), two jitted rounds, each execution plan in a fresh
   subprocess whose peak RSS (`ru_maxrss`) is reported, next to the RSS of a
   subprocess that only builds the same inputs (baseline). The round is
   jitted with the state donated (`donate_argnums=0`), as `prfl.train` does,
   so the new params are written over the old ones; the inputs are built
   without a second full copy (`common.mnist_like_federation`). Also
   reported: the RSS once the inputs are built and once the round is compiled
   (the compiler's memory, which glibc keeps after compiling).
2. O(N) algorithms: one round of `local` and `fedavg` (per-client gradients
   `client_grads` + an optax step, jitted) vs N single forward/backward passes
   (one jitted `value_and_grad` on one client's batch, timed alone, times N).

  python -m benchmarks.bench_scale
"""

import argparse
import json
import os
import subprocess
import sys

import jax

from benchmarks import common

_CHILD = """
import json, resource, sys, time
import jax
from benchmarks import common
n, g, b, spec, rounds = {n}, {g}, {b}, {spec!r}, {rounds}
rss_mb = lambda: common.RssSampler.rss() / 2**20
params, batch = common.mnist_like_federation(n, b)
jax.block_until_ready((params, batch))
out = dict(spec=spec, inputs_rss_mb=rss_mb())
if spec != "baseline":
  alg = common.algorithm(
      "fc", common.mlp_loss, lr=0.1, momentum=0.0, quantile=0.2,
      num_iters=10, groups=g, **common.plan_settings(spec))
  state = alg.init(params)
  del params  # The state holds these arrays; the first round consumes them.
  key = jax.random.PRNGKey(0)
  t0 = time.perf_counter()
  # The state is donated: the new params are written over the old ones.
  step = jax.jit(alg.step, donate_argnums=0).lower(state, batch, key).compile()
  mem = step.memory_analysis()
  out["xla_temp_mb"] = mem.temp_size_in_bytes / 2**20
  out["xla_alias_mb"] = mem.alias_size_in_bytes / 2**20
  out["compiled_rss_mb"] = rss_mb()
  state, _ = jax.block_until_ready(step(state, batch, key))
  out["compile_and_first_s"] = time.perf_counter() - t0
  times = []
  for r in range(rounds):
    t0 = time.perf_counter()
    state, _ = jax.block_until_ready(step(state, batch,
                                          jax.random.fold_in(key, r)))
    times.append(time.perf_counter() - t0)
  out["time_s"] = sorted(times)[len(times) // 2]
out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT" + json.dumps(out))
"""


def memory_rows(args):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ)
  env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
  rows = []
  for spec in ["baseline"] + args.plans.split(","):
    code = _CHILD.format(n=args.clients, g=args.num_groups, b=args.batch_size,
                         spec=spec, rounds=args.rounds)
    proc = subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, cwd=repo)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")]
    if proc.returncode or not line:
      print(f"  {spec}: failed\n{proc.stderr[-2000:]}")
      rows.append(dict(spec=spec, failed=True))
      continue
    row = json.loads(line[0][len("RESULT"):])
    rows.append(row)
    print(f"  {spec}: peak RSS {row['max_rss_mb']:.0f} MiB", flush=True)
  base = rows[0].get("max_rss_mb")
  for r in rows:
    if "max_rss_mb" in r and base:
      r["over_baseline_mb"] = r["max_rss_mb"] - base
  return rows


def linear_rows(args):
  rows = []
  single = jax.jit(jax.value_and_grad(common.mlp_loss))
  for n in [int(c) for c in args.linear_clients.split(",")]:
    params, batch = common.mnist_like_federation(n, args.batch_size)
    one_p = jax.tree.map(lambda x: x[0], params)
    one_b = jax.tree.map(lambda x: x[0], batch)
    t_single, _ = common.median_time(
        lambda: jax.block_until_ready(single(one_p, one_b)), repeats=20,
        warmup=3)
    for name, registered in (("local", "local"), ("fedavg", "global")):
      alg = common.algorithm(registered, common.mlp_loss, lr=0.1,
                             momentum=0.0)
      step = jax.jit(alg.step)
      state = alg.init(params)
      key = jax.random.PRNGKey(0)
      t, _ = common.median_time(
          lambda: jax.block_until_ready(step(state, batch, key)), repeats=10,
          warmup=2)
      rows.append(dict(n=n, algorithm=name, round_s=t,
                       n_single_s=n * t_single, single_ms=t_single * 1e3,
                       ratio=t / (n * t_single)))
      print(f"  N={n} {name}: {t * 1e3:.1f} ms/round vs N x single "
            f"{n * t_single * 1e3:.1f} ms", flush=True)
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--clients", type=int, default=300)
  p.add_argument("--num-groups", type=int, default=15)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--plans", default="1:gram,4:gram,full:gram,1:ghost,4:ghost",
                 help="comma-separated CHUNK:KERNEL execution plans")
  p.add_argument("--linear-clients", default="32,300")
  p.add_argument("--out", default="scale_cpu.json")
  args = p.parse_args(argv)
  info = common.machine_info()
  print(f"1. Federated-Clustering N={args.clients}, G={args.num_groups} "
        f"(groups of {-(-args.clients // args.num_groups)}), peak RSS per "
        "execution plan (fresh subprocess each):", flush=True)
  mem = memory_rows(args)
  print("2. O(N) rounds:", flush=True)
  lin = linear_rows(args)
  info["loadavg_end"] = os.getloadavg()
  print(f"\nFederated-Clustering, MLP 784-200-10, N={args.clients}, "
        f"G={args.num_groups}, batch {args.batch_size}; peak RSS = ru_maxrss "
        "of a fresh process (baseline: inputs only); XLA temp = compiled "
        "memory_analysis of the jitted round (state donated).")
  print(common.format_table(mem, [
      ("spec", "plan", "{}"), ("max_rss_mb", "peak RSS MiB", "{:.0f}"),
      ("over_baseline_mb", "over baseline MiB", "{:.0f}"),
      ("inputs_rss_mb", "RSS inputs MiB", "{:.0f}"),
      ("compiled_rss_mb", "RSS compiled MiB", "{:.0f}"),
      ("xla_temp_mb", "XLA temp MiB", "{:.0f}"),
      ("time_s", "s/round", "{:.2f}"),
      ("compile_and_first_s", "compile+1st s", "{:.1f}")]))
  print("\nO(N) round (client_grads + optax step, jitted) vs N single "
        "jitted forward/backward passes of one client:")
  print(common.format_table(lin, [
      ("n", "N", "{}"), ("algorithm", "algorithm", "{}"),
      ("round_s", "round s", "{:.4f}"), ("single_ms", "1 pass ms", "{:.3f}"),
      ("n_single_s", "N passes s", "{:.4f}"),
      ("ratio", "round / N passes", "{:.2f}")]))
  print(f"load average start {info['loadavg']} end {info['loadavg_end']}")
  print("saved", common.save_json(args.out, dict(
      args=vars(args), machine=info, memory=mem, linear=lin)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
