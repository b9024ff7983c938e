"""The quantile radius by rank counting vs by sorting, under vmap.

`clustering.masked_quantile` finds the k-th smallest distance by counting
ranks (`O(N^2)` comparisons) for N <= `RANK_QUANTILE_MAX_N` and by
`jnp.sort` above. This benchmark times both paths (forced by its `method`
argument, in a radius rule of its own) on the same inputs, and checks that
they give the same numbers:

  * kernel: Threshold-Clustering on centred Gram matrices with
    `quantile_radius(q)` (10 steps, the radius recomputed at every step), for
    K models of N clients, vmapped over G configurations (traced q);
  * sweep: the vmapped sweep of `benchmarks/bench_sweep.py` (the synthetic
    K = 4 x 4 federation, Federated-Clustering, G = 24 configurations), whose
    hot spot the quantile was.

  python -m benchmarks.bench_quantile                  # ~1 minute on 2 cores
  python -m benchmarks.bench_quantile --clients 16,64 --repeats 5
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from prfl_jax import clustering
from prfl_jax import sweep as sweep_lib
from benchmarks import common


def quantile_rule(q, method: str):
  """`quantile_radius(q)` with `masked_quantile`'s `method` forced."""
  return lambda d, present: clustering.masked_quantile(d, present, q,
                                                       method=method)


def _timed(compiled, args, repeats):
  run = lambda: jax.block_until_ready(compiled(*args))
  median, times = common.median_time(run, repeats, warmup=1)
  return median, min(times), run()


def kernel_rows(n, configs, models, repeats, seed):
  """Both paths on `[G, K, N, N]` centred Gram matrices."""
  rng = np.random.default_rng(seed)
  y = rng.normal(size=(configs, models, n, 8)).astype(np.float32)
  y[..., : n // 2, :] += 3.0  # Two groups, so the balls decide something.
  grams = jnp.asarray(np.einsum("gkip,gkjp->gkij", y, y))
  qs = jnp.linspace(0.1, 0.6, configs)
  weights = jnp.ones((n,), jnp.float32)
  out = {}
  for path in ("rank", "sort"):
    fn = lambda g, q, path=path: clustering.gram_clustering_coefs(
        g, quantile_rule(q, path), 10, weights)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(fn)).lower(grams, qs).compile()
    compile_s = time.perf_counter() - t0
    median, best, (coefs, info) = _timed(compiled, (grams, qs), repeats)
    out[path] = dict(time_s=median, best_s=best, compile_s=compile_s,
                     coefs=np.asarray(coefs), inside=np.asarray(info.inside))
  diff = float(np.max(np.abs(out["rank"]["coefs"] - out["sort"]["coefs"])))
  same_ball = bool(np.array_equal(out["rank"]["inside"],
                                  out["sort"]["inside"]))
  return dict(case="kernel", n=n, configs=configs, models=models,
              rank_s=out["rank"]["time_s"], sort_s=out["sort"]["time_s"],
              rank_best_s=out["rank"]["best_s"],
              sort_best_s=out["sort"]["best_s"],
              rank_compile_s=out["rank"]["compile_s"],
              sort_compile_s=out["sort"]["compile_s"],
              speedup=out["sort"]["time_s"] / out["rank"]["time_s"],
              max_abs_diff=diff, same_ball=same_ball)


