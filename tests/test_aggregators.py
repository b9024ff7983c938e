"""Tests of the robust aggregators against plain NumPy references.

Every rule is compared with a float64 NumPy version written from its
definition (messages as a two-leaf pytree, flattened into one vector where the
rule needs distances), unweighted, with weights, with NaN/Inf rows, and under
jit and vmap. Mutations that were seen to fail these tests: the median's
upper middle taken with `>=` (even counts), Krum summing one neighbour too
many, trimmed mean dropping `ceil` instead of `floor` values, centered
clipping's step scaled by 0.9, non-finite rows left present in the median.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import prfl_jax as prfl
from prfl_jax import aggregators
from tests import tolerances

RNG = np.random.default_rng(0)
N = 9


def _messages(n=N, rng=RNG):
  return {"w": rng.normal(size=(n, 2, 3)).astype(np.float32),
          "b": rng.normal(size=(n, 2)).astype(np.float32)}


def _flat(tree):
  return np.concatenate([np.asarray(tree["b"], np.float64).reshape(
      len(tree["b"]), -1), np.asarray(tree["w"], np.float64).reshape(
          len(tree["w"]), -1)], axis=1)


def _unflat(vec):
  return {"b": vec[:2], "w": vec[2:].reshape(2, 3)}


def _assert_close(out, expected_vec, rtol=1e-5, atol=1e-5):
  exp = _unflat(np.asarray(expected_vec))
  for name in ("b", "w"):
    np.testing.assert_allclose(np.asarray(out[name]), exp[name], rtol=rtol,
                               atol=atol, err_msg=name)


# NumPy references, on x [n, P] float64 of the present rows and weights [n].

def np_mean(x, w):
  return (w[:, None] * x).sum(0) / w.sum()


def np_krum(x, w, f, m):
  n = len(x)
  d2 = ((x[:, None] - x[None]) ** 2).sum(-1)
  k = max(n - f - 2, 1)
  scores = [np.sort(np.delete(d2[i], i))[:k].sum() for i in range(n)]
  sel = np.argsort(scores, kind="stable")[:m]
  return np_mean(x[sel], w[sel])


def np_geometric_median(x, w, iters, eps):
  z = np_mean(x, w)
  for _ in range(iters):
    beta = w / np.maximum(eps, np.linalg.norm(x - z, axis=1))
    z = (beta[:, None] * x).sum(0) / beta.sum()
  return z


def np_centered_clipping(x, w, radius, iters, v):
  for _ in range(iters):
    u = x - v
    norm = np.linalg.norm(u, axis=1)
    scale = np.minimum(1.0, radius / np.maximum(norm, 1e-30))
    v = v + (w[:, None] * scale[:, None] * u).sum(0) / w.sum()
  return v


RULES = {
    "mean": (aggregators.mean(), lambda x, w: np_mean(x, w)),
    "median": (aggregators.median(), lambda x, w: np.median(x, axis=0)),
    "trimmed_mean": (aggregators.trimmed_mean(0.25),
                     lambda x, w: stats.trim_mean(x, 0.25, axis=0)),
    "krum": (aggregators.krum(2), lambda x, w: np_krum(x, w, 2, 1)),
    "multi_krum": (aggregators.krum(1, num_selected=3),
                   lambda x, w: np_krum(x, w, 1, 3)),
    "geometric_median": (aggregators.geometric_median(20, eps=1e-8),
                         lambda x, w: np_geometric_median(x, w, 20, 1e-8)),
    "centered_clipping": (
        aggregators.centered_clipping(0.8, 3),
        lambda x, w: np_centered_clipping(x, w, 0.8, 3, np.median(x, axis=0))),
}
ROBUST = [name for name in RULES if name != "mean"]


@pytest.mark.parametrize("name", list(RULES))
def test_matches_numpy_reference(name):
  agg, ref = RULES[name]
  msgs = _messages()
  x = _flat(msgs)
  out = jax.jit(agg)(msgs)
  _assert_close(out, ref(x, np.ones(N)))


@pytest.mark.parametrize("name", list(RULES))
def test_weight_zero_rows_are_ignored(name):
  """Absent rows hold 1e6 and NaN; the result is the rule on the others."""
  agg, ref = RULES[name]
  msgs = _messages()
  present = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1], bool)
  msgs["w"][2] = 1e6
  msgs["b"][6] = np.nan
  out = agg(msgs, jnp.asarray(present, jnp.float32))
  _assert_close(out, ref(_flat(msgs)[present], np.ones(present.sum())))


@pytest.mark.parametrize("name", ["mean", "trimmed_mean", "multi_krum",
                                  "geometric_median", "centered_clipping"])
def test_weighted_averages(name):
  """Positive weights scale each row's share of the average."""
  agg, _ = RULES[name]
  msgs = _messages()
  w = np.array([1.0, 2.0, 0.5, 1.0, 3.0, 1.0, 1.0, 0.25, 1.0])
  x = _flat(msgs)
  if name == "mean":
    expected = np_mean(x, w)
  elif name == "trimmed_mean":
    # b = floor(0.25 * 9) = 2 values dropped at each end, per coordinate.
    order = np.argsort(x, axis=0)
    keep = order[2:N - 2]
    kw = w[keep]
    expected = (np.take_along_axis(x, keep, 0) * kw).sum(0) / kw.sum(0)
  elif name == "multi_krum":
    expected = np_krum(x, w, 1, 3)
  elif name == "geometric_median":
    expected = np_geometric_median(x, w, 20, 1e-8)
  else:
    # Starts at the weighted median (tested against copies below).
    start = _flat(jax.tree.map(lambda v: np.asarray(v)[None],
                               aggregators.median()(msgs, jnp.asarray(w))))[0]
    expected = np_centered_clipping(x, w, 0.8, 3, start)
  _assert_close(agg(msgs, jnp.asarray(w, jnp.float32)), expected)


