"""Probe (session 9): 100 rounds of own-momentum steps, no clustering.

Momentum-Clustering with warmup_rounds=99 on the synthetic federation,
seeds 0-4 at once (probe2.simulate); for every round, the ARI of assigning
every client's momentum to the nearest true-cluster mean. Prints per seed:
that ARI at round 0, its maximum over the rounds and where, and at rounds
1, 2, 4, 9, 19, 49, 99 ("at"); sigma / Delta at round 0 and its minimum.
Output: own.out. Run from this folder: `python own.py` (the package
installed or on PYTHONPATH).
"""
import json, numpy as np
from probe2 import simulate
from sklearn.metrics import adjusted_rand_score as ari
seeds = [0, 1, 2, 3, 4]
for lr in (0.004,):
  recs, truth = simulate(seeds, rounds=100, warm=99, lr=lr)
  for i, s in enumerate(seeds):
    a = [ari(truth, recs["nearest"][i, t]) for t in range(100)]
    r = recs["spread"][i].max(1) / recs["mudmin"][i]
    print(json.dumps(dict(lr=lr, seed=s, oracle_ari_t0=round(a[0], 2), max=round(max(a), 2), argmax=int(np.argmax(a)),
      at=[round(a[t], 2) for t in (1, 2, 4, 9, 19, 49, 99)], ratio_t0=round(float(r[0]), 2), ratio_min=round(float(r.min()), 2),
      err_end=round(float(recs["err"][i, -1]), 3))))
