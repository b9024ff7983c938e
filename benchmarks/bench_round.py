"""One Federated-Clustering round: prfl_jax execution plans vs per-pair loops.

A round (Werner et al., 2023, Algorithm 1, lines 4-7) computes every client's
gradient at every client's model (N^2 gradients) and, for every model, runs
Threshold-Clustering (Algorithm 2) with one centre started at the model owner's
own gradient. Model: the paper's MNIST MLP 784-200-10 (ReLU, softmax
cross-entropy), random data of MNIST shape.

Compared in one run, on the same parameters and data:
  * every requested prfl_jax execution plan (`kernels.cluster_at_models`,
    jitted), the ghost kernel (`prfl_jax.kernels.ghost`, no per-client weight
    gradients) among them, for every requested way of writing the MLP's loss
    (`--losses`): `library` (`prfl.models.mlp_classifier_loss(2)`), `user`
    (as a user writes it: params a dict of w1, b1, w2, b2, `x @ w1 + b1`,
    relu, `optax.softmax_cross_entropy_with_integer_labels`) and `flax` (a
    `flax.linen` MLP of two `nn.Dense`); the ghost kernel finds their layers
    itself;
  * a per-pair JAX loop: a jitted gradient per (model, client) pair in a
    Python double loop, then jitted Threshold-Clustering per model;
  * a per-pair PyTorch loop written like the paper's code (for each model, for
    each client: forward, backward, flatten the gradients; then
    Threshold-Clustering in torch), skipped with a message without torch.

FLOPs are counted as 6 * params * batch per gradient (N^2 gradients per round).
Memory: `xla_mb` is XLA's compiled memory_analysis (temporaries + outputs) of
the jitted round; `rss_mb` is the growth of the process's resident set during
the timed calls (sampled every 2 ms; a lower bound when freed memory is reused).

  python -m benchmarks.bench_round                       # N in 8,16,32,64
  python -m benchmarks.bench_round --clients 32 --repeats 5 --radius 0.5
  python -m benchmarks.bench_round --clients 32 --losses library,user,flax \
      --plans 1:gram,auto:auto,4:ghost
"""

import argparse
import gc
import os
import sys

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from prfl_jax import kernels
from benchmarks import common
from benchmarks import gemm_rate
from benchmarks import torch_loop
from benchmarks import zoo

NUM_CPUS = os.cpu_count() or 1
DEFAULT_PLANS = ("full:gram,1:gram,1:direct,4:gram,full:ghost,1:ghost,"
                     "2:ghost,4:ghost,8:ghost")


def flat_centers(centers) -> np.ndarray:
  """`[N, P]` in `ravel_pytree` order (b1, w1, b2, w2)."""
  leaves = jax.tree.leaves(centers)
  n = leaves[0].shape[0]
  return np.concatenate([np.asarray(l).reshape(n, -1) for l in leaves], 1)


