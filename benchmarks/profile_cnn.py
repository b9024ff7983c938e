"""Where a Federated-Clustering round on a small CNN spends its time, per part.

The round of `kernels.cluster_at_models` with the default plan on a
`benchmarks.zoo` CNN (default: issue 21's user CNN `cnn_small`, conv 16 -
pool - conv 32 - pool - dense 64 - dense 10 on 28x28x1, batch 16), cut into
the parts the ghost kernel runs for one model, each compiled on its own
and timed for all N models:

  forward            the loss of the N clients at one model (vmap)
  autodiff grads     value and gradient per client (what the Gram kernel
                     materialises)
  tapped fwd+bwd     the ghost kernel's forward and backward through the
                     interpreter (`interpret.evaluate`): layer inputs and output
                     cotangents, no weight gradients
  per layer L:       its input tokens (patches for a convolution), its
                     per-client weight gradients materialised (`a^T d`), and,
                     for a layer the kernel runs through (*), its ghost Gram
                     from the tokens
  ghost_grads        the whole of the above as the kernel runs it (the
                     per-layer choice of `ghost.layer_choices`)
  combine            the centre, one GEMM per (*) layer
  clustering         Threshold-Clustering on the `[N, N]` Gram matrix
  round / N          the whole round of the default plan, per model

Times are the least CPU time of the process (all threads) over `--repeats`
calls taken in turns, after one warm-up call; the PyTorch per-pair loop
(`benchmarks.torch_loop`, `--torch-threads`) is timed alongside
when torch is importable. The parts overlap (ghost_grads contains the
tapped pass and the layers), so they do not add up to the round.

  python -m benchmarks.profile_cnn --clients 8
  python -m benchmarks.profile_cnn --model cnn --clients 16
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

import prfl_jax as prfl
from prfl_jax import kernels
from prfl_jax.kernels import base
from prfl_jax.kernels import ghost
from prfl_jax.kernels import interpret
from prfl_jax.kernels import trace
from benchmarks import common
from benchmarks import torch_loop
from benchmarks import zoo


def parts(loss_fn, params, batch, radius, num_iters):
  """`{name: (fn, args, per_model)}`: the round's parts for one model."""
  n = jax.tree.leaves(batch)[0].shape[0]
  one = lambda t: jax.tree.map(lambda a: a[0], t)
  x0 = one(params)
  analysis = trace.analyse(loss_fn, x0, one(batch))
  problem = base.Problem(loss_fn, batch, radius, num_iters, jnp.ones((n,)))
  ctx = ghost.prepare(problem, params, analysis)
  active = analysis.active()
  inline = interpret.inline_paths(analysis, active)

  def tapped(x, b):
    model = jax.tree.leaves(x)
    taps = {p: jnp.zeros((n,) + s.out_aval.shape, s.out_aval.dtype)
            for p, s in active.items()}

    def client(taps, bb):
      return interpret.evaluate(analysis, model + list(bb), taps, active, inline)

    (_, xs), dys = jax.vmap(jax.value_and_grad(client, has_aux=True))(
        taps, jax.tree.leaves(b))
    return xs, dys

  out = {
      "forward": (lambda x, b: jax.vmap(loss_fn, (None, 0))(x, b),
                  (x0, batch), True),
      "autodiff grads": (lambda x, b: jax.vmap(
          jax.value_and_grad(loss_fn), (None, 0))(x, b), (x0, batch), True),
      "tapped fwd+bwd": (tapped, (x0, batch), True),
  }
  xs, dys = jax.jit(tapped)(x0, batch)
  choices = ghost.layer_choices(analysis, n)
  for k, (g, use) in enumerate(zip(analysis.groups, choices)):
    name = (f"layer {k} {type(g.layer).__name__} M={g.num_tokens} "
            f"p={g.width} q={g.layer.q} {'(*)' if use else 'materialised'}")
    shared = use and g.shared_input
    out[f"{name}: input tokens"] = (
        lambda xs, g=g: ghost._input_tokens(g, xs), (xs,), not shared)  # pylint: disable=protected-access
    out[f"{name}: weight grads a^T d"] = (
        lambda xs, dys, g=g: ghost._materialised(  # pylint: disable=protected-access
            g, xs, ghost._output_tokens(g, xs, dys)), (xs, dys), True)  # pylint: disable=protected-access

    def gram(xs, dys, g=g):
      a = ghost._finite_or_zero(ghost._input_tokens(g, xs))  # pylint: disable=protected-access
      rows = ghost._rows(ghost._output_tokens(g, xs, dys))  # pylint: disable=protected-access
      return sum(ghost._block_gram(  # pylint: disable=protected-access
          ghost._input_gram(a)[j], rows[j], n, ctx.options.split,  # pylint: disable=protected-access
          ctx.options.min_split_rows) for j in range(g.layer.groups))

    if use:  # Elsewhere its [N M, N M] matrices need not fit in memory.
      out[f"{name}: ghost Gram (*)"] = (gram, (xs, dys), True)
  grads = jax.jit(lambda x, b: ghost.ghost_grads(ctx, x, b))(x0, batch)
  out["ghost_grads (as the kernel runs it)"] = (
      lambda x, b: ghost.ghost_grads(ctx, x, b), (x0, batch), True)
  out["combine (centre)"] = (
      lambda gr: ghost.combine(ctx, jnp.full((n,), 1.0 / n), gr,
                               jnp.ones((n,), bool), jax.tree.structure(x0)),
      (grads,), True)

  def clustering(gram):
    centred, ok = base.owner_centred(gram, 0)
    return base.cluster_on_gram(problem, centred, ok)

  out["clustering"] = (clustering, (grads.gram,), True)
  out["round / N (default plan)"] = (
      lambda p, b: kernels.cluster_at_models(
          loss_fn, p, b, radius=radius, num_iters=num_iters).centers,
      (params, batch), False)
  return out


