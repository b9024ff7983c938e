"""Smoke test of `benchmarks/bench_plans.py` (default plan vs the best) on
tiny sizes; the speed numbers come from full runs only."""

import json

import pytest

from benchmarks import bench_plans
from tests import tolerances


@pytest.mark.slow
def test_smoke_run_ranks_plans_and_names_the_default(tmp_path):
  """Every plan's centres agree (exit status 0), the default row names the
  plan `ExecutionPlan()` resolves to, and the best candidate is 1.0x itself.

  `slow` (43 CPU-seconds, eight compiles; not in CI): CI checks the default
  plan's choice in test_kernels_plan.py and the plans' agreement in
  test_gradients.py, test_ghost.py and test_kernels_trace.py.

  It names the mutations it must catch (a default row labelled `auto/auto`,
  `vs_best` against the slowest plan); neither was run in this session.
  """
  out = tmp_path / "plans.json"
  assert bench_plans.main([
      "--smoke", "--models", "user_mlp,cnn_small", "--clients", "4",
      "--plans", "1:ghost,2:ghost,full:gram", "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  by = {(r["model"], r["config"]): r for r in rows}
  assert set(by) == {(m, c) for m in ("user_mlp", "cnn_small")
                     for c in ("default", "1:ghost", "2:ghost", "full:gram")}
  for model, convolutions in (("user_mlp", False), ("cnn_small", True)):
    chunk = tolerances.default_chunk(4, convolutions=convolutions)
    assert by[(model, "default")]["plan"] == (
        f"c{chunk}/ghost" if chunk else "full/ghost")
    candidates = [r for r in rows if r["model"] == model and
                  r["config"] != "default"]
    assert min(r["vs_best"] for r in candidates) == pytest.approx(1.0)
    assert all(r["vs_best"] >= 1.0 for r in candidates)
  assert all(r["rel_diff"] < 1e-3 for r in rows)


def test_bad_plan_is_refused_before_any_run(capsys):
  """`--plans` with an unknown kernel stops at parsing, naming the flag."""
  with pytest.raises(SystemExit):
    bench_plans.main(["--smoke", "--plans", "1:nope"])
  assert "--plans" in capsys.readouterr().err