def run_plan(plan, params, batch, radius, num_iters, repeats, budget_s,
             loss="library"):
  """Compiles and times one jitted round with `plan` and the `loss` variant."""
  loss_fn, convert, back = zoo.LOSSES[loss]
  params = convert(params)
  compiled, compile_s = common.compile_round(loss_fn, params, batch, plan,
                                             radius, num_iters)
  mem = compiled.memory_analysis()
  xla_mb = None
  if mem is not None:
    xla_mb = (mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**20
  res, out = common.time_round(
      lambda: jax.block_until_ready(compiled(params, batch)), repeats,
      budget_s)
  return dict(res, compile_s=compile_s, xla_mb=xla_mb), flat_centers(
      back(out))


def run_jax_loop(params, batch, radius, num_iters, repeats, budget_s):
  """Per-pair jitted gradients in a Python double loop, then clustering."""
  n = jax.tree.leaves(params)[0].shape[0]
  pair_grad = jax.jit(
      lambda p, b: flatten_util.ravel_pytree(jax.grad(common.mlp_loss)(p, b))[0])
  cluster = jax.jit(lambda z, v: prfl.threshold_clustering(
      z, v[None], radius=radius, num_iters=num_iters)[0])
  models = [jax.tree.map(lambda a, i=i: a[i], params) for i in range(n)]
  clients = [jax.tree.map(lambda a, j=j: a[j], batch) for j in range(n)]

  def round_():
    centers = []
    for i in range(n):
      z = jnp.stack([pair_grad(models[i], clients[j]) for j in range(n)])
      centers.append(cluster(z, z[i]))
    return jax.block_until_ready(jnp.stack(centers))

  res, out = common.time_round(round_, repeats, budget_s)  # Warm-up compiles.
  return res, np.asarray(out)


def bench_n(n, args, plans):
  """All configurations at N clients; returns result rows."""
  params, batch = common.mnist_like_federation(n, args.batch_size, args.seed)
  radius = common.parse_radius(args.radius)
  flops = 6.0 * common.NUM_PARAMS * args.batch_size * n * n
  rows, outs = [], {}

  def add(name, kind, res, out, extra=None):
    if res is None:
      return
    if args.stat == "min":
      res = dict(res, time_s=min(res["times"]))
    row = dict(n=n, config=name, kind=kind, **res, **(extra or {}))
    row["gflops"] = flops / res["time_s"] / 1e9
    row["gflops_cpu"] = flops * NUM_CPUS / res["cpu_s"] / 1e9
    rows.append(row)
    outs[name] = out
    print(f"  N={n:3d} {name:12s} {res['time_s']:8.3f} s", flush=True)

  if not args.no_loops:
    for threads in [int(t) for t in args.torch_threads.split(",")]:
      res, out = torch_loop.run_mlp_loop(
          params, batch, radius, args.num_iters, args.loop_repeats,
          args.budget_s, threads, args.torch_device)
      if res is None:
        print("  torch is not importable: skipping the PyTorch loop "
              "(pip install torch==2.13.0, the `bench` extra).", flush=True)
        break
      name = (f"torch-loop/{res['torch_threads']}t"
              if args.torch_device == "cpu" else
              f"torch-loop/{args.torch_device}")
      add(name, "torch", res, out)
    res, out = run_jax_loop(params, batch, radius, args.num_iters,
                            args.loop_repeats, args.budget_s)
    add("jax-loop", "jax", res, out)
  for loss in args.losses.split(","):
    for s in plans:
      name = common.plan_name(s)
      if loss != "library":
        name = f"{loss}:{name}"
      if s.chunk_size is None and s.kernel not in ("ghost", "auto") and (
          n > args.max_full_n):
        print(f"  N={n:3d} {name:12s} skipped (N > --max-full-n, [N, N, P] "
              f"would take {n * n * common.NUM_PARAMS * 4 / 2**30:.1f} GiB)")
        continue
      if s.chunk_size not in (None, "auto") and s.chunk_size >= n:
        print(f"  N={n:3d} {name:12s} skipped (chunk >= N is the full vmap)")
        continue
      res, out = run_plan(s, params, batch, radius, args.num_iters,
                          args.repeats, args.budget_s, loss)
      add(name, "jax", res, out, dict(loss=loss, plan=common.plan_name(
          kernels.resolve_plan(s, zoo.LOSSES[loss][0], zoo.LOSSES[loss][1](params),
                               batch))))
      gc.collect()

  ref_name = "jax-loop" if "jax-loop" in outs else rows[0]["config"]
  ref = outs[ref_name]
  scale = float(np.max(np.abs(ref)))
  times = {r["config"]: r["time_s"] for r in rows}
  torch_times = [t for c, t in times.items() if c.startswith("torch-loop")]
  for r in rows:
    diff = float(np.max(np.abs(outs[r["config"]] - ref)))
    r["max_abs_diff"] = diff
    r["rel_diff"] = diff / scale
    r["diff_ref"] = ref_name
    # Against the faster of the PyTorch thread settings.
    r["vs_torch"] = min(torch_times) / r["time_s"] if torch_times else None
    r["vs_jax_loop"] = times["jax-loop"] / r["time_s"] if (
        "jax-loop" in times) else None
    r["speedup_over"] = {c: t / r["time_s"] for c, t in times.items()}
  return rows


COLUMNS = [
    ("n", "N", "{}"), ("config", "config", "{}"), ("plan", "resolved", "{}"),
    ("time_s", "s/round", "{:.3f}"),
    ("gflops", "GFLOP/s", "{:.1f}"), ("pct_gemm", "%GEMM", "{:.0f}"),
    ("cpu_s", "CPU s", "{:.3f}"), ("pct_gemm_cpu", "%GEMM cpu", "{:.0f}"),
    ("xla_mb", "XLA MiB", "{:.0f}"), ("rss_mb", "RSS+ MiB", "{:.0f}"),
    ("vs_torch", "x torch", "{:.2f}"), ("vs_jax_loop", "x jaxloop", "{:.2f}"),
    ("max_abs_diff", "maxdiff", "{:.1e}"), ("rel_diff", "reldiff", "{:.1e}"),
]


@common.float32_matmuls
def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--clients", default="8,16,32,64",
                 help="comma-separated numbers of clients N")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--losses", default="library",
                 help="comma-separated ways of writing the MLP's loss: "
                 "library, user (plain dict params, optax), flax (linen)")
  p.add_argument("--plans", default=DEFAULT_PLANS,
                 help="comma-separated CHUNK:KERNEL, CHUNK an int or 'full'")
  p.add_argument("--radius", default="quantile:0.2",
                 help="a float, or quantile:Q for prfl.quantile_radius(Q)")
  p.add_argument("--num-iters", type=int, default=10)
  p.add_argument("--repeats", type=int, default=5,
                 help="timed calls per plan (see --stat)")
  p.add_argument("--stat", choices=("median", "min"), default="median",
                 help="a row's time: the median or the least wall time of "
                 "its timed calls (min: the call least slowed by other "
                 "processes, on a shared machine)")
  p.add_argument("--loop-repeats", type=int, default=3,
                 help="timed calls of the per-pair loops")
  p.add_argument("--budget-s", type=float, default=20.0,
                 help="fewer repeats when one call takes longer than "
                 "budget/repeats")
  p.add_argument("--max-full-n", type=int, default=32,
                 help="largest N for the full nested vmap of the gram and "
                 "direct kernels (the ghost kernel builds no [N, N, P] array)")
  p.add_argument("--torch-threads", default="0,1",
                 help="torch.set_num_threads for the PyTorch loop, one run "
                 "each (0: torch's default); 'x torch' uses the fastest")
  p.add_argument("--torch-device", default="cpu",
                 help="device of the PyTorch loop, e.g. cuda on a GPU machine")
  p.add_argument("--gemm-size", type=int, default=2048,
                 help="side of the square fp32 GEMM that sets 100%% (use 8192 "
                 "on a GPU)")
  p.add_argument("--no-loops", action="store_true",
                 help="skip the per-pair JAX and PyTorch loops")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="round_cpu.json")
  args = p.parse_args(argv)
  plans = [common.parse_plan(s) for s in args.plans.split(",")]
  bad = [l for l in args.losses.split(",") if l not in zoo.LOSSES]
  if bad:
    p.error(f"--losses: unknown {bad}; choose from {sorted(zoo.LOSSES)}")

  info = common.machine_info()
  gemm = gemm_rate.machine_gemm_gflops(args.gemm_size, args.torch_device)
  print(f"load average {info['loadavg']}, {info['cpu_count']} CPUs, "
        f"jax {info['jax']}, torch {info['torch']}")
  print(f"fp32 GEMM {args.gemm_size}^3 before the rows (best of 10): jnp "
        f"{gemm['jax']:.1f} GFLOP/s ({gemm['jax_cpu']:.1f} per CPU time), "
        "torch " + (f"{gemm['torch']:.1f} ({gemm['torch_cpu']:.1f})"
                    if gemm["torch"] else "n/a"), flush=True)
  rows = []
  for n in [int(c) for c in args.clients.split(",")]:
    rows.extend(bench_n(n, args, plans))
  info["loadavg_end"] = os.getloadavg()
  gemm_end = gemm_rate.machine_gemm_gflops(args.gemm_size, args.torch_device)
  print(f"fp32 GEMM after the rows: jnp {gemm_end['jax']:.1f} "
        f"({gemm_end['jax_cpu']:.1f}), torch "
        f"{gemm_end['torch'] or float('nan'):.1f} "
        f"({gemm_end['torch_cpu'] or float('nan'):.1f}) GFLOP/s")
  gemm["machine_end"] = gemm_end["machine"]
  gemm["machine_cpu_end"] = gemm_end["machine_cpu"]
  # 100%: the higher of the two readings (other processes only lower one).
  gemm["reference"] = max(gemm["machine"], gemm_end["machine"])
  gemm["reference_cpu"] = max(gemm["machine_cpu"], gemm_end["machine_cpu"])
  for r in rows:
    r["pct_gemm"] = 100 * r["gflops"] / gemm["reference"]
    r["pct_gemm_cpu"] = 100 * r["gflops_cpu"] / gemm["reference_cpu"]
  print()
  print(f"MLP 784-200-10 ({common.NUM_PARAMS} params), batch "
        f"{args.batch_size}, radius {args.radius}, {args.num_iters} "
        f"clustering steps; FLOPs = 6*P*B*N^2; %GEMM: of the machine's "
        f"(faster library's) {args.gemm_size}^3 GEMM, the higher of its "
        f"readings before and after the rows (benchmarks/gemm_rate.py); "
        f"%GEMM cpu: the same in FLOPs per CPU-second; x torch / x jaxloop = speed-up over the loop (x torch: over "
        f"the faster torch thread setting); maxdiff = "
        f"max |centre - {rows[0].get('diff_ref', '?')} centre|.")
  print(common.format_table(rows, COLUMNS))
  for n in sorted({r["n"] for r in rows}):
    sub = [r for r in rows if r["n"] == n]
    names = [r["config"] for r in sub]
    print(f"\nN={n}: speed-up of row over column")
    print(common.format_table(
        [dict(config=r["config"], **r["speedup_over"]) for r in sub],
        [("config", "", "{}")] + [(c, c, "{:.2f}") for c in names]))
  print(f"\nload average start {info['loadavg']} end {info['loadavg_end']}")
  path = common.save_json(args.out, dict(
      args=vars(args), machine=info, gemm_gflops=gemm, rows=rows))
  print(f"saved {path}")
  bad = [r for r in rows if not r["rel_diff"] < 1e-3]
  if bad:
    print("WARNING: configurations disagree: "
          + ", ".join(f"{r['n']}/{r['config']}" for r in bad))
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
