"""The machine's fp32 GEMM rate: what "% of GEMM" in the benchmarks means."""

from typing import Optional

import jax
import jax.numpy as jnp

from benchmarks.common import median_time


def jax_gemm_gflops(size: int = 2048, repeats: int = 10) -> float:
  """Measured fp32 GEMM throughput of `jnp.matmul` (jitted) in GFLOP/s.

  The fastest of `repeats` calls: the machine's attainable rate, which a
  concurrent process can only lower.
  """
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
  mm = jax.jit(jnp.matmul)
  _, times = median_time(lambda: mm(a, a).block_until_ready(), repeats)
  return 2 * size**3 / min(times) / 1e9


def torch_gemm_gflops(size: int = 2048, device: str = "cpu",
                      repeats: int = 10) -> Optional[float]:
  """Same for `torch.mm` on `device`, or None without torch."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  a = torch.randn(size, size, device=device)
  sync = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
  _, times = median_time(lambda: (torch.mm(a, a), sync()), repeats)
  return 2 * size**3 / min(times) / 1e9


def machine_gemm_gflops(size: int = 2048, device: str = "cpu") -> dict:
  """fp32 GEMM rates of jnp and torch, and the machine's: the faster one."""
  rates = {"jax": jax_gemm_gflops(size), "torch": torch_gemm_gflops(size,
                                                                    device)}
  rates["machine"] = max(r for r in rates.values() if r is not None)
  return rates

