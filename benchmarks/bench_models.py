"""One Federated-Clustering round on user-written CNNs: PyTorch loop vs prfl.

A round (Werner et al., 2023, Algorithm 1, lines 4-7) computes every client's
gradient at every client's model (N^2 gradients) and, for every model, runs
Threshold-Clustering (Algorithm 2, 10 steps, quantile radius) with one centre
started at the owner's gradient. The models are Flax linen modules written as
a user would write them (`nn.Conv`, `nn.Dense`, `nn.max_pool`, ReLU; the loss
is `optax.softmax_cross_entropy_with_integer_labels` of `model.apply`):

  cnn   28x28x1, Conv 32 - pool - Conv 64 - pool - Dense 256 - Dense 10
  vgg8  32x32x3, Conv 64/128/256/512/512 (each followed by a 2x2 max-pool) -
        Dense 512 - Dense 512 - Dense 100 (CIFAR-100's VGG-8)

(3x3 convolutions with SAME padding, 2x2 max-pools of stride 2.) Compared in
one run, on the same parameters and random data:
  * `torch-loop`: the same network in PyTorch, written like the paper's code
    (for each model, for each client: forward, backward, flatten the
    gradients; Threshold-Clustering in torch), one run per thread setting;
  * `prfl gram`: `cluster_at_models` with `ExecutionPlan(1, "gram")`, which
    materialises each model's `[N, P]` client gradients;
  * `prfl auto`: the default `ExecutionPlan()`, i.e. the automatic ghost
    kernel (the layers found in the loss's jaxpr, conv rule
    `prfl_jax.kernels.conv`).
`maxdiff` is the largest |centre - centre of prfl gram| over all models and
parameters. Times are medians of the timed calls after one untimed call of
the AOT-compiled round (a single timed call when one takes longer than the
budget); `compile_s` is the XLA compile time.

  python -m benchmarks.bench_models                     # cnn and vgg8, N = 8, 16
  python -m benchmarks.bench_models --models cnn --clients 8 --repeats 5
  python -m benchmarks.bench_models --smoke             # tiny, for the tests
"""

import argparse
import dataclasses
import os
import sys

import jax
import numpy as np

import prfl_jax as prfl
from prfl_jax import kernels
from benchmarks import common
from benchmarks import torch_loop
from benchmarks import zoo
from experiments import files as experiments_files


def run_prfl(loss_fn, params, batch, plan, radius, num_iters, repeats,
             budget_s) -> dict:
  """Compiles and times one jitted round of `cluster_at_models` with `plan`."""
  compiled, compile_s = common.compile_round(loss_fn, params, batch, plan,
                                             radius, num_iters)
  mem = compiled.memory_analysis()
  res, out = common.time_round(
      lambda: jax.block_until_ready(compiled(params, batch)), repeats,
      budget_s)
  res["out"] = zoo.flat_centers(out)
  res["compile_s"] = compile_s
  res["xla_temp_mb"] = (None if mem is None else
                        mem.temp_size_in_bytes / 2**20)
  return res


def bench(spec: zoo.Spec, n: int, args, radius) -> list:
  """All configurations for one model and N; rows of the result table."""
  params, batch = zoo.federation(spec, n, args.batch_size, args.seed)
  _, loss_fn = zoo.make_loss(spec)
  rows, outs = [], {}

  def add(config, res):
    out = res.pop("out")
    outs[config] = out
    row = dict(model=spec.name, n=n, config=config, **res)
    rows.append(row)
    print(f"  {spec.name:5s} N={n:3d} {config:16s} {res['time_s']:9.3f} s",
          flush=True)

  plans = {"prfl gram": prfl.ExecutionPlan(1, "gram"),
           "prfl auto": prfl.ExecutionPlan()}
  for name in args.configs:
    if f"{spec.name}:{n}:{name}" in args.skip:
      print(f"  {spec.name:5s} N={n:3d} {name:16s} skipped (--skip)",
            flush=True)
      continue
    if name == "torch-loop":
      for threads in args.torch_threads:
        res, out = torch_loop.run_cnn_loop(
            spec, params, batch, radius, args.num_iters, threads,
            args.loop_repeats, args.budget_s, device=args.torch_device)
        if res is None:
          print("  torch is not importable: no PyTorch loop.", flush=True)
          break
        add(f"torch-loop/{res['torch_threads']}t", dict(res, out=out))
    else:
      plan = plans[name]
      resolved = kernels.resolve_plan(plan, loss_fn, params, batch)
      res = run_prfl(loss_fn, params, batch, plan, radius, args.num_iters,
                     args.repeats, args.budget_s)
      res["plan"] = common.plan_name(resolved)
      add(name, res)
  ref = "prfl gram" if "prfl gram" in outs else rows[0]["config"]
  scale = float(np.max(np.abs(outs[ref])))
  torch_times = [r["time_s"] for r in rows
                 if r["config"].startswith("torch-loop")]
  for r in rows:
    r["max_abs_diff"] = float(np.max(np.abs(outs[r["config"]] - outs[ref])))
    r["rel_diff"] = r["max_abs_diff"] / scale
    r["diff_ref"] = ref
    r["vs_torch"] = (min(torch_times) / r["time_s"]) if torch_times else None
  return rows


