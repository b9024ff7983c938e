"""Which VGG-8 centres are right when prfl and the PyTorch loop disagree?

`bench_models` at full VGG-8 width reports centres of the default plan that
differ from the PyTorch loop's by ~2e-3 (relative, N = 8 and 16), while at
width / 4 all three configurations agree to 2e-7. This script settles it on
the benchmark's own federation (N = 8, batch 16, seed 0): it materialises
every model's per-client gradients with `jax.vmap(jax.grad(loss))`, runs
Threshold-Clustering (quantile 0.2, 10 steps, each centre from its owner's
gradient) in float64 on them, and prints each model's largest difference
from that reference for prfl's default plan and for the PyTorch loop, and the
2nd-4th smallest distances from each start (near ties make the ball
sensitive to float32 differences in the gradients).

  python -m benchmarks.check_vgg8_centres   # ~3 min on 2 cores
"""

import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np
import prfl_jax as prfl
from prfl_jax import kernels
from benchmarks import torch_loop
from benchmarks import zoo as bm
spec = bm.SPECS["vgg8"]
n = 8
params, batch = bm.federation(spec, n, 16, 0)
_, loss_fn = bm.make_loss(spec)
radius = prfl.quantile_radius(0.2)
auto = bm.flat_centers(jax.jit(lambda p, b: kernels.cluster_at_models(loss_fn, p, b, radius=radius, num_iters=10).centers)(params, batch))
auto = np.asarray(auto, np.float64)
tl = torch_loop.run_cnn_loop(spec, params, batch, radius, 10, 1, 1, 1.0)[1].astype(np.float64)
gfn = jax.jit(jax.vmap(jax.grad(loss_fn), in_axes=(None, 0)))
refs, margins = [], []
for i in range(n):
  p_i = jax.tree.map(lambda a: a[i], params)
  g = bm.flat_centers(gfn(p_i, batch))  # [n, P] float32
  g64 = jnp.asarray(np.asarray(g, np.float64))
  c = prfl.threshold_clustering(g64, g64[i][None], radius=radius, num_iters=10)
  refs.append(np.asarray(c)[0])
  d = np.linalg.norm(np.asarray(g64) - np.asarray(g64[i]), axis=1)
  ds = np.sort(d)
  margins.append(ds[1:4] / ds[1])
ref = np.stack(refs)
scale = np.max(np.abs(ref))
for name, x in (("prfl auto", auto), ("torch loop", tl)):
  per_model = np.max(np.abs(x - ref), axis=1) / scale
  print(name, "max rel diff vs float64 reference per model:", np.array2string(per_model, precision=1))
print("sorted distances from each start (2nd-4th, relative to 2nd):")
for m in margins: print(np.array2string(m, precision=6))
