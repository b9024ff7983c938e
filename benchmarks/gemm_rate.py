"""The machine's fp32 GEMM rate: what "% of GEMM" in the benchmarks means.

100% is the faster of XLA's (`jnp.matmul`, jitted) and PyTorch's fp32 GEMM
on one square `size^3` problem (2048 on CPU), measured in the same process
as the rows it scales. Two readings of each call are kept:

* wall: FLOPs over the least wall time of the calls (the attainable rate:
  another process can only lower it);
* CPU: FLOPs over the least CPU time of this process (all its threads),
  times the number of CPUs: the rate per core-second of work, scaled to the
  whole machine. A round's CPU-time share (its FLOPs per CPU-second over the
  GEMM's) does not depend on how much of the machine other processes took,
  which its wall-time share does; on an idle machine the two agree.

Why a large square GEMM and not the round's own shapes: it is the machine's
arithmetic ceiling, which is what a share of "this machine's GEMM" asks
about. The round's GEMMs are smaller (for the MLP 784-200-10 at batch 32,
`[1024, 784] x [784, 200]`-sized per model), and XLA runs them slower than
the square one; a share of that slower rate would credit the round with
XLA's own loss at small shapes.
"""

import os
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp


def _rates(fn: Callable[[], object], flops: float, repeats: int) -> dict:
  """`{"wall", "cpu"}` GFLOP/s of `fn()` (see the module docstring)."""
  fn()
  walls, cpus = [], []
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
  return dict(wall=flops / min(walls) / 1e9,
              cpu=flops * (os.cpu_count() or 1) / min(cpus) / 1e9)


def jax_gemm_gflops(size: int = 2048, repeats: int = 10) -> dict:
  """fp32 GEMM throughput of `jnp.matmul` (jitted): `{"wall", "cpu"}`."""
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
  mm = jax.jit(jnp.matmul)
  return _rates(lambda: mm(a, a).block_until_ready(), 2 * size**3, repeats)


def torch_gemm_gflops(size: int = 2048, device: str = "cpu",
                      repeats: int = 10) -> Optional[dict]:
  """Same for `torch.mm` on `device`, or None without torch."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  a = torch.randn(size, size, device=device)
  sync = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
  return _rates(lambda: (torch.mm(a, a), sync()), 2 * size**3, repeats)


def machine_gemm_gflops(size: int = 2048, device: str = "cpu") -> dict:
  """fp32 GEMM rates of jnp and torch, and the machine's: the faster one.

  Returns:
    `jax`, `torch` (None without torch) and `machine`: wall GFLOP/s;
    `jax_cpu`, `torch_cpu`, `machine_cpu`: the CPU-time rates.
  """
  jax_rates = jax_gemm_gflops(size)
  torch_rates = torch_gemm_gflops(size, device)
  both = [r for r in (jax_rates, torch_rates) if r is not None]
  return dict(
      jax=jax_rates["wall"], jax_cpu=jax_rates["cpu"],
      torch=torch_rates and torch_rates["wall"],
      torch_cpu=torch_rates and torch_rates["cpu"],
      machine=max(r["wall"] for r in both),
      machine_cpu=max(r["cpu"] for r in both))
