"""A vmapped sweep (`prfl_jax.sweep`) vs the same configurations one by one.

The paper's synthetic linear-regression federation (Section 5.1: K clusters of
n_i clients, d=10, n=9 samples), Federated-Clustering with `optax.sgd(lr)` and
`quantile_radius(q)`, full local batches, over seeds x learning rates x radius
quantiles. Three ways:
  * sweep: one jitted `sweep.sweep` (vmap over the grid of a scan over rounds);
  * sequential, one compile: one jitted `sweep.run` whose hyperparameters are
    traced arguments, called once per configuration;
  * sequential, each jitted: a fresh jit per configuration (constants baked
    in), as a script looping over configurations would do.

  python -m benchmarks.bench_sweep --rounds 200
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from prfl_jax import sweep as sweep_lib
from benchmarks import common


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--clusters", type=int, default=4)
  p.add_argument("--clients-per-cluster", type=int, default=4)
  p.add_argument("--rounds", type=int, default=200)
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--lrs", default="0.0003,0.001,0.003,0.01")
  p.add_argument("--quantiles", default="0.2,0.5")
  p.add_argument("--num-iters", type=int, default=10)
  p.add_argument("--plan", default="full:gram",
                 help="CHUNK:KERNEL of the all-pairs gradients ('full' = one "
                 "nested vmap, best for this tiny model)")
  p.add_argument("--out", default="sweep_cpu.json")
  args = p.parse_args(argv)

  data, _ = prfl.data.synthetic_regression(
      jax.random.PRNGKey(0), num_clusters=args.clusters,
      clients_per_cluster=args.clients_per_cluster, dim=10, num_samples=9)
  n = data.train["a"].shape[0]
  params = jnp.zeros((n, 10))

  plan = common.plan_settings(args.plan)

  def make_algorithm(hp):
    return common.algorithm(
        "fc", prfl.data.regression_loss, lr=hp["lr"], momentum=0.0,
        quantile=hp["q"], num_iters=args.num_iters, **plan)

  evaluate = lambda state: jax.vmap(prfl.data.regression_eval)(
      state.params, data.test)
  hp, keys = sweep_lib.grid(
      jnp.arange(args.seeds),
      lr=jnp.array([float(x) for x in args.lrs.split(",")]),
      q=jnp.array([float(x) for x in args.quantiles.split(",")]))
  g = keys.shape[0]
  info = common.machine_info()
  print(f"N={n} clients, {args.rounds} rounds, G={g} configurations", flush=True)

  # 1. The vmapped sweep.
  sweep_fn = jax.jit(lambda h, k: sweep_lib.sweep(
      make_algorithm, h, params, data.train, args.rounds, keys=k,
      evaluate=evaluate))
  t0 = time.perf_counter()
  compiled = sweep_fn.lower(hp, keys).compile()
  sweep_compile = time.perf_counter() - t0
  sweep_run, _ = common.median_time(
      lambda: jax.block_until_ready(compiled(hp, keys)), repeats=3)
  result = compiled(hp, keys)

  # 2. One compiled run, called per configuration.
  run_fn = jax.jit(lambda h, k: sweep_lib.run(
      make_algorithm, h, params, data.train, args.rounds, key=k,
      evaluate=evaluate))
  pick = lambda i: jax.tree.map(lambda x: x[i], hp)
  t0 = time.perf_counter()
  run_compiled = run_fn.lower(pick(0), keys[0]).compile()
  seq_compile = time.perf_counter() - t0

  def sequential():
    return [jax.block_until_ready(run_compiled(pick(i), keys[i]))
            for i in range(g)]

  seq_run, _ = common.median_time(sequential, repeats=3)
  singles = sequential()
  diff = max(float(np.nanmax(np.abs(np.asarray(result.state.params[i]) -
                                    np.asarray(singles[i].state.params))))
             for i in range(g))

  # 3. A fresh jit per configuration (hyperparameters as Python constants).
  t0 = time.perf_counter()
  for i in range(g):
    h = {k: float(v) for k, v in pick(i).items()}
    fn = jax.jit(lambda k, h=h: sweep_lib.run(
        make_algorithm, h, params, data.train, args.rounds, key=k,
        evaluate=evaluate))
    jax.block_until_ready(fn(keys[i]))
  each_jit_total = time.perf_counter() - t0

  rows = [
      dict(method="vmapped sweep", compile_s=sweep_compile, run_s=sweep_run,
           total_s=sweep_compile + sweep_run),
      dict(method="sequential, 1 compile", compile_s=seq_compile,
           run_s=seq_run, total_s=seq_compile + seq_run),
      dict(method="sequential, jit each", compile_s=None, run_s=None,
           total_s=each_jit_total),
  ]
  for r in rows:
    r["speedup_run"] = (seq_run / r["run_s"]) if r["run_s"] else None
    r["sweep_speedup_total"] = r["total_s"] / rows[0]["total_s"]
  info["loadavg_end"] = os.getloadavg()
  err = np.asarray(result.final["error"]).mean(axis=1)
  best = int(np.nanargmin(err))
  print(f"\nsynthetic regression K={args.clusters} x {args.clients_per_cluster}"
        f" clients, d=10, n=9, plan {args.plan}, {args.rounds} rounds, "
        f"{g} configurations "
        f"({args.seeds} seeds x lrs {args.lrs} x quantiles {args.quantiles})")
  print(common.format_table(rows, [
      ("method", "method", "{}"), ("compile_s", "compile s", "{:.2f}"),
      ("run_s", "run s (all G)", "{:.3f}"),
      ("speedup_run", "run x vs seq", "{:.1f}"),
      ("total_s", "total s", "{:.2f}"),
      ("sweep_speedup_total", "total / sweep total", "{:.1f}")]))
  print(f"max |params sweep - params one-by-one| = {diff:.2e} (NaN-free "
        f"configurations: {int(np.sum(np.isfinite(err)))} of {g})")
  print("best config: " + ", ".join(f"{k}={float(v[best]):g}"
                                     for k, v in hp.items())
        + f", mean final error {err[best]:.4f}")
  print(f"load average start {info['loadavg']} end {info['loadavg_end']}")
  print("saved", common.save_json(args.out, dict(
      args=vars(args), machine=info, rows=rows, max_abs_diff=diff,
      final_error=err)))
  return 0 if diff < 1e-3 else 1


if __name__ == "__main__":
  sys.exit(main())
