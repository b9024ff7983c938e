"""Why a CNN's centres on a GPU part from the CUDA loop's: rounding or balls?

`bench_models` on an H200 (issue 21) read the Flax CNN's Federated-Clustering
centres 6.3e-4 (N = 16) and 5.2e-3 (N = 32) away from the PyTorch per-pair
loop on CUDA, both in float32, while prfl's two kernels agreed to 4e-7 and,
on CPU, prfl and the loop agreed to 4e-7. This check separates the two
possible causes:

  * the gradients differ (one side computes in a lower precision), or
  * the gradients agree to float32 rounding, and Threshold-Clustering
    (Algorithm 2: a ball of quantile radius, 10 steps) amplifies that
    rounding where a client sits on a ball's edge: one client in or out of
    a ball moves the centre by |z_j - v| / N.

It computes every client's gradient at every model four ways (PyTorch on
CUDA and on CPU, JAX on the default device and on the CPU, all in float32
with TF32 off), runs Algorithm 2 in float64 on each set, recording
each step's ball, and reports, per pair of gradient sources: the gradients'
largest relative difference, the number of (model, step) balls that differ,
and the centres' difference on models whose balls all agree and on the rest.
It also runs the two pipelines `bench_models` compares (prfl's default plan
and the per-pair loop on `--torch-device`) on the same federation and
reports each against the float64 clustering of every source: a pipeline is
right for its own gradients when it lands on their float64 centres.

  python -m benchmarks.check_centres_gpu --clients 16,32 --out centres_gpu.json
  # On a CPU alone (no GPU sources): which of prfl and the loop is right
  # where their VGG-8 centres differ (was `check_vgg8_centres`):
  python -m benchmarks.check_centres_gpu --model vgg8 --clients 8 \
      --torch-device cpu
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

import prfl_jax as prfl
from benchmarks import common
from benchmarks import torch_loop
from benchmarks import zoo


def threshold_clustering_f64(z, owner: int, q: float, num_iters: int,
                             device="cpu"):
  """Algorithm 2 (one centre, started at `z[owner]`) in float64: the per-pair
  loop's own clustering (`torch_loop.torch_threshold_clustering`, whose
  `quantile` interpolates linearly as NumPy's does) with every ball recorded.

  Args:
    z: `[N, P]` gradients of the N clients at one model.
    owner: the index of the client whose centre this is.
    q: the radius quantile.
    num_iters: clustering steps.
    device: where PyTorch computes.

  Returns:
    `(centre [P], balls [num_iters, N] bool, margin)`: `margin` is the
    smallest relative gap |d_j - tau| / tau between a client's distance and
    the radius over the steps (how close a client came to the ball's edge).
  """
  import torch  # pylint: disable=g-import-not-at-top
  z = torch.from_numpy(np.asarray(z)).to(device, torch.float64)
  balls, gaps = [], []

  def record(dist, tau, inside):
    balls.append(inside.cpu().numpy())
    off_edge = torch.abs(dist - tau)[dist != tau]
    if tau > 0 and off_edge.numel():
      gaps.append(float(off_edge.min() / tau))

  v = torch_loop.torch_threshold_clustering(
      torch, z, z[owner].clone(), prfl.quantile_radius(q), num_iters,
      on_step=record)
  return v.cpu().numpy(), np.stack(balls), min(gaps, default=np.inf)


def torch_gradients(spec, params, batch, device) -> np.ndarray:
  """`[N models, N clients, P]` float32 gradients from the PyTorch twin (the
  per-pair loop's own gradient code), in the Flax model's order."""
  import torch  # pylint: disable=g-import-not-at-top
  n = jax.tree.leaves(params)[0].shape[0]
  xs, ys = torch_loop.cnn_inputs(torch, batch, device)
  out = []
  for i in range(n):
    net = torch_loop.torch_net(
        torch, spec, jax.tree.map(lambda a, i=i: a[i], params)).to(device)
    z = torch_loop.client_gradients(torch, net, xs, ys).cpu().numpy()
    out.append(torch_loop.torch_to_flax_order(torch, net.cpu(), spec, z))
  return np.stack(out)


def jax_gradients(loss_fn, params, batch, device) -> np.ndarray:
  """`[N models, N clients, P]` float32 gradients from JAX on `device`."""
  params, batch = jax.device_put((params, batch), device)
  grads = jax.jit(jax.vmap(jax.vmap(jax.grad(loss_fn), in_axes=(None, 0)),
                           in_axes=(0, None)))(params, batch)
  leaves = jax.tree.leaves(grads)
  n = leaves[0].shape[0]
  return np.concatenate([np.asarray(l).reshape(n, n, -1) for l in leaves], 2)


def compare(spec, n, args) -> dict:
  """Every gradient source and pipeline for one model and N."""
  params, batch = zoo.federation(spec, n, args.batch_size, args.seed)
  _, loss_fn = zoo.make_loss(spec)
  q = float(args.radius.q)
  grads, times = {}, {}
  sources = [("torch_cpu", lambda: torch_gradients(spec, params, batch,
                                                   "cpu")),
             ("jax_cpu", lambda: jax_gradients(loss_fn, params, batch,
                                               jax.devices("cpu")[0]))]
  if jax.default_backend() != "cpu":
    sources.append(("jax_" + jax.default_backend(), lambda: jax_gradients(
        loss_fn, params, batch, jax.devices()[0])))
  if args.torch_device != "cpu":
    sources.append(("torch_" + args.torch_device, lambda: torch_gradients(
        spec, params, batch, args.torch_device)))
  for name, fn in sources:
    t0 = time.perf_counter()
    grads[name] = fn()
    times[name] = time.perf_counter() - t0
  ref = "torch_cpu"
  tc_device = args.torch_device
  tc = {name: [threshold_clustering_f64(g[i], i, q, args.num_iters, tc_device)
               for i in range(n)] for name, g in grads.items()}
  centres = {name: np.stack([c for c, _, _ in rows])
             for name, rows in tc.items()}
  scale = float(np.max(np.abs(centres[ref])))
  gscale = float(np.max(np.abs(grads[ref])))
  row = dict(model=spec.name, n=n, seconds=times,
             margin_min=min(m for _, _, m in tc[ref]),
             sources={})
  for name in grads:
    differ = [int(np.sum(np.any(tc[name][i][1] != tc[ref][i][1], axis=1)))
              for i in range(n)]
    same = [i for i in range(n) if differ[i] == 0]
    moved = [i for i in range(n) if differ[i] > 0]
    diff = np.max(np.abs(centres[name] - centres[ref]), axis=1) / scale
    row["sources"][name] = dict(
        grad_rel_diff=float(np.max(np.abs(grads[name] - grads[ref])) / gscale),
        balls_differ=int(sum(differ)), models_with_other_balls=len(moved),
        centre_rel_diff=float(diff.max()),
        centre_rel_diff_same_balls=float(diff[same].max()) if same else None,
        centre_rel_diff_other_balls=float(diff[moved].max()) if moved else None)
  # The two pipelines bench_models compares, on the same federation, each
  # against float64 clustering of every source's gradients: a pipeline that
  # lands on its own gradients' float64 centres is right for its gradients.
  pipes = {}
  compiled, _ = common.compile_round(loss_fn, params, batch,
                                     prfl.ExecutionPlan(), args.radius,
                                     args.num_iters)
  pipes["prfl_default_plan"] = zoo.flat_centers(compiled(params, batch))
  _, pipes["torch_loop_" + args.torch_device] = torch_loop.run_cnn_loop(
      spec, params, batch, args.radius, args.num_iters, 0, 1, 1.0,
      device=args.torch_device)
  row["pipelines_vs_f64"] = {
      k: {name: float(np.max(np.abs(v - c)) / scale)
          for name, c in centres.items()} for k, v in pipes.items()}
  return row


@common.float32_matmuls
def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      prog="python -m benchmarks.check_centres_gpu",
      description=__doc__.split("\n\n")[0])
  p.add_argument("--model", choices=sorted(zoo.SPECS), default="cnn")
  p.add_argument("--clients", type=common.int_list(1), default=(16, 32))
  p.add_argument("--batch-size", type=common.positive_int, default=16)
  p.add_argument("--num-iters", type=common.positive_int, default=10)
  p.add_argument("--radius", type=common.parse_radius, default="quantile:0.2")
  p.add_argument("--width-divisor", type=common.positive_int, default=1)
  p.add_argument("--torch-device", default="cuda")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  if not isinstance(args.radius, prfl.QuantileRadius):
    p.error("--radius: this check needs a quantile radius (quantile:Q)")
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    p.error("needs torch (pip install -e '.[peers]' or a CPU torch)")
  if args.torch_device != "cpu" and not torch.cuda.is_available():
    print(f"--torch-device {args.torch_device}: not available; CPU only")
    args.torch_device = "cpu"
  spec = zoo.SPECS[args.model].scaled(args.width_divisor)
  rows = []
  for n in args.clients:
    row = compare(spec, n, args)
    rows.append(row)
    print(f"{spec.name} N={n}: smallest edge margin "
          f"{row['margin_min']:.1e} (torch CPU's gradients)")
    for name, s in row["sources"].items():
      print(f"  {name:11s} grads {s['grad_rel_diff']:.1e}  balls differ "
            f"{s['balls_differ']:3d} in {s['models_with_other_balls']:2d} "
            f"models  centres {s['centre_rel_diff']:.1e} (same balls "
            f"{s['centre_rel_diff_same_balls']}, other balls "
            f"{s['centre_rel_diff_other_balls']})", flush=True)
    for k, by_source in row["pipelines_vs_f64"].items():
      print(f"  pipeline {k:17s} from float64 clustering of: " + ", ".join(
          f"{name} {v:.1e}" for name, v in by_source.items()), flush=True)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(dict(args={k: str(v) for k, v in vars(args).items()},
                     machine=common.machine_info()
                     if hasattr(common, "machine_info") else None,
                     rows=rows), f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
