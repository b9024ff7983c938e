"""Federated-Clustering rounds on one device against a CPU reference, per
kernel and matmul precision: is a difference the precision or the kernel?

The problem is `tests/test_ghost.py`'s split-Gram case (9 clients x 32
examples = 288 token rows, above `ghost._MIN_SPLIT_ROWS`, a 6-5-3 MLP, fixed
radius, 2 rounds of FC with SGD 0.2). Every configuration runs on the default
device; the reference is the Gram kernel at "highest" on the CPU. Prints, per
configuration, the largest parameter difference from the reference (over
all leaves and clients), the client where it is largest, the ball fractions
of both rounds, and the error of the first round's `[N, N]` Gram matrices
(all N models, computed as the configuration computes them) against float64.

The two causes of a difference are told apart: a wrong Gram matrix (a
kernel or compiler defect: `gram_err` far above float32 rounding), or a
client on the edge of a ball (`margin`: the least |distance - radius| /
radius over the first round's clustering steps, in float64), which any
rounding difference can move across the radius, changing the round by a
whole client's gradient while every Gram matrix is right.

  python -m benchmarks.check_ghost_precision [--out FILE.json]
"""

import argparse
import json
import sys

import jax
import numpy as np

from prfl_jax import models
from prfl_jax import tree as tree_lib
from prfl_jax.kernels import base
from prfl_jax.kernels import ghost
from prfl_jax.kernels import trace
from benchmarks import common

N, B, SIZES, ROUNDS, NUM_ITERS = 9, 32, (6, 5, 3), 2, 4


def problem():
  """`(loss, params [N, ...], batch ([N, B, 6], [N, B]))` of the test."""
  keys = jax.random.split(jax.random.PRNGKey(4), N)
  params = jax.vmap(lambda k: models.mlp_init(k, SIZES))(keys)
  rng = np.random.default_rng(4)
  x = rng.normal(size=(N, B, SIZES[0])).astype(np.float32)
  y = np.where(np.arange(N)[:, None] < 5, x[..., 0] > 0,
               2 * (x[..., 1] > 0)).astype(np.int32)
  return models.mlp_classifier_loss(2), params, (x, y)


def pair_gradients(loss, params, batch) -> np.ndarray:
  """`[N models, N clients, P]` gradients from the CPU, in float64."""
  with jax.default_device(jax.devices("cpu")[0]), \
      jax.default_matmul_precision("highest"):
    grads = jax.jit(jax.vmap(jax.vmap(jax.grad(loss), (None, 0)),
                             (0, None)))(params, batch)
  return np.concatenate([np.asarray(g, np.float64).reshape(N, N, -1)
                         for g in jax.tree.leaves(grads)], axis=2)


def median_pair_distance(flat: np.ndarray) -> float:
  """The test's fixed radius: the median distance of a client's gradient
  from the owner's, over all models and clients."""
  own = flat[np.arange(N), np.arange(N)]
  dist = np.linalg.norm(flat - own[:, None], axis=2)
  return float(np.median(dist[~np.eye(N, dtype=bool)]))


def least_margin(flat: np.ndarray, radius: float, num_iters: int) -> float:
  """Least |distance - radius| / radius over the first round's clustering
  steps of every model (Algorithm 2, unit weights, float64)."""
  least = np.inf
  for i in range(N):
    z, v = flat[i], flat[i, i]
    for _ in range(num_iters):
      dist = np.linalg.norm(z - v, axis=1)
      least = min(least, float(np.min(np.abs(dist - radius))) / radius)
      inside = dist <= radius
      v = (z[inside].sum(0) + (N - inside.sum()) * v) / N
  return least