def test_weighted_median_counts_integer_weights_as_copies():
  msgs = _messages()
  w = np.array([1, 3, 0, 2, 1, 1, 4, 1, 2])
  repeated = np.repeat(_flat(msgs), w, axis=0)
  out = aggregators.median()(msgs, jnp.asarray(w, jnp.float32))
  _assert_close(out, np.median(repeated, axis=0))
  # Equal non-unit weights give NumPy's median (even count: mean of middles).
  even = {k: v[:4] for k, v in msgs.items()}
  out = aggregators.median()(even, jnp.full((4,), 2.5))
  _assert_close(out, np.median(_flat(even), axis=0))


def test_median_even_count_is_mean_of_middle_values():
  msgs = {"b": np.array([[4.0, 0.0], [1.0, 1.0], [3.0, 5.0], [10.0, 2.0]],
                        np.float32),
          "w": np.zeros((4, 2, 3), np.float32)}
  out = aggregators.median()(msgs)
  np.testing.assert_array_equal(out["b"], [3.5, 1.5])


@pytest.mark.parametrize("name", ROBUST)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rows_never_reach_the_output(name, bad):
  agg, ref = RULES[name]
  msgs = _messages()
  msgs["w"][1, 0, 0] = bad
  msgs["b"][5] = bad
  out = jax.jit(agg)(msgs)
  finite = np.ones(N, bool)
  finite[[1, 5]] = False
  assert all(np.all(np.isfinite(v)) for v in out.values())
  _assert_close(out, ref(_flat(msgs)[finite], np.ones(finite.sum())))


def test_mean_is_not_robust_and_equals_tree_mean():
  """Bit-identical on CPU. An accelerator may sum in another order in another
  program (an H100 gave results 3e-8 apart): there, float32-close."""
  msgs = _messages()
  expected = prfl.tree.weighted_mean(msgs, jnp.ones((N,), jnp.float32))
  out = jax.jit(aggregators.mean())(msgs)
  same = (np.testing.assert_array_equal if jax.default_backend() == "cpu"
          else lambda a, b: np.testing.assert_allclose(a, b,
                                                       **tolerances.LIBRARY))
  for name in msgs:
    same(out[name], jax.jit(prfl.tree.weighted_mean)(msgs, jnp.ones((N,)))[name])
    same(out[name], expected[name])
  msgs["b"][0, 0] = np.nan
  assert np.isnan(aggregators.mean()(msgs)["b"][0])


