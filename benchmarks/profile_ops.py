"""Which XLA ops of a default-plan round cost what, by `jax.profiler`.

`profile_cnn` cuts the round into parts compiled on their own; this traces
the round itself as it is compiled (`kernels.cluster_at_models`, default
plan) and sums the profiler's per-op events over `--repeats` traced calls.
On XLA:CPU every event is one thunk of the compiled program (a fusion, a
dot, a convolution, ...); an event's time is its wall time, so ops that run
on both cores at once and ops that wait for a core are both counted by
their span. Each op is shown with the JAX operation it came from (its
`op_name` metadata, e.g. `vmap(transpose(...))/conv_general_dilated` for an
input gradient), so a costly fusion can be traced back to the code.

  python -m benchmarks.profile_ops --model cnn_small --clients 16
  python -m benchmarks.profile_ops --model user_mlp --clients 32 \
      --batch-size 32
"""

import argparse
import collections
import os
import re
import sys
import tempfile

import jax

import prfl_jax as prfl
from prfl_jax import kernels
from benchmarks import common
from benchmarks import profile_cnn
from benchmarks import zoo

# The MNIST MLP 784-200-10 with each of `bench_round`'s losses
# (`zoo.LOSSES`), e.g. `user_mlp`: plain-JAX dict params, as users write it.
MLPS = tuple(f"{loss}_mlp" for loss in zoo.LOSSES)
# Control flow: its events span the ops inside it.
_CONTROL = ("while", "call", "conditional")


def op_sources(hlo_text: str) -> dict:
  """`{instruction name: its shape and op_name metadata}` of a compiled HLO
  module, control-flow instructions left out."""
  out = {}
  for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = ([^\n]*)", hlo_text,
                       re.M):
    name, rest = m.groups()
    if name.split(".")[0] in _CONTROL:
      continue
    meta = re.search(r"op_name=\"([^\"]*)\"", rest)
    shape = re.match(r"[\w\[\],]+", rest)
    origin = "/".join(meta.group(1).split("/")[-2:]) if meta else ""
    out[name] = f"{shape.group(0) if shape else ''} {origin}"
  return out


def op_times(compiled, args, repeats: int, ops) -> collections.Counter:
  """`{op name: seconds per call}` of the events named in `ops`, over
  `repeats` traced calls."""
  jax.block_until_ready(compiled(*args))
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      for _ in range(repeats):
        jax.block_until_ready(compiled(*args))
    files = [os.path.join(root, f) for root, _, names in os.walk(d)
             for f in names if f.endswith(".xplane.pb")]
    data = jax.profiler.ProfileData.from_file(max(files,
                                                  key=os.path.getmtime))
  total = collections.Counter()
  for plane in data.planes:
    for line in plane.lines:
      for event in line.events:
        if event.name in ops:
          total[event.name] += event.duration_ns * 1e-9 / repeats
  return total


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  profile_cnn.add_round_args(p, repeats=3,
                             models=tuple(sorted(zoo.SPECS)) + MLPS)
  p.add_argument("--top", type=common.positive_int, default=20)
  args = p.parse_args(argv)
  if args.model in MLPS:
    if args.clients < 2:
      p.error("--clients must be >= 2")
    print(f"load average {os.getloadavg()}, {args.model}, N={args.clients}, "
          f"batch {args.batch_size} (--width-divisor not used)", flush=True)
    loss_fn, layout, _ = zoo.LOSSES[args.model[:-len("_mlp")]]
    params, batch = common.mnist_like_federation(args.clients,
                                                 args.batch_size)
    params, radius = layout(params), prfl.quantile_radius(0.2)
  else:
    _, loss_fn, params, batch, radius = profile_cnn.round_problem(p, args)
  with jax.default_matmul_precision("highest"):
    compiled = jax.jit(lambda x, b: kernels.cluster_at_models(
        loss_fn, x, b, radius=radius, num_iters=args.num_iters).centers
                       ).lower(params, batch).compile()
    sources = op_sources(compiled.as_text())
    times = op_times(compiled, (params, batch), args.repeats, sources)
  whole = sum(times.values())
  rows = [dict(op=name, ms=1e3 * s, share=100 * s / whole,
               source=sources[name])
          for name, s in times.most_common(args.top)]
  print(common.format_table(rows, [
      ("op", "XLA op", "{}"), ("ms", "ms per round", "{:.1f}"),
      ("share", "% of ops", "{:.1f}"), ("source", "shape, from", "{}")]))
  print(f"all ops {1e3 * whole:.1f} ms per round (wall, summed over "
        f"threads); load average end {os.getloadavg()}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
