"""Default execution plan vs the fastest plan, per model as users write it.

For every model of `benchmarks.zoo` and every N, the default
`ExecutionPlan()` and a set of candidate plans (chunk sizes x kernels) are
compiled, then timed in turns (one call of each per turn, `--repeats`
turns, after one warm-up call each), in one process, on the same params
and data: one FC round's inner loop (`kernels.cluster_at_models`, 10
Threshold-Clustering steps, quantile radius 0.2, batch `--batch-size`).

Per plan the table gives the median wall time, the least CPU time of the
process (all threads) and the plan `"auto"` resolved to. The fastest plan
is ranked by CPU time on a CPU (the steadier measure when other processes
share the cores: the wall time of a call there depends on who else runs)
and by the least wall time on an accelerator (the host's CPU time means
nothing there). `default/best` is the default's time over the fastest
candidate's; `maxdiff` the largest centre difference of any plan from the
first candidate, relative to the centres' largest magnitude (the run fails
above 1e-3). A candidate that fails to compile or run (out of device
memory, say) is left out with a line that says so.

  python -m benchmarks.bench_plans                  # every model, ~1 h on 2 loaded cores
  python -m benchmarks.bench_plans --models user_mlp --clients 32
  python -m benchmarks.bench_plans --smoke          # tiny, for the tests
"""

import argparse
import dataclasses
import os
import sys
import time
from typing import Callable, Tuple

import jax
import numpy as np

import prfl_jax as prfl
from prfl_jax import kernels
from benchmarks import common
from benchmarks import zoo
from experiments import files as experiments_files

MLP_PLANS = ("1:ghost", "2:ghost", "4:ghost", "8:ghost", "full:ghost",
             "1:gram", "4:gram")
CNN_PLANS = ("1:ghost", "2:ghost", "4:ghost", "1:gram")


@dataclasses.dataclass(frozen=True)
class Model:
  """A benchmark model: how to build it, its candidate plans, default N."""
  build: Callable  # (num_clients, batch_size, width_divisor) -> (loss, p, b)
  plans: Tuple[str, ...]
  clients: Tuple[int, ...]


def _mlp(name: str):
  def build(n, batch_size, divisor):
    del divisor
    loss_fn, convert, _ = zoo.LOSSES[name]
    params, batch = common.mnist_like_federation(n, batch_size)
    return loss_fn, convert(params), batch
  return build


def _eqx(n, batch_size, divisor):
  del divisor
  return zoo.eqx_federation(n, batch_size)


def _cnn(name: str):
  def build(n, batch_size, divisor):
    spec = zoo.SPECS[name].scaled(divisor)
    params, batch = zoo.federation(spec, n, batch_size, 0)
    return zoo.make_loss(spec)[1], params, batch
  return build


MODELS = {
    "user_mlp": Model(_mlp("user"), MLP_PLANS, (32,)),
    "flax_mlp": Model(_mlp("flax"), MLP_PLANS, (32,)),
    "library_mlp": Model(_mlp("library"), MLP_PLANS, (32,)),
    "eqx_mlp": Model(_eqx, MLP_PLANS, (32,)),
    "cnn_small": Model(_cnn("cnn_small"), CNN_PLANS, (8, 16)),
    "cnn": Model(_cnn("cnn"), CNN_PLANS, (8, 16)),
    "vgg8": Model(_cnn("vgg8"), ("1:ghost", "2:ghost"), (8,)),
}


