"""Tests of Clustered FL: the exact bi-partition and hand-computed rounds."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prfl_jax import attacks
from prfl_jax.algorithms.cfl import bipartition
from prfl_jax.algorithms.cfl import cfl
from tests.toy import linreg_federation


def quadratic(x, batch):
  """Mean of 0.5 ||x - c||^2 over the client's targets c (batch `[B, d]`)."""
  return 0.5 * jnp.mean(jnp.sum((x - batch) ** 2, axis=-1))


def brute_force(sim, members):
  idx = np.flatnonzero(members)
  best = np.inf
  for r in range(1, len(idx)):
    for c1 in itertools.combinations(idx, r):
      c2 = [i for i in idx if i not in c1]
      best = min(best, sim[np.ix_(list(c1), c2)].max())
  return best


def test_bipartition_is_optimal():
  rng = np.random.default_rng(0)
  for _ in range(20):
    x = rng.normal(size=(6, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sim = x @ x.T
    members = rng.random(6) < 0.8
    if members.sum() < 2:
      continue
    second, cross = jax.jit(bipartition)(jnp.asarray(sim, jnp.float32),
                                jnp.asarray(members))
    second = np.asarray(second)
    c1 = np.flatnonzero(members & ~second)
    c2 = np.flatnonzero(second)
    assert len(c1) and len(c2) and not np.any(second & ~members)
    best = brute_force(sim, members)
    np.testing.assert_allclose(sim[np.ix_(c1, c2)].max(), best, atol=1e-5)
    np.testing.assert_allclose(cross, best, atol=1e-5)



def test_bipartition_on_tied_similarities_splits_off_the_first_member_alone():
  """Mutually orthogonal members (similarity 0 between every pair): every
  bipartition has cross-similarity 0 and is optimal, so the split is Prim's
  tie rule. A vertex keeps the tree edge found first (a later vertex of
  equal similarity does not take it over): every member hangs off the
  root, and the weakest edge (the first of the ties) cuts off the first
  non-root member alone: {1} of members 0-3, {2} of members 0, 2, 3.
  Pinned so that a run on tied updates (clients at their optimum send 0,
  of cosine 0 to everyone) splits the same way every time. Seen to fail
  with `similarity[j] >= c.best` (census survivor algorithms #243 at
  9158dc9: a chain 0-1-2-3, the cut moves {1, 2, 3} and {2, 3}, also of
  cross-similarity 0); `test_bipartition_is_optimal` checks only the
  cross-similarity, equal for every optimal split."""
  split = jax.jit(bipartition)
  for members, moved in (([1, 1, 1, 1], [0, 1, 0, 0]),
                         ([1, 0, 1, 1], [0, 0, 1, 0])):
    second, cross = split(jnp.eye(4), jnp.asarray(members, bool))
    np.testing.assert_array_equal(second, np.asarray(moved, bool))
    assert float(cross) == 0.0

TARGETS = np.array([[1.0, 0.0], [1.0, 0.2], [-1.0, 0.0], [-1.0, -0.2],
                    [0.0, 0.0]])


def test_two_rounds_match_numpy():
  eta = 0.5
  alg = cfl(quadratic, optax.sgd(eta), eps1=0.1, eps2=0.3, max_clusters=4)
  state = alg.init(jnp.zeros((5, 2)))
  batch = jnp.asarray(TARGETS)[:, None, :]
  # Round 1: the FedAvg mean update is 0 (stationary) and the updates are
  # large, so the cluster splits by cosine similarity; client 4 (update 0,
  # similarity 0 to everyone) joins one side.
  step = jax.jit(alg.step)
  state, metrics = step(state, batch, jax.random.PRNGKey(0))
  c = np.asarray(state.clusters)
  assert c[0] == c[1] and c[2] == c[3] and c[0] != c[2]
  assert int(state.num_clusters) == 2 and metrics["split"] == 1
  x = np.zeros((5, 2))
  updates = eta * (TARGETS - x)
  new = x.copy()
  for k in set(c.tolist()):
    new[c == k] += updates[c == k].mean(0)
  np.testing.assert_allclose(state.params, new, rtol=1e-6, atol=1e-7)
  # Round 2: the clusters are no longer stationary: plain FedAvg per cluster.
  state, metrics = step(state, batch, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(state.clusters, c)
  x, updates = new, eta * (TARGETS - new)
  for k in set(c.tolist()):
    new[c == k] = x[c == k] + updates[c == k].mean(0)
  np.testing.assert_allclose(state.params, new, rtol=1e-6, atol=1e-7)
  assert metrics["split"] == 0


def test_split_conditions():
  batch = jnp.asarray(TARGETS)[:, None, :]
  params = jnp.zeros((5, 2))
  for kwargs in ({"warmup_rounds": 1}, {"max_clusters": 1},
                 {"min_split_size": 6}, {"eps1": 0.0}, {"eps2": 10.0}):
    args = {"eps1": 0.1, "eps2": 0.3, "max_clusters": 4}
    args.update(kwargs)
    alg = cfl(quadratic, optax.sgd(0.5), **args)
    state, _ = jax.jit(alg.step)(alg.init(params), batch,
                                 jax.random.PRNGKey(0))
    assert int(state.num_clusters) == 1, kwargs
    np.testing.assert_array_equal(state.clusters, 0)


def test_no_split_when_the_largest_update_norm_equals_eps2():
  """Targets (s, 0) twice, (-s, 0) twice and 0, SGD 0.5 from 0: updates of
  norm s / 2 (and 0), mean 0, eps2 = 1. The split needs a norm above eps2:
  none at s = 2 (norms exactly 1), two clusters at s = 4. Seen to fail with
  `max_norms >= eps2` (session 15's sampled survivor algorithms #267: a
  split at s = 2); no test had an update norm equal to eps2."""
  alg = cfl(quadratic, optax.sgd(0.5), eps1=0.1, eps2=1.0, max_clusters=4)
  step = jax.jit(alg.step)
  for s, count in ((2.0, 1), (4.0, 2)):
    batch = jnp.array([[s, 0.0], [s, 0.0], [-s, 0.0], [-s, 0.0],
                       [0.0, 0.0]])[:, None, :]
    state, _ = step(alg.init(jnp.zeros((5, 2))), batch, jax.random.PRNGKey(0))
    assert int(state.num_clusters) == count, s



def test_a_cluster_of_exactly_min_split_size_clients_splits():
  """Two clients, targets (1, 0) and (-1, 0), SGD 0.5 from 0: updates
  (0.5, 0) and (-0.5, 0), mean 0 < eps1, norms 0.5 > eps2. With
  min_split_size=2 (the smallest allowed) the cluster of 2 splits: each
  client alone, its params its own update. Seen to fail with
  `sizes > min_split_size` (census survivor algorithms #265 at 9158dc9: no
  split, both params at the mean 0) and with the bound `minimum=3` (#260:
  min_split_size=2 refused); the tests above used the default 3 with 5
  clients, or 6 (`test_split_conditions`: no split)."""
  alg = cfl(quadratic, optax.sgd(0.5), eps1=0.1, eps2=0.3, max_clusters=2,
            min_split_size=2)
  state, _ = jax.jit(alg.step)(alg.init(jnp.zeros((2, 2))),
                               jnp.array([[[1.0, 0.0]], [[-1.0, 0.0]]]),
                               jax.random.PRNGKey(0))
  assert int(state.num_clusters) == 2
  np.testing.assert_array_equal(state.clusters, [0, 1])
  np.testing.assert_allclose(state.params, [[0.5, 0.0], [-0.5, 0.0]])


def test_warmup_counts_the_rounds_done():
  """`warmup_rounds=2` on the stationary federation of
  `test_two_rounds_match_numpy` (its mean update is 0, so the parameters
  and the split conditions stay as they are): no split in rounds 1 and 2,
  the split in round 3, and `round` counts one per step. Seen to fail when
  a step adds 2 to `round` (session 10's mutant #283 of `--preset
  algorithms`: the split comes in round 2)."""
  alg = cfl(quadratic, optax.sgd(0.5), eps1=0.1, eps2=0.3, max_clusters=4,
            warmup_rounds=2)
  state = alg.init(jnp.zeros((5, 2)))
  batch = jnp.asarray(TARGETS)[:, None, :]
  step = jax.jit(alg.step)
  for r in range(3):
    state, metrics = step(state, batch, jax.random.PRNGKey(r))
    assert int(state.round) == r + 1
    assert int(metrics["split"]) == (r == 2), r

def test_local_steps_update():
  eta, steps = 0.25, 2
  alg = cfl(quadratic, optax.sgd(eta), eps1=0.0, eps2=0.0, max_clusters=2,
            local_steps=steps)
  targets = np.array([[1.0], [3.0]])
  batch = jnp.asarray(np.stack([targets, targets + 1], axis=1))  # [2, 2, 1]
  state, _ = alg.step(alg.init(jnp.zeros((2, 1))), batch,
                      jax.random.PRNGKey(0))
  local = np.zeros((2, 1))
  for s in range(steps):
    local -= eta * (local - (targets + s))
  np.testing.assert_allclose(state.params, np.broadcast_to(local.mean(0),
                                                           (2, 1)), rtol=1e-6)


def test_jit_linear_regression():
  loss, batch, params = linreg_federation(jax.random.PRNGKey(0))
  byz = jnp.array([False] * 5 + [True])
  alg = cfl(loss, optax.sgd(0.05), eps1=10.0, eps2=0.0, max_clusters=4,
            attack=attacks.gaussian(1.0))
  state = alg.init(params, byzantine=byz)
  step = jax.jit(alg.step)
  for r in range(3):
    state, metrics = step(state, batch, jax.random.PRNGKey(r))
  assert state.params.shape == (6, 4) and state.clusters.shape == (6,)
  assert 1 <= int(state.num_clusters) <= 4
  assert int(state.clusters.max()) < int(state.num_clusters)
  assert np.all(np.isfinite(np.asarray(state.params)))
  assert all(np.isfinite(v) for v in jax.device_get(metrics).values())


@pytest.mark.parametrize("kwargs, match", [
    ({"eps1": -1.0}, "eps1"),
    ({"eps2": float("inf")}, "eps2"),
    ({"max_clusters": 0}, "max_clusters"),
    ({"local_steps": 0}, "local_steps"),
    ({"min_split_size": 1}, "min_split_size"),
    ({"warmup_rounds": -1}, "warmup_rounds"),
])
def test_bad_arguments(kwargs, match):
  args = {"eps1": 0.1, "eps2": 0.3, "max_clusters": 4}
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    cfl(quadratic, optax.sgd(0.1), **args)
  with pytest.raises(TypeError, match="optimizer"):
    cfl(quadratic, optax.sgd, eps1=0.1, eps2=0.3, max_clusters=4)
