"""Smoke test of tools/mutation/: every preset still resolves, its mutants are
valid Python and each can be swapped in by an in-process worker (the tool is
run by hand, not in CI)."""

import ast
import dataclasses
import functools
import json
import shutil
import signal
import time

import numpy as np
import pytest

from tools import mutation as tool
from tools.mutation import tally
from tools.mutation import workers


def _mutants(preset):
  mutants = []
  for target in tool.resolve_preset(preset):
    if target.edit is not None:
      e = target.edit
      mutants.append(tool.edit_mutant(target.path, target.spec, e.old, e.new,
                                      e.why, len(mutants)))
    else:
      mutants += tool.generate(target.path, target.spec, len(mutants))
  return mutants


def test_core_preset_resolves_and_mutants_compile(capsys):
  assert tool.main(["--preset", "core", "--list"]) == 0
  listing = capsys.readouterr().out
  # Every core module is found (wherever the engine keeps it) with its tests.
  for name in ("clustering/radius.py:", "clustering/threshold.py:", "ghost.py:",
               "federated_clustering.py:"):
    assert name in listing
  # The rank formula of the quantile is among the mutants.
  assert "'count - 1' -> 'count + 1'" in listing
  # So is the owner-centring of the Gram kernels (its `+ G_ii` term): the
  # engine's kernel registry once moved it out of the preset's reach, where
  # it was skipped with a note only.
  assert "'gram - col[:, None] - col[None, :] + gram[index, index]' -> " in (
      listing)
  assert len(_mutants("core")) > 50


@pytest.mark.parametrize("preset", sorted(tool.PRESETS))
def test_preset_mutants_compile_and_apply_in_process(preset):
  mutants = _mutants(preset)
  assert mutants
  for m in mutants[::25] + [m for m in mutants if m.kind == "edit"]:
    source = tool.mutated_source(m)
    ast.parse(source)
    with open(m.path, encoding="utf-8") as f:
      assert source not in (f.read(), tool.unparsed_source(m.path))
    tool.inprocess_site(m.path, m.line)  # In-process mode applies.


def _fake(n_ops, n_edits):
  kinds = ["binop"] * n_ops + ["edit"] * n_edits
  return [tool.Mutant(i, "m.py", i + 1, k, "a", "b", -1, 0)
          for i, k in enumerate(kinds)]


def test_sample_is_seeded_uniform_without_replacement_plus_every_edit():
  """Seen to fail when the sample draws with replacement (`choices`), takes
  the first mutants unshuffled, ignores the seed, drops the edits, or runs
  in listing order (a stopped run is then not a smaller sample)."""
  mutants = _fake(200, 3)
  index = lambda **kw: [m.index for m in tool.select(mutants, **kw)]
  first = index(sample=40, seed=7)
  assert first[-3:] == [200, 201, 202]  # Every edit, after the sample.
  assert len(set(first)) == 43 and max(first[:-3]) < 200
  assert first == index(sample=40, seed=7) != index(sample=40, seed=8)
  # A larger sample extends a smaller one, in the same order.
  assert index(sample=120, seed=7)[:40] == first[:40]
  assert index(sample=5, seed=7)[:5] == first[:5] != sorted(first[:5])
  assert sorted(index(sample=10**6)) == list(range(203))
  # --every first, --only last.
  assert set(index(every=50, sample=2)[:2]) <= {0, 50, 100, 150}
  assert index(only={first[0], 201}, sample=40, seed=7) == [first[0], 201]
  # Uniform: over many seeds every operator mutant is drawn about as often.
  counts = np.zeros(200)
  for seed in range(400):
    counts[index(sample=20, seed=seed)[:-3]] += 1
  assert counts.sum() == 400 * 20
  assert counts.min() > 15 and counts.max() < 70  # Mean 40, sd ~6.


def test_exclude_leaves_an_earlier_samples_mutants_out_of_the_permutation(
    tmp_path):
  """A fresh sample: the same seeded permutation without the mutants an
  earlier result ran (matched on module, function, kind and change, not the
  line). Seen to fail when the exclusion is applied before the shuffle (the
  order then depends on the earlier sample) or ignored."""
  mutants = _fake(100, 1)
  for m in mutants:
    m.before = f"x{m.index}"
  key = lambda m: tool.exclusion_key(m.path, "f", m.kind, m.before, m.after)
  full = [m.index for m in tool.select(mutants, sample=100, seed=3)][:-1]
  earlier = [dict(dataclasses.asdict(m), function="f", line=m.line + 7,
                  status="killed") for m in mutants if m.index in full[:10]]
  earlier.append(dict(earlier[0], before="x99", status="pending"))
  path = tmp_path / "earlier.json"
  path.write_text(json.dumps(dict(mutants=earlier)))
  fresh = tool.select(mutants, sample=20, seed=3,
                      exclude=tool.excluded([str(path)]), key=key)
  assert [m.index for m in fresh] == full[10:30] + [100]


