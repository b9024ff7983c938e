"""XLA:CPU's convolution vs `conv_cpu.conv_by_patches`, per layer shape.

For each convolution shape (3x3 SAME, 16 images per client), both
implementations run in a `lax.map` over the models' stacked kernels, as the
engine runs a round with chunk 1: the forward pass alone (a first layer,
whose input is data) and the forward pass with the input gradient (a later
layer). Compiled first, then timed in turns; the least CPU time of the
process over `--repeats` turns. `conv_cpu.thin_input` is chosen from these.

  python -m benchmarks.bench_conv_cpu --clients 8
"""

import argparse
import os
import sys
import time

import jax
from jax import lax

from prfl_jax.kernels import conv
from prfl_jax.kernels import conv_cpu
from benchmarks import common

# name: (input [H, W, C], kernel [3, 3, C, O])
SHAPES = {
    "1->16 28x28": ((28, 28, 1), (3, 3, 1, 16)),
    "3->64 32x32": ((32, 32, 3), (3, 3, 3, 64)),
    "4->16 28x28": ((28, 28, 4), (3, 3, 4, 16)),
    "8->16 28x28": ((28, 28, 8), (3, 3, 8, 16)),
    "16->32 14x14": ((14, 14, 16), (3, 3, 16, 32)),
}
IMPLS = {"xla": conv_cpu.conv_with_fast_grads,
         "patches": conv_cpu.conv_by_patches}


COLUMNS = [
    ("shape", "conv", "{}"), ("input_grad", "input grad", "{}"),
    ("xla_ms", "XLA CPU ms", "{:.1f}"),
    ("patches_ms", "patches CPU ms", "{:.1f}"),
    ("xla_over_patches", "XLA / patches", "{:.2f}")]


def compiled(impl, x, kernels, params, input_grad: bool):
  def per_model(w):
    if not input_grad:
      return impl(x, w, params).sum()
    y, vjp = jax.vjp(lambda x: impl(x, w, params), x)
    return y.sum() + vjp(y)[0].sum()
  return jax.jit(lambda k: lax.map(per_model, k)).lower(kernels).compile()


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--clients", type=common.positive_int, default=8,
                 help="N: models, and clients of 16 images")
  p.add_argument("--repeats", type=common.positive_int, default=5)
  p.add_argument("--out", default=os.path.join(common.RESULTS_DIR,
                                               "conv_cpu.json"))
  args = p.parse_args(argv)
  n = args.clients
  info = common.machine_info()
  print(f"load average {info['loadavg']}", flush=True)
  key = jax.random.PRNGKey(0)
  rows = []
  with jax.default_matmul_precision("highest"):
    for name, (x_shape, w_shape) in SHAPES.items():
      x = jax.random.normal(key, (16 * n,) + x_shape)
      kernels = jax.random.normal(key, (n,) + w_shape)
      params = conv.conv_params(4, window_strides=(1, 1), padding="SAME",
                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
      for input_grad in (False, True):
        runs = {k: compiled(f, x, kernels, params, input_grad)
                for k, f in IMPLS.items()}
        cpu = {k: [] for k in runs}
        for _ in range(args.repeats):
          for k, fn in runs.items():
            c0 = time.process_time()
            jax.block_until_ready(fn(kernels))
            cpu[k].append(time.process_time() - c0)
        row = dict(shape=name, input_grad=input_grad,
                   xla_ms=1e3 * min(cpu["xla"]),
                   patches_ms=1e3 * min(cpu["patches"]))
        row["xla_over_patches"] = row["xla_ms"] / row["patches_ms"]
        rows.append(row)
        print(f"  {name:13s} input grad {input_grad!s:5s} xla "
              f"{row['xla_ms']:7.1f} ms  patches {row['patches_ms']:7.1f} ms",
              flush=True)
  info["loadavg_end"] = os.getloadavg()
  print(common.format_table(rows, COLUMNS))
  path = common.save_json(args.out, dict(args=vars(args), machine=info,
                                         rows=rows))
  print(f"load average end {info['loadavg_end']}; saved {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
