"""The robust rules and pre-aggregators added beside Krum and the median.

Bulyan, Meamed, MoNNA, MDA, SMEA, CAF, DnC and SignGuard, and the
pre-aggregators NNM, bucketing, clipping and ARC, each against its plain
NumPy reference (`tests/reference_robust.py`, written from the papers'
definitions with loops, in float64): unweighted, with weights, with absent
rows holding garbage, with NaN/Inf rows, under jit and vmap. Inputs have a
few rows moved far away, so that each rule's selection matters. Mutations
seen to fail these tests: Bulyan averaging theta - f values instead of
theta - 2 f; Meamed keeping n - f + 1 values; ARC clipping k + 1 rows.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax import aggregators as agg
from tests import reference_robust as ref

N, F = 11, 2


def _messages(seed=0, n=N, outliers=F):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 8))
  x[:outliers] = 5.0 + 3.0 * rng.normal(size=(outliers, 8))
  x = x[rng.permutation(n)]
  return {"b": x[:, :2].astype(np.float32),
          "w": x[:, 2:].reshape(n, 2, 3).astype(np.float32)}


def _flat(tree):
  n = len(tree["b"])
  return np.concatenate([np.asarray(tree["b"], np.float64).reshape(n, -1),
                         np.asarray(tree["w"], np.float64).reshape(n, -1)], 1)


def _vec(out):
  return _flat(jax.tree.map(lambda v: np.asarray(v)[None], out))[0]


RULES = {
    "bulyan": (agg.bulyan(F), lambda x, w: ref.bulyan(x, w, F)),
    "meamed": (agg.meamed(3), lambda x, w: ref.meamed(x, w, 3)),
    "monna": (agg.monna(F, index=4), lambda x, w: ref.monna(x, w, F, 4)),
    "mda": (agg.mda(F), lambda x, w: ref.mda(x, w, F)),
    "smea": (agg.smea(F), lambda x, w: ref.smea(x, w, F)),
    "caf": (agg.caf(F), lambda x, w: ref.caf(x, w, F)),
    "dnc": (agg.dnc(F), lambda x, w: ref.dnc(x, w, F)),
    "signguard": (agg.signguard(), lambda x, w: ref.signguard(x, w)),
}
# Every rule jitted once for the module: the tests below call it on the same
# shapes again (eagerly, op by op, each call cost seconds).
JIT = {name: jax.jit(rule) for name, (rule, _) in RULES.items()}
# Rules whose reference takes non-unit weights as the rule does.
WEIGHTED = ["meamed", "mda", "smea", "caf", "dnc", "monna"]
TOL = {"rtol": 2e-4, "atol": 2e-5}  # float32 rule vs float64 reference.


@pytest.mark.parametrize("name", list(RULES))
def test_matches_numpy_reference(name):
  _, reference = RULES[name]
  msgs = _messages()
  np.testing.assert_allclose(_vec(JIT[name](msgs)),
                             reference(_flat(msgs), np.ones(N)), **TOL)


@pytest.mark.parametrize("name", list(RULES))
def test_absent_and_non_finite_rows_are_left_out(name):
  """Weight-0 rows hold 1e6 and NaN, another row Inf: the rule is the
  reference on the remaining rows (the index of MoNNA's trusted row shifts
  with them, so its row is kept in front)."""
  _, reference = RULES[name]
  msgs = _messages(seed=1, n=N + 3)
  weights = np.ones(N + 3, np.float32)
  weights[[5, 9]] = 0.0
  msgs["w"][5] = 1e6
  msgs["b"][9] = np.nan
  msgs["w"][12, 0, 0] = np.inf
  keep = np.ones(N + 3, bool)
  keep[[5, 9, 12]] = False
  out = JIT[name](msgs, jnp.asarray(weights))
  np.testing.assert_allclose(_vec(out),
                             reference(_flat(msgs)[keep], np.ones(N)), **TOL)


@pytest.mark.parametrize("name", WEIGHTED)
def test_weights_scale_the_averages(name):
  _, reference = RULES[name]
  msgs = _messages(seed=2)
  w = np.linspace(0.5, 2.0, N)
  np.testing.assert_allclose(_vec(JIT[name](msgs,
                                            jnp.asarray(w, jnp.float32))),
                             reference(_flat(msgs), w), **TOL)


@pytest.mark.parametrize("name", list(RULES))
def test_vmap_over_message_sets(name):
  rule, _ = RULES[name]
  sets = [_messages(seed=s) for s in range(3)]
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *sets)
  out = jax.jit(jax.vmap(rule))(stacked)
  for i, msgs in enumerate(sets):
    np.testing.assert_allclose(
        _vec(jax.tree.map(lambda v, i=i: v[i], out)), _vec(JIT[name](msgs)),
        rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["bulyan", "meamed", "mda", "smea", "caf",
                                  "dnc", "monna"])
def test_far_rows_do_not_reach_the_output(name):
  """f rows at 1e4: the aggregate stays within the inliers' range."""
  msgs = _messages(seed=3, outliers=0)
  msgs["w"][:F] = 1e4
  out = _vec(JIT[name](msgs))
  assert np.all(np.abs(out) < 5.0), out


