"""Probe (session 9): the default started at the true assignment, frozen
(truth_frozen), or any options, seeds 0-4 vmapped. Output:
truth_frozen.out. truth_frozen_equal_centres.out is the same probe before
the carried centres were made distinct (all 0: Threshold-Clustering merged
them onto cluster 0's, whatever `members` said; error 2.7-4.6).

argv[1]: library kwargs (dict literal); argv[2]: probe options: rounds,
warm, lr, mom, q, truth_frozen (start from the true assignment, frozen).
"""
import sys, json, ast, time
import jax, jax.numpy as jnp, numpy as np, optax
import prfl_jax as prfl

K, NPC = 4, 25
SEEDS = [0, 1, 2, 3, 4]

def simulate(kw, rounds=300, warm=5, lr=0.004, mom=0.9, q=0.95, truth_frozen=False, seeds=SEEDS):
  datas = [prfl.data.synthetic_regression(jax.random.key(s), num_clusters=K, clients_per_cluster=NPC)[0] for s in seeds]
  truth = np.asarray(datas[0].clusters); n = len(truth)
  train = jax.tree.map(lambda *x: jnp.stack(x), *[d.train for d in datas])
  xstar = jnp.stack([d.test["x_star"] for d in datas])
  alpha = 1 - mom
  kw = dict(kw)
  if truth_frozen:
    warm = 0; kw.update(freeze_when_stable=1, seed_average=False)
  alg = prfl.algorithms.momentum_clustering(
      prfl.data.regression_loss, optax.sgd(lr / alpha), num_clusters=K,
      radius=prfl.quantile_radius(q), alpha=alpha, method="gram",
      true_clusters=truth, warmup_rounds=warm, **kw)
  def init(_):
    s = alg.init(jnp.zeros((n, 10)))
    if truth_frozen:  # Seeded (round 1) at the truth, already still.
      s = s._replace(assignment=jnp.asarray(truth, jnp.int32), round=jnp.ones((), jnp.int32),
                     still=jnp.full((), 10, jnp.int32),
                     # Distinct carried centres: coinciding ones are merged
                     # by Threshold-Clustering whatever `members` says.
                     centers=1e-3 * jnp.arange(1.0, K + 1)[:, None] * jnp.ones((K, 10)))
    return s
  state = jax.vmap(init)(jnp.arange(len(seeds)))
  step = jax.jit(jax.vmap(alg.step))
  keys = jnp.stack([jax.random.key_data(jax.random.key(s + 1)) for s in seeds])
  keys = jax.random.wrap_key_data(keys)
  hist = {k: [] for k in ("ari", "moved", "frozen", "sep_ari", "sep_spread", "sep_delta", "num_active_clusters")}
  for t in range(rounds):
    ks = jax.vmap(jax.random.split)(keys); keys, sub = ks[:, 0], ks[:, 1]
    state, m = step(state, train, sub)
    for k in hist: hist[k].append(np.asarray(m[k]))
  hist = {k: np.stack(v, 1) for k, v in hist.items()}  # [S, T]
  err = np.asarray(jnp.mean(jnp.linalg.norm(state.params - xstar, axis=-1), -1))
  sizes = [np.bincount(np.asarray(state.assignment[i]), minlength=K).tolist() for i in range(len(seeds))]
  return hist, err, sizes

if __name__ == "__main__":
  kw = ast.literal_eval(sys.argv[1]) if len(sys.argv) > 1 else {}
  opts = ast.literal_eval(sys.argv[2]) if len(sys.argv) > 2 else {}
  t0 = time.time()
  hist, err, sizes = simulate(kw, **opts)
  ts = (0, 4, 5, 6, 10, 20, 50, 100, 200, 299)
  for i, s in enumerate(SEEDS):
    fr = hist["frozen"][i]
    print(json.dumps(dict(seed=s, err=round(float(err[i]), 3), ari_tail=round(float(hist["ari"][i, -30:].mean()), 2),
      moved_tail=round(float(hist["moved"][i, -30:].mean()), 1), frozen_from=int(np.argmax(fr > 0)) if fr.any() else None,
      sizes=sizes[i], sep_ari={t: round(float(hist["sep_ari"][i, t]), 2) for t in ts},
      ratio={t: round(float(hist["sep_spread"][i, t] / hist["sep_delta"][i, t]), 2) for t in ts},
      ari={t: round(float(hist["ari"][i, t]), 2) for t in ts})))
  print("median err", round(float(np.median(err)), 3), "mean", round(float(err.mean()), 3), "s", round(time.time() - t0))
