"""Tests of Federated-Clustering's cluster-aware groups (`fc_groups`)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax.algorithms import fc_groups
from prfl_jax.algorithms.federated_clustering import random_groups


def clustered_models(key, num_clusters=4, per_cluster=30, dim=20,
                     spread=0.1):
  """Models of K well-separated clusters (client i in cluster i // n)."""
  c_key, n_key = jax.random.split(key)
  centres = 10.0 * jax.random.normal(c_key, (num_clusters, dim))
  clusters = np.repeat(np.arange(num_clusters), per_cluster)
  models = centres[clusters] + spread * jax.random.normal(
      n_key, (len(clusters), dim))
  return {"w": models}, clusters


def members(groups):
  """List of the sorted real clients of every group."""
  index, weight = np.asarray(groups.index), np.asarray(groups.weight)
  return [sorted(index[g][weight[g] > 0].tolist()) for g in range(len(index))]


@pytest.mark.parametrize("n,g,share", [(120, 16, 0.25), (7, 3, 0.5),
                                       (120, 4, 0.0), (30, 5, 1.0)])
def test_every_client_in_exactly_one_group(n, g, share):
  """The groups partition the clients; `slot` points back at each client.

  Seen to fail when the random slots read `perm[ri]` past the drawn share
  (a client appeared in two groups).
  """
  params, _ = clustered_models(jax.random.key(0), 4, n // 4 + 1)
  params = jax.tree.map(lambda x: x[:n], params)
  rule = fc_groups.cluster_aware(start_round=0, random_share=share)
  groups = jax.jit(lambda *a: rule(*a), static_argnums=2)(
      jax.random.key(1), params, g, jnp.int32(3))
  flat = sum(members(groups), [])
  assert sorted(flat) == list(range(n))
  np.testing.assert_array_equal(
      np.asarray(groups.index).ravel()[np.asarray(groups.slot)], np.arange(n))


def test_random_share_kept_and_independent_of_the_models():
  """r = round(0.25 * 30) = 8 slots of each of 4 groups come from the key's
  permutation alone: the same key with other models fills them alike.

  Seen to fail when the random slots were taken from the chain order.
  """
  n, g = 120, 4
  rule = fc_groups.cluster_aware(start_round=0, random_share=0.25)
  assert rule.random_slots(n, g) == 8
  p1, _ = clustered_models(jax.random.key(0), per_cluster=30)
  p2, _ = clustered_models(jax.random.key(5), per_cluster=30)
  key = jax.random.key(2)
  a, b = rule(key, p1, g, 1), rule(key, p2, g, 1)
  perm = np.asarray(jax.random.permutation(jax.random.split(key)[0], n))
  for groups in (a, b):
    random_part = np.asarray(groups.index)[:, -8:]
    np.testing.assert_array_equal(random_part.ravel(), perm[:32])
  assert not np.array_equal(np.asarray(a.index), np.asarray(b.index))


def test_uniform_before_start_round():
  rule = fc_groups.cluster_aware(start_round=5, random_share=0.25)
  params, clusters = clustered_models(jax.random.key(0))
  groups = rule(jax.random.key(3), params, 8, jnp.int32(4))
  assert purity(groups, clusters) < 0.5  # Random groups of 4 clusters.
  groups = rule(jax.random.key(3), params, 8, jnp.int32(5))
  assert purity(groups, clusters) > 0.55


def purity(groups, clusters):
  """Mean share of a client's group (itself included) from its cluster."""
  shares = []
  for m in members(groups):
    c = clusters[m]
    shares += [np.mean(c == ci) for ci in c]
  return float(np.mean(shares))


def test_groups_follow_the_clusters():
  """120 clients in 4 tight clusters, 8 groups of 15.

  Without a random share the groups are runs of the chain, one cluster each
  (30 = 2 x 15): purity 1. With 4 random slots, the 11 similarity slots come
  from one cluster except where the chain changes cluster, and the random
  members mostly sit in another cluster's group: a chain member's share is
  about (11 + 1) / 15 = 0.8, a random member's about (1 + 1) / 15, 0.6 on
  average, still far above uniform groups' 0.29 (1/4 plus the client itself).

  Seen to fail when the chain ignored the distances (a random order).
  """
  params, clusters = clustered_models(jax.random.key(0))
  uniform = [purity(random_groups(jax.random.key(s), 120, 8), clusters)
             for s in range(5)]
  for share, low in ((0.0, 0.95), (0.25, 0.55)):
    rule = fc_groups.cluster_aware(start_round=0, random_share=share)
    values = [purity(rule(jax.random.key(s), params, 8, 1), clusters)
              for s in range(5)]
    assert np.mean(values) > low
  assert np.mean(uniform) < 0.35


def test_mix_groups_shuffles_partners_within_a_block():
  """4 clusters of 6 in 4 groups, no random share (unmixed, the groups are
  the clusters: test_groups_follow_the_clusters): with mix_groups=2 the
  groups 0-1 (and 2-3) hold two whole clusters between them, each group a
  random part of both. Seen to fail with the shuffle taken over the whole
  chain (blocks of all groups) and with it dropped."""
  params, clusters = clustered_models(jax.random.key(0), 4, 6)
  group = jax.jit(lambda key: fc_groups.cluster_aware(
      start_round=0, random_share=0.0, mix_groups=2)(
          key, params, 4, jnp.int32(1)))
  for seed in range(3):
    mixed = members(group(jax.random.key(seed)))
    for pair in (mixed[:2], mixed[2:]):
      both = np.bincount(clusters[pair[0] + pair[1]], minlength=4)
      assert sorted(both.tolist()) == [0, 0, 6, 6]
    assert all(len(set(clusters[m].tolist())) == 2 for m in mixed)


def test_sketch_is_a_linear_projection_that_keeps_squared_distances():
  """Three models (a 10 x 3 leaf and a 5-vector leaf: 35 coordinates), the
  first all zero, projected to 2,048 coordinates: the zero model's sketch
  is exactly 0 (a linear map of the models), and the squared distance of
  the other two sketches is theirs within 10% (Johnson-Lindenstrauss:
  `E ||s_i - s_j||^2 = ||x_i - x_j||^2`, relative standard deviation
  sqrt(2 / 2048) = 3% here). Seen to fail with `out * sqrt(dim)` for
  `out / sqrt(dim)` (session 15's sampled survivor algorithms #491:
  distances 2048^2 times too large; the grouping reads only the order of
  the distances, which that keeps) and with the sum started at 1 (#489 at
  9158dc9, a sampled survivor too: every sketch shifted by 1 / sqrt(dim)). A
  sign flip of every sketch (#490, `out + ...` -> `out - ...`) keeps
  both, and the grouping's distances bit for bit: equivalent."""
  rng = np.random.default_rng(0)
  params = {"a": jnp.asarray(rng.normal(size=(3, 10, 3)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)}
  params = jax.tree.map(lambda x: x.at[0].set(0.0), params)
  s = jax.jit(fc_groups.sketch, static_argnums=2)(params, jax.random.key(0),
                                                  2048)
  assert s.shape == (3, 2048)
  np.testing.assert_array_equal(s[0], 0.0)
  flat = np.concatenate([np.asarray(x).reshape(3, -1)
                         for x in jax.tree.leaves(params)], axis=1)
  want = np.sum((flat[1] - flat[2]) ** 2)
  got = np.sum(np.square(np.asarray(s[1]) - np.asarray(s[2])))
  np.testing.assert_allclose(got, want, rtol=0.1)


def test_nearest_neighbour_chain_by_hand():
  """Points 0, 10, 1, 11 on a line: 0 -> 1 -> 10 -> 11."""
  x = jnp.array([0.0, 10.0, 1.0, 11.0])
  order = fc_groups.nearest_neighbour_chain((x[:, None] - x[None]) ** 2)
  np.testing.assert_array_equal(order, [0, 2, 1, 3])


def test_nearest_neighbour_chain_steps_from_the_point_it_reached():
  """Points 0, 1, 5, 6, -4 on a line: 0 -> 1 -> 5 -> 6 -> -4 (from 1, 5 is
  nearer than -4; from 0 it would not be). Seen to fail when each step
  starts from the point before the last (session 15's sampled survivor
  algorithms #494, `order[t - 1]` -> `order[t - 2]`: 0 -> 1 -> -4) and
  from the unset slot after it (census survivor algorithms #493 at
  9158dc9, `order[t + 1]`: always from point 0, 0 -> 1 -> -4); in the case
  above both starts reach the same points."""
  x = jnp.array([0.0, 1.0, 5.0, 6.0, -4.0])
  order = jax.jit(fc_groups.nearest_neighbour_chain)(
      (x[:, None] - x[None]) ** 2)
  np.testing.assert_array_equal(order, [0, 1, 2, 3, 4])


def test_nearest_neighbour_chain_visits_a_point_only_nan_reaches():
  """Point 2's distances are all NaN (+inf): the chain 0 -> 1 has only
  infinite distances left and takes the first unvisited point, 2, so the
  order stays a permutation. Seen to fail with the first visited point
  taken instead (session 15's sampled survivor algorithms #498,
  `argmin(visited)` -> `argmax(visited)`: 0 -> 1 -> 0); no test had a
  non-finite distance."""
  sq = jnp.array([[0.0, 1.0, jnp.nan], [1.0, 0.0, jnp.nan],
                  [jnp.nan, jnp.nan, 0.0]])
  order = jax.jit(fc_groups.nearest_neighbour_chain)(sq)
  np.testing.assert_array_equal(order, [0, 1, 2])


def test_from_slots_points_padding_at_client_zero():
  """Five clients in two groups of three: the padding slot (its table entry
  7 is ignored) points at client 0 with weight 0, as `Groups` documents
  for both group builders, and `slot` points back at every client. Seen
  to fail when padding points at client 1 (session 12's sampled survivor
  algorithms #422: the other tests read padding only through its weight)."""
  index = jnp.array([[3, 1, 7], [0, 4, 2]])
  valid = jnp.array([[True, True, False], [True, True, True]])
  groups = jax.jit(fc_groups.from_slots, static_argnums=2)(index, valid, 5)
  np.testing.assert_array_equal(groups.index, [[3, 1, 0], [0, 4, 2]])
  np.testing.assert_array_equal(groups.weight, [[1, 1, 0], [1, 1, 1]])
  np.testing.assert_array_equal(groups.slot, [3, 1, 5, 0, 4])


def exposure(groups, byzantine):
  """(share of benign clients with a Byzantine group mate, mean Byzantine
  share of a benign client's group)."""
  hit, share = [], []
  for m in members(groups):
    b = byzantine[m]
    for i, bi in zip(m, b):
      if not bi:
        hit.append(b.any())
        share.append(b.mean())
  return np.mean(hit), np.mean(share)


def test_attacker_between_the_clusters_reaches_fewer_groups():
  """12 of 120 clients are Byzantine and place their models at the mean of
  the honest models, to be close to every cluster (and so stay in every
  group). Under cluster-aware groups (16 groups of 8, 2 random slots) they
  meet fewer benign clients than under uniform groups, and their mean share
  of a benign client's group is no larger.

  Seen to fail when the chain's similarity slots were dealt round-robin
  over the groups (the attackers then sat in every group).
  """
  params, _ = clustered_models(jax.random.key(0))
  byzantine = np.zeros(120, bool)
  byzantine[::10] = True
  honest_mean = params["w"][~byzantine].mean(0)
  attacked = {"w": params["w"].at[byzantine].set(honest_mean)}
  rule = fc_groups.cluster_aware(start_round=0, random_share=0.25)
  aware = np.array([exposure(rule(jax.random.key(s), attacked, 16, 1),
                             byzantine) for s in range(20)])
  uniform = np.array([exposure(random_groups(jax.random.key(s), 120, 16),
                               byzantine) for s in range(20)])
  assert aware[:, 0].mean() < uniform[:, 0].mean()
  assert aware[:, 1].mean() <= uniform[:, 1].mean() + 0.01


def test_federated_clustering_with_cluster_aware_groups_runs_jitted():
  """Two clusters of quadratic clients; after the first (uniform) round the
  groups follow the models, and every client still steps once per round.

  From round 1 on the aware `quantile=1.0` ball takes the whole group
  (ball fraction 1), which leads every client near its target only if its
  group is its cluster (targets spread by 0.1 inside a cluster, so a
  0.5-quantile ball holds about half of a group); the uniform round 0 keeps
  FC's 0.5-quantile ball. Seen to fail with the radius switch taken out of
  `clustered_update` (0.5 from round 1 on) and with `<` turned into `<=` in
  `ClusterAware.radius` (0.5 in round 1).
  """
  n = 12
  i = jnp.arange(n)
  targets = (jnp.where(i < 6, -5.0, 5.0) + 0.1 * (i % 6 - 2.5))[:, None]
  loss = lambda x, b: 0.5 * jnp.mean((x[0] - b) ** 2)
  alg = prfl.algorithms.federated_clustering(
      loss, optax.sgd(0.5), radius=prfl.quantile_radius(0.5), num_iters=5,
      num_groups=2, grouping=fc_groups.cluster_aware(
          start_round=1, random_share=0.0, sketch_dim=1, quantile=1.0))
  state = alg.init(jnp.zeros((n, 1)))
  step = jax.jit(alg.step)
  fractions = []
  for r in range(6):
    state, metrics = step(state, targets, jax.random.key(r))
    fractions.append(float(metrics["ball_fraction"]))
  np.testing.assert_allclose(state.params[:, 0], targets[:, 0], atol=0.5)
  assert fractions[0] < 0.8
  assert fractions[1:] == [1.0] * 5


def test_aware_quantile_needs_a_quantile_radius():
  with pytest.raises(ValueError, match="quantile_radius"):
    prfl.algorithms.federated_clustering(
        lambda x, b: jnp.sum(x), optax.sgd(0.1), radius=1.0,
        grouping=fc_groups.cluster_aware(quantile=0.5))


@pytest.mark.parametrize("kwargs", [{"start_round": -1},
                                    {"random_share": 1.5},
                                    {"random_share": True},
                                    {"sketch_dim": 0}, {"mix_groups": 0},
                                    {"quantile": 0.0},
                                    {"quantile": 1.5}, {"quantile": True}])
def test_bad_arguments(kwargs):
  with pytest.raises(ValueError, match=list(kwargs)[0]):
    fc_groups.cluster_aware(**kwargs)


def test_grouping_must_be_callable():
  with pytest.raises(TypeError, match="grouping"):
    prfl.algorithms.federated_clustering(
        lambda x, b: jnp.sum(x), optax.sgd(0.1), radius=1.0,
        grouping="aware")


def test_registry_fc_aware_passes_the_cluster_aware_rule(monkeypatch):
  """The experiments' `fc_aware` is FC with `cluster_aware()` groups and
  `fc` keeps uniform groups (grouping None).

  Seen to fail when `fc_aware` was registered without its `fc_grouping`
  default (both built uniform groups), and with `aware_quantile` or
  `aware_random_share` not passed on to `cluster_aware`.
  """
  from experiments import groups as option_groups
  from experiments import registry
  seen = []
  monkeypatch.setattr(prfl.algorithms, "federated_clustering",
                      lambda *a, **k: seen.append(k["grouping"]))
  ctx = registry.Context(lambda x, b: jnp.sum(x), np.arange(4) % 2, 2,
                         jax.random.key(0))
  for name in ("fc_aware", "fc"):
    registry.build(name, ctx, registry.settings(option_groups.Optim(), name))
  assert isinstance(seen[0], fc_groups.ClusterAware) and seen[1] is None
  assert seen[0] == fc_groups.cluster_aware()  # The library's defaults.
  registry.build("fc_aware", ctx, registry.settings(option_groups.Clustering(
      aware_quantile=0.45, aware_random_share=0.1), "fc_aware"))
  assert (seen[2].quantile, seen[2].random_share) == (0.45, 0.1)