def bench(name: str, n: int, batch_size: int, args) -> list:
  """Every plan of one model at N clients, timed in turns; result rows."""
  model = MODELS[name]
  loss_fn, params, batch = model.build(n, batch_size, args.width_divisor)
  radius = prfl.quantile_radius(0.2)
  plans = {"default": prfl.ExecutionPlan()}
  plans.update({s: common.parse_plan(s) for s in args.plans or model.plans
                if not (s.split(":")[0].isdigit() and int(s.split(":")[0])
                        >= n)})
  runs = {}
  for label, plan in plans.items():
    try:
      compiled, compile_s = common.compile_round(loss_fn, params, batch, plan, radius,
                                     args.num_iters)
      call = lambda c=compiled: jax.block_until_ready(c(params, batch))
      out = zoo.flat_centers(call())  # Warm-up.
    except jax.errors.JaxRuntimeError as e:  # E.g. out of device memory.
      if label == "default":
        raise
      print(f"  {name:11s} N={n:3d} {label:10s} failed, left out: "
            f"{str(e).splitlines()[0][:120]}", flush=True)
      continue
    resolved = kernels.resolve_plan(plan, loss_fn, params, batch)
    runs[label] = dict(call=call, out=out, compile_s=compile_s, wall=[],
                       cpu=[], plan=common.plan_name(resolved.plan))
    print(f"  {name:11s} N={n:3d} {label:10s} -> {runs[label]['plan']:10s} "
          f"compiled in {compile_s:.1f} s", flush=True)
  for _ in range(args.repeats):
    for run in runs.values():
      t0, c0 = time.perf_counter(), time.process_time()
      run["call"]()
      run["wall"].append(time.perf_counter() - t0)
      run["cpu"].append(time.process_time() - c0)
  ref = runs[next(l for l in runs if l != "default")]["out"]
  scale = float(np.max(np.abs(ref)))
  on_cpu = jax.default_backend() == "cpu"
  key = lambda r: min(r["cpu"]) if on_cpu else min(r["wall"])
  best = min((l for l in runs if l != "default"), key=lambda l: key(runs[l]))
  rows = []
  for label, run in runs.items():
    rows.append(dict(
        model=name, n=n, config=label, plan=run["plan"],
        wall_s=float(np.median(run["wall"])), wall_min_s=min(run["wall"]),
        cpu_s=min(run["cpu"]), compile_s=run["compile_s"],
        vs_best=key(run) / key(runs[best]), best=runs[best]["plan"],
        rel_diff=float(np.max(np.abs(run["out"] - ref))) / scale))
  return rows


COLUMNS = [
    ("model", "model", "{}"), ("n", "N", "{}"), ("config", "config", "{}"),
    ("plan", "plan", "{}"), ("wall_s", "wall s (median)", "{:.3f}"),
    ("cpu_s", "CPU s (least)", "{:.3f}"), ("vs_best", "/ best", "{:.2f}"),
    ("compile_s", "compile s", "{:.0f}"), ("rel_diff", "maxdiff", "{:.1e}"),
]


def _plans(text):
  values = tuple(v.strip() for v in text.split(",") if v.strip())
  try:
    for v in values:
      kernels.check_plan(common.parse_plan(v))
  except (ValueError, IndexError, TypeError) as e:
    raise argparse.ArgumentTypeError(
        f"must be plans CHUNK:KERNEL, got {text!r} ({e})") from None
  if not values:
    raise argparse.ArgumentTypeError("needs at least one plan")
  return values


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  common.add_model_args(
      p, models=MODELS, default_models=tuple(MODELS), clients=None,
      batch_size=None, repeats=5, out="plans_cpu.json",
      smoke="tiny: N = 4, batch 4, widths / 16, 1 turn")
  p.add_argument("--plans", type=_plans, default=None,
                 help="comma-separated candidate plans CHUNK:KERNEL for "
                 "every model (default: each model's own)")
  args = p.parse_args(argv)
  if args.smoke:
    args.clients, args.batch_size = args.clients or (4,), args.batch_size or 4
    args.width_divisor, args.repeats = 16, 1
  info = common.machine_info()
  print(f"load average {info['loadavg']}, {info['cpu_count']} CPUs, "
        f"devices {info['devices']}", flush=True)
  rows = []
  with jax.default_matmul_precision("highest"):
    for name in args.models:
      batch_size = args.batch_size or (32 if name.endswith("mlp") else 16)
      for n in args.clients or MODELS[name].clients:
        rows.extend(bench(name, n, batch_size, args))
        info["loadavg_end"] = os.getloadavg()
        experiments_files.write_json(args.out, dict(
            args=vars(args), machine=info, rows=rows))
  print()
  print(common.format_table(rows, COLUMNS))
  print(f"load average start {info['loadavg']} end {info['loadavg_end']}")
  print(f"saved {args.out}")
  return common.agreement_status(rows)


if __name__ == "__main__":
  sys.exit(main())
