"""Smoke tests: the benchmark commands run end to end on tiny sizes.

They check that every configuration of `bench_round` agrees with the reference
(its exit status) and that both benchmarks write readable JSON; the speed
numbers themselves come from full runs, never from tests.
"""

import json

import pytest

from benchmarks import bench_round
from benchmarks import bench_scale


def test_bench_round_configurations_agree(tmp_path):
  out = tmp_path / "round.json"
  status = bench_round.main([
      "--clients", "4", "--batch-size", "3", "--repeats", "1",
      "--loop-repeats", "1", "--budget-s", "1", "--gemm-size", "64",
      "--torch-threads", "1",
      "--plans", "full:gram,1:gram,2:direct,full:ghost,1:ghost,3:ghost",
      "--out", str(out)])
  assert status == 0  # Every configuration's centres match the JAX loop's.
  rows = json.loads(out.read_text())["rows"]
  configs = {r["config"] for r in rows}
  assert {"jax-loop", "full/gram", "c1/gram", "c2/direct", "full/ghost",
          "c1/ghost", "c3/ghost"} <= configs
  for r in rows:
    assert r["time_s"] > 0 and r["gflops"] > 0
    assert r["rel_diff"] < 1e-3


def test_bench_round_user_and_flax_losses_agree(tmp_path):
  """The user-written and Flax MLP losses give the library loss's centres."""
  out = tmp_path / "round.json"
  assert bench_round.main([
      "--clients", "3", "--batch-size", "2", "--repeats", "1",
      "--loop-repeats", "1", "--budget-s", "1", "--gemm-size", "64",
      "--torch-threads", "1", "--plans", "auto:auto,2:gram",
      "--losses", "library,user,flax", "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  configs = {r["config"]: r for r in rows}
  assert {"auto/auto", "user:auto/auto", "flax:auto/auto",
          "flax:c2/gram"} <= set(configs)
  assert configs["user:auto/auto"]["plan"] == "c1/ghost"  # On CPU.


def test_bench_round_torch_loop_matches(tmp_path):
  pytest.importorskip("torch")
  out = tmp_path / "round.json"
  assert bench_round.main([
      "--clients", "3", "--batch-size", "2", "--repeats", "1",
      "--loop-repeats", "1", "--budget-s", "1", "--gemm-size", "64",
      "--torch-threads", "1", "--plans", "1:ghost",
      "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert any(r["config"].startswith("torch-loop") for r in rows)


def test_bench_scale_writes_memory_and_linear_rows(tmp_path):
  out = tmp_path / "scale.json"
  assert bench_scale.main([
      "--clients", "6", "--num-groups", "2", "--batch-size", "2",
      "--rounds", "1", "--plans", "1:gram,1:ghost",
      "--linear-clients", "3", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  specs = [r["spec"] for r in result["memory"]]
  assert specs == ["baseline", "1:gram", "1:ghost"]
  assert all(r["max_rss_mb"] > 0 and not r.get("failed")
             for r in result["memory"])
  assert {r["algorithm"] for r in result["linear"]} == {"local", "fedavg"}
