"""One jitted Myopic-Clustering round: method="direct" vs method="gram".

The paper's MNIST MLP 784-200-10 (P = 159,010), N clients with a batch of
random MNIST-shaped data each, K = 4, the 20th-percentile radius, 10
Threshold-Clustering steps: Table 1's settings (`experiments.mnist`), the
algorithm built through `experiments.registry` as the experiment builds it.
Both methods are compiled first, then timed alternately in the same process
(so load from other processes hits both alike); the ratio is the result.

  taskset -c 1 python -m benchmarks.bench_myopic --clients 300 --repeats 3
"""

import argparse
import time

import jax
import numpy as np

import prfl_jax as prfl
from experiments import registry
from experiments.mnist import config as table1
from prfl_jax import models


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--clients", type=int, default=300)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--clusters", type=int, default=4)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--method", choices=("both", "direct", "gram"), default="both")
  args = ap.parse_args(argv)
  if args.clients < args.clusters or args.repeats < 1 or args.batch < 1:
    ap.error("need clients >= clusters >= 1, repeats >= 1, batch >= 1")
  key = jax.random.PRNGKey(0)
  n = args.clients
  one = models.mlp_init(key, (784, 200, 10))
  params = prfl.tree.broadcast(one, n)
  kx, ky = jax.random.split(jax.random.PRNGKey(1))
  batch = (jax.random.normal(kx, (n, args.batch, 784)),
           jax.random.randint(ky, (n, args.batch), 0, 10))
  methods = ("direct", "gram") if args.method == "both" else (args.method,)
  steps, states = {}, {}
  ctx = registry.Context(models.mlp_classifier_loss(2),
                         clusters=np.arange(n) % args.clusters,
                         num_clusters=args.clusters, key=key)
  table1_settings = registry.settings(table1.Config(), "myopic")
  for method in methods:
    alg = registry.build("myopic", ctx, registry.Settings(
        {**table1_settings, "clustering_method": method}))
    states[method] = alg.init(params)
    steps[method] = jax.jit(alg.step)
    t = time.perf_counter()
    out = steps[method](states[method], batch, key)
    jax.block_until_ready(out)
    print(f"{method}: compile + first round {time.perf_counter() - t:.2f} s",
          flush=True)
  times = {m: [] for m in methods}
  for r in range(args.repeats):
    for method in methods:
      t = time.perf_counter()
      out = steps[method](states[method], batch, jax.random.PRNGKey(r))
      jax.block_until_ready(out)
      times[method].append(time.perf_counter() - t)
  for method in methods:
    print(f"{method}: {np.median(times[method]):.3f} s/round (median of "
          f"{args.repeats}: {', '.join(f'{t:.3f}' for t in times[method])})")
  if len(methods) == 2:
    print(f"ratio direct/gram: "
          f"{np.median(times['direct']) / np.median(times['gram']):.1f}x")
  a = np.asarray(out[0].assignment)
  print(f"N={n} P={sum(x.size for x in jax.tree.leaves(one))} "
        f"K={args.clusters} batch={args.batch}; last assignment sizes "
        f"{np.bincount(a, minlength=args.clusters).tolist()}")


if __name__ == "__main__":
  main()
