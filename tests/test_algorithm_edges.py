"""Edges and wiring of the algorithms that every test passed through when
changed (issue 21's mutation audit), each against a small hand-computed case.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import prfl_jax as prfl
from prfl_jax.algorithms import cluster_models
from prfl_jax.algorithms.ditto import ditto
from prfl_jax.algorithms.ifca import ifca
from prfl_jax.algorithms.ifca import init_cluster_models
from prfl_jax.algorithms.knn_per import knn_per_evaluate
from prfl_jax.algorithms.momentum_clustering import dead_centers
from prfl_jax.algorithms.myopic_clustering import myopic_clustering
from tests.test_momentum_clustering import C
from tests.test_momentum_clustering import PAPER
from tests.test_momentum_clustering import shifted_quadratic
from tests.toy import quadratic

KEY = jax.random.key(0)


def test_cosine_similarity_of_short_vectors():
  """CFL's similarity of updates shorter than 1 (small learning rates):
  [0.1, 0], [0, 0.1], [0.1, 0.1] and a zero row give 1 on the diagonal,
  0 and 1/sqrt(2) off it, 0 for the zero row. Seen to fail with the norms
  floored at 1 (`maximum(diag, 1.0)`: 0.01 on the diagonal), a change every
  CFL test let through (their updates are longer than 1)."""
  points = {"w": jnp.array([[0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [0.0, 0.0]])}
  r = 1.0 / np.sqrt(2.0)
  np.testing.assert_allclose(
      cluster_models.cosine_similarity(points),
      [[1, 0, r, 0], [0, 1, r, 0], [r, r, 1, 0], [0, 0, 0, 0]], atol=1e-6)


def test_cosine_similarity_is_zero_where_a_norm_underflows():
  """(1e-23, 0) has squared norm 1e-46, below float32's smallest number:
  its norm is 0, so its similarity to (1e10, 0) is 0 exactly, although
  their product is 1e-13. Seen to fail with `denom >= 0` in the outer
  select (session 15's sampled survivor algorithms #65: 1e-13, the product
  divided by 1); elsewhere a zero norm means a zero row, whose products are
  0 as well."""
  points = {"w": jnp.array([[1e-23, 0.0], [1e10, 0.0]])}
  sim = jax.jit(cluster_models.cosine_similarity)(points)
  np.testing.assert_array_equal(sim, [[0.0, 0.0], [0.0, 1.0]])


def test_cosine_similarity_of_opposite_vectors_stays_within_minus_one():
  """(1.6, 0.4) and (-1.6, -0.4): the product over the norms rounds to
  -1.0000001 in float32 on this machine; the similarity is clipped to
  [-1, 1], so -1. Seen to fail with the lower clip at -2 (session 15's
  sampled survivor algorithms #74: -1.0000001); the other tests' opposite
  vectors divided exactly."""
  points = {"w": jnp.array([[1.6, 0.4], [-1.6, -0.4]])}
  sim = np.asarray(jax.jit(cluster_models.cosine_similarity)(points))
  assert sim.min() >= -1.0 and sim.max() <= 1.0
  np.testing.assert_allclose(sim, [[1.0, -1.0], [-1.0, 1.0]], atol=1e-6)


def test_cosine_similarity_of_an_infinite_row_is_zero():
  """A message (inf, 0) beside (1, 0) and (-1, 0): its products are inf
  and -inf over a norm product of inf, NaN, so its whole row and column
  (its own entry too) are 0, as the docstring says of non-finite entries;
  the finite rows keep 1 and -1. Seen to fail with non-finite entries set
  to 1 (census survivor algorithms #76 at 9158dc9: the inf row as similar
  as can be to both opposite rows); the other tests had finite rows only
  (a NaN row's NaN norm product gives 0 through `denom > 0` before this
  select)."""
  points = {"w": jnp.array([[jnp.inf, 0.0], [1.0, 0.0], [-1.0, 0.0]])}
  sim = jax.jit(cluster_models.cosine_similarity)(points)
  np.testing.assert_array_equal(sim, [[0.0, 0.0, 0.0], [0.0, 1.0, -1.0],
                                      [0.0, -1.0, 1.0]])


def test_segment_mean_divides_by_a_total_weight_below_one():
  """Weights 0.25, 0.25 on 2 and 4 (segment 0) and 0.5 on 6 (segment 1):
  totals 0.5 each, means 3 and 6. Seen to fail when only totals above 1
  divide (session 13's sampled survivor algorithms #49, `where(t > 0, t,
  1)` -> `t > 1`: 1.5 and 3); the library's callers pass 0/1 weights,
  whose non-empty totals are at least 1."""
  means, totals = jax.jit(cluster_models.segment_mean, static_argnums=2)(
      jnp.array([2.0, 4.0, 6.0]), jnp.array([0, 0, 1]), 2,
      jnp.array([0.25, 0.25, 0.5]))
  np.testing.assert_allclose(means, [3.0, 6.0], rtol=1e-6)
  np.testing.assert_allclose(totals, [0.5, 0.5], rtol=1e-6)


def test_dead_centres_coincide_within_rtol_of_the_larger_norm():
  """Centres at (100, 0) and (100.05, 0) are 0.05 apart, within rtol = 1e-3
  of their norm (0.1): the higher one is dead; (0, 50) and (0, 50.1) are
  0.1 apart, beyond 0.05: both live; a centre with no client is dead.
  Seen to fail with the tolerance divided by the norm (`rtol / max`, 1e-5
  here), which no Momentum-Clustering run in the tests separated from
  `rtol * max`: session 5's sample, algorithms #292; and with `any` ->
  `all` over the lower triangle (#299: no centre then ever coincides)."""
  centres = {"w": jnp.array([[100.0, 0.0], [100.05, 0.0], [0.0, 50.0],
                             [0.0, 50.1], [7.0, 7.0]])}
  dead = jax.jit(dead_centers)(centres, jnp.array([0, 1, 2, 3, 3]))
  np.testing.assert_array_equal(dead, [False, True, False, False, True])
  # The larger norm: (10, 0) and (6, 0) are 4 apart, within 0.5 x 10 but
  # not 0.5 x 6 (#293: `minimum` of the norms).
  far = jax.jit(dead_centers, static_argnames="rtol")(
      {"w": jnp.array([[10.0, 0.0], [6.0, 0.0]])}, jnp.array([0, 1]),
      rtol=0.5)
  np.testing.assert_array_equal(far, [False, True])
  # The larger norm also when it is the higher centre's: (6, 0) and (10, 0)
  # (#418 at 9158dc9, session 15: `norms[None, :]` for `norms[:, None]`
  # compared with the lower centre's norm, 0.5 x 6 < 4: both live).
  far = jax.jit(dead_centers, static_argnames="rtol")(
      {"w": jnp.array([[6.0, 0.0], [10.0, 0.0]])}, jnp.array([0, 1]),
      rtol=0.5)
  np.testing.assert_array_equal(far, [False, True])
  # Two zero centres coincide (distance 0 <= rtol x 0; session 15's sampled
  # survivor algorithms #415: `<` for `<=` kept both alive).
  zero = jax.jit(dead_centers)({"w": jnp.zeros((2, 3))}, jnp.array([0, 1]))
  np.testing.assert_array_equal(zero, [False, True])


def test_momentum_clustering_momentum_weights_alpha_and_one_minus_alpha():
  """alpha = 0.25: m_2 = 0.25 g_2 + 0.75 m_1 with m_1 = 0.25 g_1 (the
  existing hand-computed rounds use alpha = 0.5, where both weights are
  equal). Seen to fail with `alpha * g + alpha * m`."""
  alg = prfl.algorithms.momentum_clustering(
      shifted_quadratic, optax.sgd(0.1), num_clusters=2, radius=3.0,
      num_iters=1, alpha=0.25, **PAPER)
  step = jax.jit(alg.step)
  state, _ = step(alg.init(jnp.zeros((4, 1))), C[:, None], KEY)
  m1 = 0.25 * (0.0 - np.asarray(C))
  np.testing.assert_allclose(state.momentum, m1, atol=1e-6)
  x1 = np.asarray(state.params)
  state, _ = step(state, C[:, None], jax.random.key(1))
  np.testing.assert_allclose(state.momentum,
                             0.25 * (x1 - np.asarray(C)) + 0.75 * m1,
                             atol=1e-6)


def test_ditto_global_part_steps_with_the_global_optimizer():
  """Personal SGD 0.2, global SGD 1.0, clients' targets 0, 2, 7 from w = 1:
  one local step of the global optimizer lands on each target, so the new
  global model is their mean, 3. Seen to fail when the global part steps
  with the personal optimizer (w = 1 + 0.2 (3 - 1) = 1.4)."""
  alg = ditto(quadratic, optax.sgd(0.2), lam=0.5,
              global_optimizer=optax.sgd(1.0))
  state, _ = jax.jit(alg.step)(alg.init(jnp.ones(3)),
                               jnp.array([[0.0], [2.0], [7.0]]), KEY)
  np.testing.assert_allclose(state.global_params, 3.0, rtol=1e-6)


def test_ifca_steps_a_cluster_of_one_client():
  """Option I, SGD 0.1, models 0 and 10, targets 0, 1 (model 0) and 9
  (model 10, alone): model 0 moves to 0.05, model 10 to 9.9, and both
  clusters count. Seen to fail when a cluster needs two clients to count
  as non-empty (session 13's sampled survivor algorithms #160, `sizes > 0`
  -> `sizes > 1`: model 10 kept, one cluster)."""
  alg = ifca(quadratic, optax.sgd(0.1), num_clusters=2, option=1,
             init_models=jnp.array([0.0, 10.0]))
  state, metrics = jax.jit(alg.step)(alg.init(jnp.zeros(3)),
                                     jnp.array([[0.0], [1.0], [9.0]]), KEY)
  np.testing.assert_allclose(state.models, [0.05, 9.9], rtol=1e-6)
  assert metrics["num_clusters"] == 2


def test_ifca_keeps_an_empty_clusters_optimizer_state():
  """Option I with momentum: round 1 both clusters have members (targets
  0, 1 pick model 0, targets 5, 9 model 4); round 2 every target is -10,
  so cluster 1 is empty and its momentum must stay as round 1 left it.
  Seen to fail when the new state is taken for empty clusters too (the
  trace decays to 0.9 of itself)."""
  alg = ifca(quadratic, optax.sgd(0.1, momentum=0.9), num_clusters=2,
             option=1, init_models=jnp.array([0.0, 4.0]))
  step = jax.jit(alg.step)
  state, _ = step(alg.init(jnp.zeros(4)),
                  jnp.array([[0.0], [1.0], [5.0], [9.0]]), KEY)
  assert set(np.asarray(state.assignment).tolist()) == {0, 1}
  before = jax.tree.leaves(state.opt_state)
  state, _ = step(state, jnp.full((4, 1), -10.0), jax.random.key(1))
  assert set(np.asarray(state.assignment).tolist()) == {0}
  traces = [(a, b) for a, b in zip(before, jax.tree.leaves(state.opt_state))
            if jnp.ndim(a) > 0]
  assert traces
  for a, b in traces:
    assert float(a[1]) != 0.0
    np.testing.assert_array_equal(b[1], a[1])


def test_ifca_never_assigns_a_client_to_a_nan_loss():
  """Model 0 at -1 makes the loss NaN (`sqrt` of a negative) for every
  client; model 4 is finite, so every client joins cluster 1 (HypCluster
  shares `loss_assignment`). Seen to fail when NaN losses are not mapped
  to +inf (`argmin` returns the NaN: every client in cluster 0)."""
  nan_below_zero = lambda x, c: quadratic(x, c) + 0.0 * jnp.sqrt(x)
  alg = ifca(nan_below_zero, optax.sgd(0.1), num_clusters=2, option=1,
             init_models=jnp.array([-1.0, 4.0]))
  state, _ = jax.jit(alg.step)(alg.init(jnp.zeros(2)),
                               jnp.array([[0.0], [1.0]]), KEY)
  np.testing.assert_array_equal(state.assignment, [1, 1])
  assert np.all(np.isfinite(np.asarray(state.models[1])))


def _knn(val, test, lambdas, k):
  """A datastore {-1: class 0, +1: class 1}, a global model that always
  says class 1 (logits 0, 5) or is uniform (params 0)."""
  train = (jnp.array([[-1.0], [1.0]]), jnp.array([0, 1]))
  logits_fn = lambda p, x: jnp.zeros((x.shape[0], 2)).at[:, 1].set(p)
  evaluate = jax.jit(lambda *args: knn_per_evaluate(  # Eagerly: seconds.
      logits_fn, lambda p, x: x, *args, k=k, num_classes=2, lambdas=lambdas))
  return evaluate(jnp.asarray(val[2]), train, val[:2], test)


def test_knn_per_chooses_lambda_on_validation_not_test():
  """Validation: x = -1 of class 0 (the kNN part is right, the global model
  wrong): lambda 1. Test: x = -1 of class 1, where lambda 0 would be best;
  the chosen lambda still scores 0 there, and gives the true class
  probability 0: the test loss is -log(1e-12), finite. Seen to fail when
  lambda is chosen on the test set (leakage: lambda 0, test accuracy 1),
  and with the log's floor made -1e-12 (session 14's sampled survivor
  algorithms #220: the loss NaN; the other tests' true classes had
  probabilities far above 1e-12)."""
  x = jnp.array([[-1.0]])
  out = _knn((x, jnp.array([0]), 5.0), (x, jnp.array([1])), (0.0, 1.0), 1)
  assert float(out["lambda"]) == 1.0 and float(out["accuracy"]) == 0.0
  # The global model alone (logits 0, 5) says class 1, right on the test
  # point. Seen to fail with its prediction taken by argmin (session 15's
  # sampled survivor algorithms #226: 0; the other tests' global models
  # were uniform, where argmin and argmax both pick class 0), and with `!=`
  # for `==` (census survivor algorithms #225 at 9158dc9: 0).
  assert float(out["global_accuracy"]) == 1.0
  np.testing.assert_allclose(out["loss"], -np.log(1e-12), rtol=1e-6)


def test_knn_per_breaks_lambda_ties_to_the_first_grid_value():
  """x = 0 is equally far from both stored points (k = 2) and the global
  model is uniform: every lambda gives the same (0.5, 0.5), a tie, and the
  first grid value is chosen; the test loss is -log(0.5 + 1e-12). Seen to
  fail with ties to the last (1.0), and with the log's floor 1e-12 made
  1 + 1e-12 (the loss, checked only for finiteness before, became -0.41)."""
  x = jnp.array([[0.0]])
  out = _knn((x, jnp.array([0]), 0.0), (x, jnp.array([0])), (0.0, 0.5, 1.0),
             2)
  assert float(out["lambda"]) == 0.0
  np.testing.assert_allclose(out["loss"], np.log(2.0), rtol=1e-6)


def test_knn_per_loss_reads_each_test_points_own_label():
  """Two test points, x = -1 of class 0 and x = +1 of class 1, lambda 0.5,
  k = 1, a uniform global model: p = 0.5 onehot + 0.25, so each point's own
  class has 0.75 and the loss is -log 0.75 = 0.288. Seen to fail with the
  labels indexed as a row (session 15's sampled survivor algorithms #221,
  `y[:, None]` -> `y[None, :]`: every point read at the first label, class
  0, -(log 0.75 + log 0.25) / 2 = 0.837); the other tests had one test
  point, where the two agree."""
  x = jnp.array([[-1.0]])
  out = _knn((x, jnp.array([0]), 0.0),
             (jnp.array([[-1.0], [1.0]]), jnp.array([0, 1])), (0.5,), 1)
  assert float(out["accuracy"]) == 1.0
  np.testing.assert_allclose(out["loss"], -np.log(0.75), rtol=1e-6)


def test_myopic_default_separation_is_the_radius():
  """Gradients -0.1, -0.12, -0.3, radius 0.05, K = 3: with the default
  separation (the radius) -0.12 is too close to -0.1 to open a third
  centre, whatever the first centre drawn: two clusters. Seen to fail with
  a default separation of 0 (three clusters)."""
  batch = jnp.array([[0.1], [0.12], [0.3]])
  alg = myopic_clustering(quadratic, optax.sgd(1.0), num_clusters=3,
                          radius=0.05)
  step = jax.jit(alg.step)
  for seed in range(3):
    _, metrics = step(alg.init(jnp.zeros(3)), batch, jax.random.key(seed))
    assert metrics["num_clusters"] == 2


def test_myopic_default_separation_is_zero_with_a_radius_per_centre():
  """Gradients -0.1 and -0.12, radius 0.01 per centre (an array), K = 2:
  the default separation is then 0, so farthest-first opens both centres
  and each ball holds only its own gradient: two clusters. Seen to fail
  when a non-callable radius of any shape counted as a scalar (session
  15's sampled survivor algorithms #285, `and` -> `or` in the default's
  test: `float` of the array raised) and with the default 1.0 for 0.0
  (census survivor algorithms #289 at 9158dc9: one cluster); every test
  with a radius array gave its separation."""
  batch = jnp.array([[0.1], [0.12]])
  alg = myopic_clustering(quadratic, optax.sgd(1.0), num_clusters=2,
                          radius=jnp.array([0.01, 0.01]))
  step = jax.jit(alg.step)
  for seed in range(3):
    _, metrics = step(alg.init(jnp.zeros(2)), batch, jax.random.key(seed))
    assert metrics["num_clusters"] == 2


def test_random_init_adds_noise_of_standard_deviation_init_scale():
  """IFCA's and HypCluster's random init: client 1's params (3; client 0's
  are NaN) plus init_scale = 0.01 times standard Gaussian noise, 4 x 500
  draws: the noise's mean is about 0 and its standard deviation about 0.01.
  Seen to fail with the scale divided by the draw (session 14's sampled
  survivor algorithms #140, `init_scale * normal` -> `init_scale /
  normal`: heavy-tailed noise, mean 0.012 and standard deviation 0.33 here
  against -0.0003 and 0.0100); the existing tests checked only that the
  init is finite and copies a finite client."""
  params = jnp.stack([jnp.full(500, jnp.nan), jnp.full(500, 3.0)])
  models = jax.jit(lambda p: init_cluster_models(p, 4, key=KEY,
                                                 init_scale=0.01))(params)
  assert models.shape == (4, 500)
  noise = np.asarray(models, np.float64) - 3.0
  assert abs(noise.mean()) < 1e-3
  np.testing.assert_allclose(noise.std(), 0.01, rtol=0.1)
