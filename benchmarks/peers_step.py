"""Where a `bench_peers` round goes: one local SGD step, each way to run it.

A round of `bench_peers` is 50 clients x 5 local steps of pfl's CIFAR CNN on
batches of 10, so one step's gradient is its unit of cost. This times that
gradient (CPU time of the process, median over interleaved repeats, so the
load of a shared machine counts less than in wall time) for each of
`bench_peers.cnn_apply`'s convolutions, and for pfl's PyTorch model when
torch is installed (`--torch-threads`, default 1 like `bench_peers`).

  taskset -c 1 python -m benchmarks.peers_step            # one core
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from benchmarks import bench_peers
from benchmarks import peers_task

CONVS = ("fast", "patches", "xla")


def jax_steps(batch: int):
  """{conv: () -> None}: one jitted gradient of the CNN each, warmed up."""
  params = jax.tree.map(jnp.asarray, peers_task.init_params(0))
  x, y = peers_task.client_data(peers_task.Task(examples=batch, batch=batch),
                                0)
  data = (jnp.asarray(x), jnp.asarray(y.astype(np.int32)))
  steps = {}
  for conv in CONVS:
    grad = jax.jit(jax.grad(prfl.models.classifier_loss(
        bench_peers.cnn_apply(conv))))
    jax.block_until_ready(grad(params, data))
    steps[f"jax {conv}"] = (
        lambda g=grad: jax.block_until_ready(g(params, data)))
  return steps


def torch_step(batch: int, threads: int):
  """pfl's model's gradient in PyTorch, or None without torch."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from benchmarks import peers_torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  torch.set_num_threads(threads)
  model = peers_torch.torch_model(peers_task.init_params(0))
  x, y = peers_task.client_data(peers_task.Task(examples=batch, batch=batch),
                                0)
  x, y = torch.from_numpy(x), torch.from_numpy(y)

  def step():
    model.zero_grad()
    model.loss(x, y).backward()
  step()
  return step


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--batch", type=int, default=10)
  p.add_argument("--repeats", type=int, default=30)
  p.add_argument("--torch-threads", type=int, default=1)
  args = p.parse_args(argv)
  if args.batch < 1 or args.repeats < 1 or args.torch_threads < 1:
    p.error("--batch, --repeats and --torch-threads must be >= 1")
  steps = jax_steps(args.batch)
  ts = torch_step(args.batch, args.torch_threads)
  if ts is not None:
    steps[f"torch ({args.torch_threads} thread)"] = ts
  cpu = {k: [] for k in steps}
  for _ in range(args.repeats):
    for name, step in steps.items():
      t = time.process_time()
      step()
      cpu[name].append(time.process_time() - t)
  print(f"one local step (gradient, batch {args.batch}), CPU ms, median of "
        f"{args.repeats}; load {os.getloadavg()}")
  for name, v in cpu.items():
    print(f"  {name:20s} {np.median(v) * 1e3:7.1f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