def profile(parts_, n: int, repeats: int) -> list:
  """Compiles every part, times them in turns; rows `(name, ms per round)`."""
  compiled = {}
  for name, (fn, args, per_model) in parts_.items():
    c = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(c(*args))
    compiled[name] = (c, args, per_model)
  cpu = {name: [] for name in compiled}
  for _ in range(repeats):
    for name, (c, args, _) in compiled.items():
      t0 = time.process_time()
      jax.block_until_ready(c(*args))
      cpu[name].append(time.process_time() - t0)
  return [dict(part=name, ms=1e3 * min(cpu[name]) * (n if per_model else 1),
               per_model=per_model) for name, (_, _, per_model)
          in compiled.items()]


def add_round_args(p: argparse.ArgumentParser, repeats: int,
                   models=tuple(sorted(zoo.SPECS))):
  """The arguments that pick the profiled round (also `profile_ops`)."""
  p.add_argument("--model", choices=models, default="cnn_small")
  p.add_argument("--clients", type=common.positive_int, default=8)
  p.add_argument("--batch-size", type=common.positive_int, default=16)
  p.add_argument("--num-iters", type=common.positive_int, default=10)
  p.add_argument("--repeats", type=common.positive_int, default=repeats)
  p.add_argument("--width-divisor", type=common.positive_int, default=1)


def round_problem(p: argparse.ArgumentParser, args):
  """`(spec, loss_fn, params, batch, radius)` of `add_round_args`' round;
  prints the load average."""
  if args.clients < 2:
    p.error("--clients must be >= 2")
  print(f"load average {os.getloadavg()}, {args.model}, N={args.clients}, "
        f"batch {args.batch_size}", flush=True)
  spec = zoo.SPECS[args.model].scaled(args.width_divisor)
  params, batch = zoo.federation(spec, args.clients, args.batch_size, 0)
  _, loss_fn = zoo.make_loss(spec)
  return spec, loss_fn, params, batch, prfl.quantile_radius(0.2)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_round_args(p, repeats=5)
  p.add_argument("--torch-threads", type=lambda t: tuple(
      int(v) for v in t.split(",")), default=(1,),
                 help="torch.set_num_threads per run of the PyTorch loop (0: "
                 "torch's default; on a loaded machine its threads can be "
                 "10x slower)")
  p.add_argument("--no-torch", action="store_true")
  args = p.parse_args(argv)
  spec, loss_fn, params, batch, radius = round_problem(p, args)
  with jax.default_matmul_precision("highest"):
    rows = profile(parts(loss_fn, params, batch, radius, args.num_iters),
                   args.clients, args.repeats)
  if not args.no_torch:
    for threads in args.torch_threads:
      res, _ = torch_loop.run_cnn_loop(spec, params, batch, radius,
                                       args.num_iters, threads, args.repeats,
                                       60.0)
      if res is None:
        print("torch is not importable: no PyTorch loop.")
        break
      rows.append(dict(part=f"PyTorch per-pair loop, "
                       f"{res['torch_threads']} threads",
                       ms=1e3 * res["cpu_s"], per_model=False))
  print(common.format_table(rows, [("part", "part", "{}"),
                                   ("ms", "CPU ms per round", "{:.1f}")]))
  print(f"load average end {os.getloadavg()}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