@pytest.mark.parametrize("make, n, message", [
    (lambda: agg.bulyan(2), 10, "4 \\* num_byzantine \\+ 3"),
    (lambda: agg.meamed(5), 10, "2 \\* num_byzantine"),
    (lambda: agg.mda(5), 10, "2 \\* num_byzantine"),
    (lambda: agg.caf(5), 10, "2 \\* num_byzantine"),
    (lambda: agg.monna(1, index=10), 10, "`index`=10"),
    (lambda: agg.mda(8, max_subsets=1000), 40, "C\\(40, 8\\)"),
])
def test_bad_sizes_raise_when_traced(make, n, message):
  msgs = {"x": jnp.zeros((n, 3))}
  with pytest.raises(ValueError, match=message):
    make()(msgs)


@pytest.mark.parametrize("make", [
    lambda: agg.bulyan(-1), lambda: agg.mda(1.5), lambda: agg.caf(2, max_iters=0),
    lambda: agg.dnc(1, filter_frac=-0.1), lambda: agg.signguard(low=3.0),
    lambda: agg.nnm(-2), lambda: agg.bucketing(0), lambda: agg.clipping(0.0),
    lambda: agg.arc(None)])
def test_bad_arguments_raise_at_once(make):
  with pytest.raises(ValueError):
    make()


def test_random_draws_need_a_key():
  msgs = {"x": jnp.ones((6, 5))}
  with pytest.raises(ValueError, match="key"):
    agg.dnc(1, subsample_dim=2)(msgs)
  with pytest.raises(ValueError, match="key"):
    agg.bucketing(2)(msgs)
  out = agg.dnc(1, subsample_dim=2)(msgs, key=jax.random.key(0))
  np.testing.assert_allclose(out["x"], np.ones(5), rtol=1e-6)


# Pre-aggregators.

PRE = {
    "nnm": (agg.nnm(3), lambda x, w: (ref.nnm(x, w, 3), w)),
    "clipping": (agg.clipping(2.5), lambda x, w: (ref.clip(x, 2.5), w)),
    "arc": (agg.arc(3), lambda x, w: (ref.arc(x, 3), w)),
}


@pytest.mark.parametrize("name", list(PRE))
def test_pre_aggregator_matches_reference(name):
  pre, reference = PRE[name]
  msgs = _messages(seed=4)
  out, weights = jax.jit(pre)(msgs)
  expected, expected_w = reference(_flat(msgs), np.ones(N))
  np.testing.assert_allclose(_flat(out), expected, **TOL)
  np.testing.assert_allclose(weights, expected_w)


@pytest.mark.parametrize("name", list(PRE))
def test_pre_aggregator_drops_absent_rows(name):
  """Absent and NaN rows come out as zero rows of weight 0; the others as
  the reference on the present rows."""
  pre, reference = PRE[name]
  msgs = _messages(seed=5, n=N + 2)
  weights = np.ones(N + 2, np.float32)
  weights[3] = 0.0
  msgs["w"][3] = 1e6
  msgs["b"][7] = np.nan
  keep = np.ones(N + 2, bool)
  keep[[3, 7]] = False
  out, out_w = jax.jit(pre)(msgs, jnp.asarray(weights))
  expected, _ = reference(_flat(msgs)[keep], np.ones(N))
  np.testing.assert_allclose(_flat(out)[keep], expected, **TOL)
  np.testing.assert_array_equal(_flat(out)[~keep], 0.0)
  np.testing.assert_array_equal(np.asarray(out_w), keep.astype(np.float32))


def test_bucket_means_match_reference_with_absent_rows():
  msgs = _messages(seed=6)
  weights = np.ones(N, np.float32)
  weights[2] = 0.0
  weights[5] = 2.0
  order = np.random.default_rng(0).permutation(N)
  out, out_w = agg.bucket_means(msgs, jnp.asarray(order), 3,
                                jnp.asarray(weights))
  present_order = np.array([i for i in order if weights[i] > 0])
  expected, expected_w = ref.bucket_means(_flat(msgs), weights,
                                          present_order, 3)
  assert _flat(out).shape[0] == 4  # ceil(11 / 3) rows.
  np.testing.assert_allclose(_flat(out)[:4], expected, **TOL)
  np.testing.assert_allclose(np.asarray(out_w), expected_w, rtol=1e-6)


def test_bucketing_is_a_permutation_then_bucket_means():
  msgs = _messages(seed=7)
  key = jax.random.key(3)
  out, w = agg.bucketing(4)(msgs, key=key)
  again, w2 = agg.bucket_means(msgs, jax.random.permutation(key, N), 4)
  np.testing.assert_array_equal(_flat(out), _flat(again))
  np.testing.assert_array_equal(w, w2)


def test_compose_chains_pre_aggregators_in_front_of_a_rule():
  msgs = _messages(seed=8)
  rule = agg.compose(agg.arc(2), agg.nnm(2), agg.median())
  x = _flat(msgs)
  expected = np.median(ref.nnm(ref.arc(x, 2), np.ones(N), 2), axis=0)
  np.testing.assert_allclose(_vec(jax.jit(rule)(msgs)), expected, **TOL)
  with pytest.raises(ValueError, match="key"):
    agg.compose(agg.bucketing(2), agg.mean())(msgs)
  out = agg.compose(agg.bucketing(2), agg.mean())(msgs, key=jax.random.key(0))
  assert np.all(np.isfinite(_vec(out)))