def test_limits_tell_a_looping_mutant_from_a_starved_run():
  """A mutant's limit is CPU seconds: a loop uses them up (killed), a run
  that only waits (as one starved by other jobs does) reaches the wall-clock
  guard first (undecided, run again). Seen to fail when the limit is wall
  time (the sleep then reads as a timeout, i.e. killed)."""
  t0 = time.perf_counter()
  with pytest.raises(workers.CpuLimit):  # A wide guard: the machine is shared.
    with workers.limits(0.2, starved_factor=100):
      while True:
        pass
  with pytest.raises(workers.Starved):
    with workers.limits(0.1):
      time.sleep(5)
  assert time.perf_counter() - t0 < 4
  assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
  assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_fresh_process_mutant_is_stopped_by_its_cpu_limit(tmp_path):
  """`--isolation process`: the pytest child gets RLIMIT_CPU; SIGXCPU reads
  as a timeout (killed). Seen to fail when the limit is not set (the wall
  guard then reads the loop as starved)."""
  (tmp_path / "test_loop.py").write_text(
      "def test_loop():\n  while True:\n    pass\n")
  status, _, _, _ = workers.run_tests_in_subprocess(
      str(tmp_path), ["test_loop.py"], 1, starved_factor=100)
  assert status == "timeout"


def test_site_fingerprint_names_the_function_and_hashes_its_source():
  """Seen to fail when the fingerprint hashes the whole module (lines of two
  functions then share it) instead of the function holding the line."""
  path, tests = "tools/mutation/cli.py", ["tests/test_tools_mutation.py::x"]
  source = open(path, encoding="utf-8").read().split("\n")
  line_of = lambda text: next(i for i, s in enumerate(source, 1) if text in s)
  a = tool.site_fingerprint(path, line_of("random.Random(seed)"), tests)
  b = tool.site_fingerprint(path, line_of("ops = ops[:sample]"), tests)
  c = tool.site_fingerprint(path, line_of("p.add_argument(\"--seed\""), tests)
  assert a == b and a["function"] == "select" and c["function"] == "main"
  assert c["source_sha"] != a["source_sha"] and c["tests_sha"] == a["tests_sha"]


def test_tally_applies_reruns_and_gives_the_wilson_interval():
  """Seen to fail when the interval is the normal (Wald) one, when errors
  count in the denominator, and when a rerun does not replace the survivor."""
  lo, hi = tally.wilson(40, 40)
  assert np.isclose(lo, 40 / (40 + 1.96**2)) and hi == 1.0
  lo, hi = tally.wilson(9, 10)  # Wilson (1927): 0.596-0.982.
  assert np.isclose(lo, 0.5958, atol=1e-4) and np.isclose(hi, 0.9821, atol=1e-4)
  m = lambda i, status, kind="binop": dict(
      index=i, path="m.py", function="f", line=i, before="a", after="b",
      kind=kind, status=status)
  sample = dict(presets=["p"], operator_mutants=100, mutants=[
      m(0, "killed"), m(1, "timeout"), m(2, "survived"), m(3, "survived"),
      m(4, "error"), m(5, "pending"), m(6, "killed", "edit"),
      m(8, "starved")])
  r = tally.row(sample, {tally.key(m(2, "killed")): m(2, "killed")})
  assert (r["run"], r["killed"], r["timeouts"], r["survived"], r["errors"],
          r["fixed"], r["still"]) == (6, 1, 1, 2, 2, 1, [3])
  assert r["killed_after"] == 3 and r["share"] == 0.75
  assert r["projected"] == (round(100 * r["lo"]), round(100 * r["hi"]))
  assert "| `p` | 100 | 6 | 1 | 1 | 2 | 1 | #3 | 2 | 3/4 = 75.0% |" in (
      tally.markdown([r]))
  # A continued sample (the pending #5 run later) merges into one row.
  more = dict(sample, mutants=[m(5, "survived"), m(7, "pending")])
  (merged,) = tally.merge([sample, more])
  assert tally.row(merged, {})["run"] == 7


