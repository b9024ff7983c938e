"""MC on the synthetic federation, seeds vmapped, rounds scanned.

Records per round: the library's metrics, plus the momenta's geometry
against the true clusters (rms within-cluster spread, min distance between
true-cluster mean momenta, and the label of the nearest true-cluster mean
for every client: nearest-centre assignment with the *true* centres).
"""
import sys, json
import jax, jax.numpy as jnp, numpy as np, optax
import prfl_jax as prfl
from sklearn.metrics import adjusted_rand_score as ari

K, NPC = 4, 25

def make(seed):
  data, xs = prfl.data.synthetic_regression(jax.random.key(seed), num_clusters=K, clients_per_cluster=NPC)
  return data

def simulate(seeds, rounds=300, warm=5, q=0.95, lr=0.004, mom=0.9, kw=None):
  datas = [make(s) for s in seeds]
  truth = np.asarray(datas[0].clusters); n = len(truth)
  train = jax.tree.map(lambda *x: jnp.stack(x), *[d.train for d in datas])
  xstar = jnp.stack([d.test["x_star"] for d in datas])
  alpha = 1 - mom
  kw = dict(kw or {})
  alg = prfl.algorithms.momentum_clustering(
      prfl.data.regression_loss, optax.sgd(lr / alpha), num_clusters=K,
      radius=prfl.quantile_radius(q), alpha=alpha, method="gram",
      true_clusters=truth, warmup_rounds=warm, **kw)
  onehot = jax.nn.one_hot(jnp.asarray(truth), K)  # [N, K]
  def one(tr, xst, key):
    state = alg.init(jnp.zeros((n, 10)))
    def body(carry, k):
      state = carry
      state, m = alg.step(state, tr, k)
      M = state.momentum
      mu = (onehot.T @ M) / NPC  # [K, d]
      within = jnp.sqrt(jnp.sum((M - mu[truth]) ** 2, 1))  # [N]
      spread = jnp.sqrt(jax.ops.segment_sum(within ** 2, truth, K) / NPC)
      dmu = jnp.sqrt(jnp.sum((mu[:, None] - mu[None]) ** 2, -1)) + 1e9 * jnp.eye(K)
      dcl = jnp.sum((M[:, None] - mu[None]) ** 2, -1)
      err = jnp.mean(jnp.linalg.norm(state.params - xst, axis=1))
      rec = dict(ari=m["ari"], moved=m["moved"], frozen=m["frozen"],
                 cmin=m.get("center_dist_min", jnp.nan),
                 spread=spread, mudmin=jnp.min(dmu), nearest=jnp.argmin(dcl, 1),
                 assign=state.assignment, err=err,
                 mnorm=jnp.sqrt(jnp.sum(M**2, 1)))
      return state, rec
    keys = jax.random.split(key, rounds)
    _, recs = jax.lax.scan(body, state, keys)
    return recs
  keys = jnp.stack([jax.random.key_data(jax.random.key(s + 1)) for s in seeds])
  recs = jax.jit(jax.vmap(lambda tr, x, kd: one(tr, x, jax.random.wrap_key_data(kd))))(train, xstar, keys)
  return jax.tree.map(np.asarray, recs), truth

def summary(recs, truth, seeds, ts=(0, 4, 5, 6, 10, 20, 50, 100, 200, 299)):
  rows = []
  for i, s in enumerate(seeds):
    tail = slice(-30, None)
    rows.append(dict(seed=s, err=round(float(recs["err"][i, -1]), 3),
        ari_tail=round(float(recs["ari"][i, tail].mean()), 2),
        moved_tail=round(float(recs["moved"][i, tail].mean()), 1),
        frozen_from=int(np.argmax(recs["frozen"][i] > 0)) if recs["frozen"][i].any() else None,
        sizes_end=np.bincount(recs["assign"][i, -1], minlength=K).tolist(),
        oracle_ari={t: round(ari(truth, recs["nearest"][i, t]), 2) for t in ts},
        ratio={t: round(float(recs["spread"][i, t].max() / recs["mudmin"][i, t]), 2) for t in ts},
        ari={t: round(float(recs["ari"][i, t]), 2) for t in ts}))
  return rows

if __name__ == "__main__":
  import ast
  seeds = [0, 1, 2, 3, 4]
  kw = ast.literal_eval(sys.argv[1]) if len(sys.argv) > 1 else {}
  opts = ast.literal_eval(sys.argv[2]) if len(sys.argv) > 2 else {}
  recs, truth = simulate(seeds, kw=kw, **opts)
  rows = summary(recs, truth, seeds)
  for r in rows: print(json.dumps(r))
  print("median err", np.median([r["err"] for r in rows]))