COLUMNS = [
    ("model", "model", "{}"), ("n", "N", "{}"), ("config", "config", "{}"),
    ("plan", "plan", "{}"), ("time_s", "s/round", "{:.3f}"),
    ("vs_torch", "x torch", "{:.2f}"), ("compile_s", "compile s", "{:.1f}"),
    ("xla_temp_mb", "XLA temp MiB", "{:.0f}"),
    ("max_abs_diff", "maxdiff", "{:.1e}"), ("rel_diff", "reldiff", "{:.1e}"),
]
CONFIGS = ("torch-loop", "prfl gram", "prfl auto")


def _radius(text):
  try:
    return text, common.parse_radius(text)
  except (ValueError, IndexError) as e:
    raise argparse.ArgumentTypeError(
        f"must be a float or quantile:Q, got {text!r} ({e})") from None


SMOKE = dict(clients=(2,), batch_size=2, width_divisor=16, repeats=1,
             loop_repeats=1, budget_s=1.0, torch_threads=(1,))


@common.float32_matmuls
def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  common.add_model_args(
      p, models=zoo.SPECS, default_models=("cnn", "vgg8"), clients=(8, 16),
      batch_size=16, repeats=3, out="models_cpu.json",
      smoke="tiny sizes (N = 2, batch 2, widths / 16) in seconds")
  p.add_argument("--configs", type=common.name_list(CONFIGS), default=CONFIGS)
  p.add_argument("--radius", type=_radius, default="quantile:0.2",
                 help="a float, or quantile:Q for prfl.quantile_radius(Q)")
  p.add_argument("--loop-repeats", type=common.positive_int, default=1,
                 help="timed calls of the PyTorch loop")
  p.add_argument("--budget-s", type=float, default=30.0,
                 help="fewer timed calls when they would take longer")
  p.add_argument("--torch-threads", type=common.int_list(0),
                 default=(0, 1),
                 help="torch.set_num_threads per run of the loop (0: torch's "
                 "default); 'x torch' is against the fastest")
  p.add_argument("--skip", type=lambda t: tuple(
      s.strip() for s in t.split(",") if s.strip()),
                 default=("vgg8:16:prfl gram",),
                 help="MODEL:N:CONFIG entries not to run (default: the "
                 "Gram kernel on VGG-8 at N = 16, ~30 min per call on 2 "
                 "cores); the centres are then compared with the first "
                 "configuration run")
  p.add_argument("--torch-device", default="cpu",
                 help="device of the PyTorch loop (cpu, cuda)")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  if args.smoke:
    explicit = {a.split("=")[0].lstrip("-").replace("-", "_")
                for a in (argv if argv is not None else sys.argv[1:])
                if a.startswith("--")}
    for k, v in SMOKE.items():
      if k not in explicit:
        setattr(args, k, v)
  radius_text, radius = args.radius
  args.radius = radius_text

  info = common.machine_info()
  print(f"load average {info['loadavg']}, {info['cpu_count']} CPUs, jax "
        f"{info['jax']}, torch {info['torch']}", flush=True)
  rows = []

  def save(complete):
    experiments_files.write_json(args.out, dict(
        args=vars(args), machine=info, complete=complete,
        specs={m: dataclasses.asdict(zoo.SPECS[m].scaled(args.width_divisor))
               for m in args.models}, rows=rows))

  for name in args.models:
    spec = zoo.SPECS[name].scaled(args.width_divisor)
    for n in args.clients:
      rows.extend(bench(spec, n, args, radius))
      info["loadavg_end"] = os.getloadavg()
      save(complete=False)  # A long run keeps what it has measured.
  print()
  print(f"batch {args.batch_size}, radius {radius_text}, {args.num_iters} "
        f"clustering steps, widths / {args.width_divisor}; x torch = "
        "speed-up over the fastest torch thread setting; maxdiff = "
        "max |centre - prfl gram centre|.")
  print(common.format_table(rows, COLUMNS))
  print(f"load average start {info['loadavg']} end {info['loadavg_end']}")
  save(complete=True)
  print(f"saved {args.out}")
  return common.agreement_status(rows)


if __name__ == "__main__":
  sys.exit(main())