def sweep_row(rounds, repeats):
  """Both paths on bench_sweep's vmapped sweep (K = 4 x 4, G = 24)."""
  data, _ = prfl.data.synthetic_regression(
      jax.random.PRNGKey(0), num_clusters=4, clients_per_cluster=4, dim=10,
      num_samples=9)
  n = data.train["a"].shape[0]
  params = jnp.zeros((n, 10))
  make = lambda hp, path: common.algorithm(
      "fc", prfl.data.regression_loss, lr=hp["lr"], momentum=0.0,
      radius=quantile_rule(hp["q"], path), num_iters=10, chunk_size="all",
      kernel="gram")
  hp, keys = sweep_lib.grid(jnp.arange(3),
                            lr=jnp.array([3e-4, 1e-3, 3e-3, 1e-2]),
                            q=jnp.array([0.2, 0.5]))
  out = {}
  for path in ("rank", "sort"):
    fn = lambda h, k, path=path: sweep_lib.sweep(
        lambda hp: make(hp, path), h, params, data.train, rounds,
        keys=k).state.params
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(hp, keys).compile()
    compile_s = time.perf_counter() - t0
    median, best, params_out = _timed(compiled, (hp, keys), repeats)
    out[path] = dict(time_s=median, best_s=best, compile_s=compile_s,
                     params=np.asarray(params_out))
  diff = float(np.nanmax(np.abs(out["rank"]["params"] -
                                out["sort"]["params"])))
  return dict(case="sweep", n=n, configs=int(keys.shape[0]), models=n,
              rounds=rounds, rank_s=out["rank"]["time_s"],
              sort_s=out["sort"]["time_s"], rank_best_s=out["rank"]["best_s"],
              sort_best_s=out["sort"]["best_s"],
              rank_compile_s=out["rank"]["compile_s"],
              sort_compile_s=out["sort"]["compile_s"],
              speedup=out["sort"]["time_s"] / out["rank"]["time_s"],
              max_abs_diff=diff, same_ball=None)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--clients", default="16,64,256",
                 help="comma-separated N for the kernel rows (<= 512, where "
                 "prfl counts ranks)")
  p.add_argument("--configs", type=int, default=24)
  p.add_argument("--models", type=int, default=16,
                 help="models (centres) per configuration in the kernel rows")
  p.add_argument("--sweep-rounds", type=int, default=50,
                 help="rounds of the vmapped sweep row (0: skip it)")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="quantile_cpu.json")
  args = p.parse_args(argv)
  try:
    clients = [int(c) for c in args.clients.split(",")]
  except ValueError:
    p.error(f"--clients must be comma-separated integers, got "
            f"{args.clients!r}")
  if any(not 2 <= c <= clustering.RANK_QUANTILE_MAX_N for c in clients):
    p.error(f"--clients must lie in [2, {clustering.RANK_QUANTILE_MAX_N}]")
  for name in ("configs", "models", "repeats"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be >= 1")
  if args.sweep_rounds < 0:
    p.error("--sweep-rounds must be >= 0")

  info = common.machine_info()
  print(f"load average {info['loadavg']}, {info['cpu_count']} CPUs, "
        f"jax {info['jax']}", flush=True)
  rows = []
  for n in clients:
    rows.append(kernel_rows(n, args.configs, args.models, args.repeats,
                            args.seed))
    print(f"  kernel N={n}: rank {rows[-1]['rank_s'] * 1e3:.2f} ms, sort "
          f"{rows[-1]['sort_s'] * 1e3:.2f} ms", flush=True)
  if args.sweep_rounds:
    rows.append(sweep_row(args.sweep_rounds, max(3, args.repeats // 3)))
    print(f"  sweep: rank {rows[-1]['rank_s']:.3f} s, sort "
          f"{rows[-1]['sort_s']:.3f} s", flush=True)
  info["loadavg_end"] = os.getloadavg()
  print()
  print(f"Median of {args.repeats} calls after a warm-up (best in brackets); "
        f"kernel: Threshold-Clustering, 10 steps, quantile radius, "
        f"{args.models} models x N clients, vmapped over {args.configs} "
        f"configurations; sweep: bench_sweep's vmapped FC sweep, "
        f"{args.sweep_rounds} rounds.")
  print(common.format_table(
      [dict(r, rank_ms=r["rank_s"] * 1e3, sort_ms=r["sort_s"] * 1e3,
            rank_best_ms=r["rank_best_s"] * 1e3,
            sort_best_ms=r["sort_best_s"] * 1e3) for r in rows],
      [("case", "case", "{}"), ("n", "N", "{}"),
       ("rank_ms", "rank ms", "{:.2f}"), ("sort_ms", "sort ms", "{:.2f}"),
       ("rank_best_ms", "rank best", "{:.2f}"),
       ("sort_best_ms", "sort best", "{:.2f}"),
       ("speedup", "sort / rank", "{:.2f}"),
       ("max_abs_diff", "maxdiff", "{:.1e}"),
       ("same_ball", "same balls", "{}")]))
  print(f"load average start {info['loadavg']} end {info['loadavg_end']}")
  print("saved", common.save_json(args.out, dict(args=vars(args),
                                                 machine=info, rows=rows)))
  bad = [r for r in rows if not r["max_abs_diff"] <= 1e-5 or
         r["same_ball"] is False]
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