@pytest.mark.parametrize("name", list(RULES))
def test_vmap_over_message_sets_and_weights(name):
  agg, _ = RULES[name]
  sets = [_messages() for _ in range(3)]
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *sets)
  weights = np.ones((3, N), np.float32)
  weights[1, [0, 4]] = 0.0
  out = jax.jit(jax.vmap(agg))(stacked, jnp.asarray(weights))
  for s in range(3):
    one = agg(sets[s], jnp.asarray(weights[s]))
    for leaf in ("b", "w"):
      np.testing.assert_allclose(out[leaf][s], one[leaf], rtol=1e-5,
                                 atol=1e-6)


@pytest.mark.parametrize("name", list(RULES))
def test_no_present_row_gives_zero(name):
  agg, _ = RULES[name]
  out = agg(_messages(), jnp.zeros((N,)))
  for v in out.values():
    np.testing.assert_array_equal(v, 0.0)


def test_krum_picks_the_honest_cluster_and_multi_krum_averages():
  # Dyadic values: every squared distance and score is exact in float32 on
  # any backend, so the tie below is a tie everywhere (with 0.1-spaced
  # values an H100's rounding broke it the other way).
  honest = np.array([[0.0], [0.25], [0.5], [0.75], [-0.25]], np.float32)
  byz = np.array([[50.0], [51.0]], np.float32)
  x = {"b": np.concatenate([honest, byz])}
  out = aggregators.krum(2)(x)
  # n=7, f=2: 3 neighbours. Rows 0 (0.0), 1 (0.25) and 2 (0.5) all score
  # 1/16 + 1/16 + 1/4 = 0.375; rows 3 and 4 score 0.875; ties go to the
  # lower index.
  np.testing.assert_array_equal(out["b"], [0.0])
  out = aggregators.krum(2, num_selected=2)(x)
  np.testing.assert_allclose(out["b"], [0.125], rtol=1e-6)


def test_centered_clipping_from_given_center():
  x = {"b": np.array([[3.0, 4.0], [0.0, 0.0], [0.0, 1.0]], np.float32)}
  out = aggregators.centered_clipping(1.0, 1, center={"b": np.zeros(2)})(x)
  # clip((3, 4), 1) = (0.6, 0.8); (0, 0); (0, 1): mean (0.2, 0.6).
  np.testing.assert_allclose(out["b"], [0.2, 0.6], rtol=1e-6)


def test_per_segment_aggregates_each_segment():
  msgs = _messages()
  seg = jnp.array([0, 1, 0, 0, 1, 2, 0, 1, 0])
  out, sizes = jax.jit(aggregators.per_segment, static_argnums=(0, 3))(
      aggregators.median(), msgs, seg, 4)
  np.testing.assert_array_equal(sizes, [5, 3, 1, 0])
  x = _flat(msgs)
  for k in range(3):
    _assert_close(jax.tree.map(lambda v: v[k], out),
                  np.median(x[np.asarray(seg) == k], axis=0))
  for v in out.values():
    np.testing.assert_array_equal(v[3], 0.0)


def test_bad_arguments_fail_at_once():
  with pytest.raises(ValueError, match="trim_fraction"):
    aggregators.trimmed_mean(0.5)
  with pytest.raises(ValueError, match="trim_fraction"):
    aggregators.trimmed_mean(-0.1)
  with pytest.raises(ValueError, match="radius"):
    aggregators.centered_clipping(0.0, 3)
  with pytest.raises(ValueError, match="radius"):
    aggregators.centered_clipping(-1.0, 3)
  with pytest.raises(ValueError, match="num_iters"):
    aggregators.centered_clipping(1.0, 0)
  with pytest.raises(ValueError, match="num_iters"):
    aggregators.geometric_median(0)
  with pytest.raises(ValueError, match="eps"):
    aggregators.geometric_median(3, eps=0.0)
  with pytest.raises(ValueError, match="num_byzantine"):
    aggregators.krum(-1)
  with pytest.raises(ValueError, match="num_selected"):
    aggregators.krum(1, num_selected=0)
  # N is known when agg is traced: 2 * 4 + 2 >= 9 fails before compiling.
  with pytest.raises(ValueError, match="num_byzantine.*too large"):
    jax.jit(aggregators.krum(4))(_messages())
  aggregators.krum(3)(_messages())  # 2 * 3 + 2 < 9 is fine.
  with pytest.raises(ValueError, match="weights"):
    aggregators.median()(_messages(), jnp.ones((N + 1,)))
  with pytest.raises(ValueError, match="weights"):
    aggregators.median()(_messages(), -jnp.ones((N,)))
