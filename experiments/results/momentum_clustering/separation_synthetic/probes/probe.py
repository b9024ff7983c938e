"""Probe (session 9): the default on the synthetic federation, one seed,
with per-true-cluster spreads of the momenta (`python probe.py 0`;
probe.out: rounds 0, 5 and 299 of its output). The seeding key differs
from the driver's, hence other errors than separation_synthetic/s0."""
import sys, json
import jax, jax.numpy as jnp, numpy as np, optax
import prfl_jax as prfl
from sklearn.metrics import adjusted_rand_score as ari

def run(seed, rounds=300, warm=5, q=0.95, lr=0.004, mom=0.9, kw=None, log=()):
  key = jax.random.key(seed)
  data, xs = prfl.data.synthetic_regression(key, num_clusters=4, clients_per_cluster=25)
  truth = np.asarray(data.clusters); n = len(truth)
  alpha = 1 - mom
  kw = dict(kw or {})
  alg = prfl.algorithms.momentum_clustering(
      prfl.data.regression_loss, optax.sgd(lr / alpha), num_clusters=4,
      radius=prfl.quantile_radius(q), alpha=alpha, method="gram",
      true_clusters=truth, warmup_rounds=warm, **kw)
  state = alg.init(jnp.zeros((n, 10)))
  step = jax.jit(alg.step)
  k = jax.random.key(seed + 1)
  out = []
  for t in range(rounds):
    k, sk = jax.random.split(k)
    state, m = step(state, data.train, sk)
    if t in log or t == rounds - 1:
      M = np.asarray(state.momentum); C = np.asarray(state.centers); a = np.asarray(state.assignment)
      X = np.asarray(state.params)
      mu = np.stack([M[truth == c].mean(0) for c in range(4)])
      spread = [float(np.sqrt(((M[truth == c] - mu[c])**2).sum(1).mean())) for c in range(4)]
      dmu = np.sqrt(((mu[:, None] - mu[None])**2).sum(-1))
      err = float(np.linalg.norm(X - np.asarray(data.test["x_star"]), axis=1).mean())
      out.append(dict(t=t, ari=float(m["ari"]), moved=float(m["moved"]), frozen=float(m["frozen"]),
                      sizes=np.bincount(a, minlength=4).tolist(), err=round(err, 3),
                      spread=np.round(spread, 3).tolist(),
                      mu_dist_min=float(np.min(dmu[np.triu_indices(4, 1)])),
                      mu_norm=np.round(np.linalg.norm(mu, axis=1), 3).tolist()))
  return out

if __name__ == "__main__":
  seed = int(sys.argv[1]); warm = int(sys.argv[2]) if len(sys.argv) > 2 else 5
  for r in run(seed, warm=warm, log=(0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 15, 20, 30, 50, 100, 200)):
    print(json.dumps(r))