def gram_error(loss, params, batch, chunk, kernel, flat) -> tuple:
  """Largest |G_i - G_i(float64)| / max |G(float64)| of the `[N, N]` Gram
  matrices of all N models, computed on the default device as the round
  computes them (`chunk` models at a time, by `kernel`): over the whole
  matrices, then over the blocks of the split's halves of clients (the
  first N // 2 against themselves, the two halves against each other, the
  rest against themselves)."""
  if isinstance(kernel, base.Kernel):
    one = lambda t: jax.tree.map(lambda a: a[0], t)
    analysis = trace.analyse(loss, one(params), one(batch))

    def grams(p, b):
      problem = base.Problem(loss, b, 1.0, 1, np.ones((N,), np.float32))
      ctx = kernel.prepare(problem, p, analysis)
      return _over_models(lambda x: ghost.ghost_grads(ctx, x, b).gram, p,
                          chunk)
  else:
    def grams(p, b):
      return _over_models(lambda x: tree_lib.gram(jax.vmap(
          jax.grad(loss), (None, 0))(x, b)), p, chunk)
  got = np.asarray(jax.jit(grams)(params, batch), np.float64)
  want = np.einsum("ijp,ikp->ijk", flat, flat)
  err = np.abs(got - want) / np.max(np.abs(want))
  h = N // 2
  return float(err.max()), tuple(float(b.max()) for b in (
      err[:, :h, :h], np.maximum(err[:, :h, h:], err[:, h:, :h].transpose(
          0, 2, 1)), err[:, h:, h:]))


def _over_models(fn, params, chunk):
  if chunk is None:
    return jax.vmap(fn)(params)
  return jax.lax.map(fn, params, batch_size=chunk)


def fc_rounds(loss, params, batch, radius, chunk, kernel):
  alg = common.algorithm(
      "fc", loss, lr=0.2, momentum=0.0, radius=radius, num_iters=NUM_ITERS,
      chunk_size="all" if chunk is None else chunk, kernel=kernel)
  state = alg.init(params)
  step = jax.jit(alg.step)
  fractions = []
  for r in range(ROUNDS):
    state, metrics = step(state, batch, jax.random.PRNGKey(r))
    fractions.append(round(float(metrics["ball_fraction"]), 4))
  return jax.device_get(state.params), fractions


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  loss, params, batch = problem()
  flat = pair_gradients(loss, params, batch)
  radius = median_pair_distance(flat)
  margin = least_margin(flat, radius, NUM_ITERS)
  with jax.default_device(jax.devices("cpu")[0]), \
      jax.default_matmul_precision("highest"):
    ref, ref_fr = fc_rounds(loss, params, batch, radius, 1, "gram")
  print(f"device {jax.devices()[0]}, jax {jax.__version__}; radius "
        f"{radius:.6g}; reference (CPU, gram, highest) ball fractions "
        f"{ref_fr}; least margin {margin:.2e} of the radius (float32 "
        f"rounding moves a distance by ~1e-7)")
  rows = []
  for precision in ("default", "highest"):
    for name, chunk, kernel, split in (
        ("gram c1", 1, "gram", True), ("gram full", None, "gram", True),
        ("ghost full split", None, "ghost", True),
        ("ghost full nosplit", None, "ghost", False),
        ("ghost c3 split", 3, "ghost", True)):
      # Every layer through (*), the split forced either way: it is off by
      # default off CPU since this check found it wrong on an H100.
      if kernel == "ghost":
        kernel = ghost.kernel(split=split, always=True)
      ctx = (jax.default_matmul_precision(precision) if precision != "default"
             else jax.default_matmul_precision(None))
      with ctx:
        out, fr = fc_rounds(loss, params, batch, radius, chunk, kernel)
        g_err, blocks = gram_error(loss, params, batch, chunk, kernel, flat)
      diff = np.stack([np.max(np.abs(np.asarray(a) - np.asarray(r)).reshape(
          N, -1), axis=1) for a, r in zip(jax.tree.leaves(out),
                                          jax.tree.leaves(ref))]).max(0)
      row = dict(precision=precision, config=name, max_diff=float(diff.max()),
                 worst_client=int(diff.argmax()), fractions=fr,
                 gram_err=g_err, gram_err_blocks=blocks)
      rows.append(row)
      print(f"{precision:8s} {name:20s} max|diff| {diff.max():.3e} "
            f"(client {diff.argmax()})  ball fractions {fr}  gram_err "
            f"{g_err:.1e} (blocks " + " ".join(f"{b:.0e}" for b in blocks)
            + ")", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(device=str(jax.devices()[0]), jax=jax.__version__,
                     radius=radius, least_margin=margin,
                     reference_fractions=ref_fr, rows=rows),
                f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