def test_a_factorys_closures_made_before_the_swap_run_the_mutant():
  """A rule a test module builds at import (`agg.signguard()` in
  `test_robust_aggregators.RULES`) is a closure made before any mutant is
  swapped in: it must run the mutated code too. Seen to fail (the closure
  kept the original) when only the factory's `__code__` is swapped, as
  before session 5: SignGuard's clipping `minimum(1, M / norm)` -> `maximum`
  then survived every test in-process."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from prfl_jax import aggregators  # pylint: disable=g-import-not-at-top
  rule = aggregators.mean()
  x, w = jnp.array([[1.0], [jnp.nan]]), jnp.array([1.0, 0.0])
  assert float(rule(x, w)[0]) == 1.0  # The absent NaN row is zeroed.
  (m,) = [m for m in tool.generate("prfl_jax/aggregators/coordinate.py",
                                   "mean", 0)
          if (m.before, m.after) == ("weights > 0", "weights >= 0")]
  undo = workers.swap_in(m)
  try:
    assert np.isnan(float(rule(x, w)[0]))  # 0 * NaN: the row is not zeroed.
  finally:
    undo()
  assert float(rule(x, w)[0]) == 1.0


def test_tests_naming_the_mutated_function_run_first(tmp_path, monkeypatch):
  """`ordering.ordered_tests` keeps every test once and only reorders: the
  tests whose source (decorators too) names the function, then those naming
  a sibling, then the rest; a file it cannot split stays whole, last."""
  from tools.mutation import ordering  # pylint: disable=g-import-not-at-top
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "test_order_a.py").write_text(
      "import pytest\n"
      "@pytest.mark.parametrize('x', [1, 2])\n"
      "def test_plain(x):\n  targets(x)\n"
      "def helper():\n  target()\n"
      "class TestGroup:\n"
      "  def test_sibling(self):\n    other()\n"
      "  def not_a_test(self):\n    target()\n"
      "@pytest.mark.parametrize('f', [target])\n"
      "def test_decorated(f):\n  pass\n"
      "def test_calls_target():\n  target()\n")
  (tmp_path / "tests" / "test_order_b.py").write_text(
      "from elsewhere import test_imported\n"
      "def test_target_here():\n  target()\n")
  monkeypatch.setattr(ordering, "REPO", str(tmp_path))
  ordering._split.cache_clear()  # pylint: disable=protected-access
  try:
    got = ordering.ordered_tests(
        ["tests/test_order_a.py", "tests/test_order_b.py",
         "tests/test_order_a.py::test_plain[1]"], "target",
        ["target", "other"])
    plain = ordering.ordered_tests(["tests/test_order_a.py::test_plain[2]"],
                                   "target")
    case_first = ordering.ordered_tests(
        ["tests/test_order_a.py::test_plain[2]", "tests/test_order_a.py",
         "tests/test_order_a.py::test_plain[2]"], "other")
  finally:
    ordering._split.cache_clear()  # pylint: disable=protected-access
  a = "tests/test_order_a.py::"
  assert got == [a + "test_decorated", a + "test_calls_target",
                 a + "TestGroup::test_sibling", a + "test_plain",
                 "tests/test_order_b.py"]
  assert plain == [a + "test_plain[2]"]
  # A case listed before its file gives way to the whole test (else it ran
  # twice), and a node id listed twice is kept once.
  assert case_first == [a + "TestGroup::test_sibling", a + "test_plain",
                        a + "test_decorated", a + "test_calls_target"]


def test_each_worker_session_writes_its_own_persistent_cache(tmp_path):
  """A worker runs one pytest session per mutant, and tests/conftest.py gives
  each session a new persistent-cache directory and removes it at the end:
  after `reset_persistent_cache`, a compile writes into the directory the
  configuration names now, not into the removed one of the session before.
  Seen to fail without the reset (the entry went to the removed directory,
  a warning, and the new one stayed empty); in the worker that made
  test_train.py's no-cache-miss test fail in every session after the first,
  with no mutant in (census train #29 at 9158dc9 was counted as killed by
  it)."""
  import jax  # pylint: disable=g-import-not-at-top
  saved = jax.config.jax_compilation_cache_dir
  first, second = tmp_path / "first", tmp_path / "second"
  try:
    for directory, fn in ((first, lambda x: x + 17.25),
                          (second, lambda x: x * 31.5)):
      directory.mkdir()
      workers.reset_persistent_cache()
      jax.config.update("jax_compilation_cache_dir", str(directory))
      assert float(jax.jit(fn)(2.0)) in (19.25, 63.0)
      assert len(list(directory.iterdir())) == 1, directory
      shutil.rmtree(directory)  # As conftest's cleanup does.
  finally:
    workers.reset_persistent_cache()  # Back to the suite's own directory.
    jax.config.update("jax_compilation_cache_dir", saved)


def test_worker_empties_the_project_caches_a_previous_session_filled():
  """A test module's module-level `functools.cache` (e.g.
  test_momentum_clustering.py's `_loss_alg`) outlives the pytest session in
  a worker, so the algorithm built by one mutant's factory was reused under
  the next mutants: session 17's false `algorithms` kills. Before each
  session the worker empties the caches of project functions (tests,
  library) and leaves the tool's and dependencies' alone. Seen to fail with
  the clearing removed (the cache kept its entry)."""
  calls = []

  def make(module):
    def built(x):
      calls.append((module, x))
      return x * 2
    built.__module__ = module
    return functools.cache(built)

  test_cached = make("tests.test_fake_cached")
  lib_cached = make("prfl_jax.fake_cached")
  tool_cached = make("tools.mutation.fake_cached")
  dep_cached = make("numpy.fake_cached")
  for f in (test_cached, lib_cached, tool_cached, dep_cached):
    assert f(3) == 6
  assert workers.clear_project_caches() >= 2
  assert test_cached.cache_info().currsize == 0
  assert lib_cached.cache_info().currsize == 0
  assert tool_cached.cache_info().currsize == 1
  assert dep_cached.cache_info().currsize == 1
  assert workers._is_project_module("test_momentum_clustering")
  assert not workers._is_project_module("jax._src.util")
