"""Federated-Clustering rounds on one device against a CPU reference, per
kernel and matmul precision: is a difference the precision or the kernel?

The problem is `tests/test_ghost.py`'s split-Gram case (9 clients x 32
examples = 288 token rows, above `ghost._MIN_SPLIT_ROWS`, a 6-5-3 MLP, fixed
radius, 2 rounds of FC with SGD 0.2). Every configuration runs on the default
device; the reference is the Gram kernel at "highest" on the CPU. Prints, per
configuration, the largest parameter difference from the reference (over
all leaves and clients), the client where it is largest, and the
ball fractions of both rounds.

  python -m benchmarks.check_ghost_precision [--out FILE.json]
"""

import argparse
import json
import sys

import jax
import numpy as np
import optax

import prfl_jax as prfl
from prfl_jax import models
from prfl_jax.kernels import ghost

N, B, SIZES, ROUNDS = 9, 32, (6, 5, 3), 2


def problem():
  """`(loss, params [N, ...], batch ([N, B, 6], [N, B]))` of the test."""
  keys = jax.random.split(jax.random.PRNGKey(4), N)
  params = jax.vmap(lambda k: models.mlp_init(k, SIZES))(keys)
  rng = np.random.default_rng(4)
  x = rng.normal(size=(N, B, SIZES[0])).astype(np.float32)
  y = np.where(np.arange(N)[:, None] < 5, x[..., 0] > 0,
               2 * (x[..., 1] > 0)).astype(np.int32)
  return models.mlp_classifier_loss(2), params, (x, y)


def median_pair_distance(loss, params, batch) -> float:
  """The test's fixed radius, in float64 from CPU gradients."""
  with jax.default_device(jax.devices("cpu")[0]), \
      jax.default_matmul_precision("highest"):
    grads = jax.jit(jax.vmap(jax.vmap(jax.grad(loss), (None, 0)),
                             (0, None)))(params, batch)
  flat = np.concatenate([np.asarray(g, np.float64).reshape(N, N, -1)
                         for g in jax.tree.leaves(grads)], axis=2)
  own = flat[np.arange(N), np.arange(N)]
  dist = np.linalg.norm(flat - own[:, None], axis=2)
  return float(np.median(dist[~np.eye(N, dtype=bool)]))


def fc_rounds(loss, params, batch, radius, chunk, kernel):
  alg = prfl.algorithms.federated_clustering(
      loss, optax.sgd(0.2), radius=radius, num_iters=4,
      plan=prfl.ExecutionPlan(chunk, kernel))
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
  radius = median_pair_distance(loss, params, batch)
  with jax.default_device(jax.devices("cpu")[0]), \
      jax.default_matmul_precision("highest"):
    ref, ref_fr = fc_rounds(loss, params, batch, radius, 1, "gram")
  print(f"device {jax.devices()[0]}, jax {jax.__version__}; radius "
        f"{radius:.6g}; reference (CPU, gram, highest) ball fractions "
        f"{ref_fr}")
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
      diff = np.stack([np.max(np.abs(np.asarray(a) - np.asarray(r)).reshape(
          N, -1), axis=1) for a, r in zip(jax.tree.leaves(out),
                                          jax.tree.leaves(ref))]).max(0)
      row = dict(precision=precision, config=name, max_diff=float(diff.max()),
                 worst_client=int(diff.argmax()), fractions=fr)
      rows.append(row)
      print(f"{precision:8s} {name:20s} max|diff| {diff.max():.3e} "
            f"(client {diff.argmax()})  ball fractions {fr}", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(device=str(jax.devices()[0]), jax=jax.__version__,
                     radius=radius, reference_fractions=ref_fr, rows=rows),
                f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
