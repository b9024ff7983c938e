"""Smoke tests: the benchmark commands run end to end on tiny sizes.

They check that every configuration of `bench_round` agrees with the reference
(its exit status) and that both benchmarks write readable JSON; the speed
numbers themselves come from full runs, never from tests.
"""

import json

import jax
from jax import flatten_util
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from benchmarks import bench_quantile
from benchmarks import bench_round
from benchmarks import bench_scale
from benchmarks import common
from benchmarks import torch_loop
from tests import tolerances


@pytest.mark.slow
def test_bench_round_configurations_agree(tmp_path):
  """Every configuration of the benchmark gives the JAX loop's centres.

  `slow` (a benchmark smoke run, 23 CPU-seconds; not in CI): CI checks that
  every plan and kernel give the direct kernel's centres in
  test_ghost.py::test_cluster_at_models_matches_direct, and the PyTorch loop
  against prfl in test_torch_loop_computes_prfls_centres.
  """
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


@pytest.mark.slow
def test_bench_round_user_and_flax_losses_agree(tmp_path):
  """The user-written and Flax MLP losses give the library loss's centres.

  `slow` (27 CPU-seconds; not in CI): CI checks a user-written MLP under
  every plan and a Flax linen MLP's Gram matrix in test_kernels_trace.py.
  """
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
  chunk = tolerances.default_chunk(3)  # Every model at once.
  assert configs["user:auto/auto"]["plan"] == (
      f"c{chunk}/ghost" if chunk else "full/ghost")


@pytest.mark.torch
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


@pytest.mark.slow
def test_bench_scale_writes_memory_and_linear_rows(tmp_path):
  """`slow` (26 CPU-seconds, a process per memory row; not in CI): the
  benchmark's own output, no library property."""
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


@pytest.mark.torch
def test_torch_loop_computes_prfls_centres():
  """The paper-style PyTorch loop behind every "x faster than PyTorch" claim
  computes the same round as prfl at a tiny size (N = 4, batch 3, 5
  clustering steps), with a quantile ball (q = 0.6) that holds some but not
  all clients, so its Threshold-Clustering is really exercised.

  Runs wherever torch is importable: the `test` extra installs CPU torch,
  so CI runs it (named on the run's `torch path` line, tests/conftest.py).
  Mutations seen to fail: the torch loop's centre update without the
  `(n - inside.sum()) * v` term's count (`(n - 1) * v`); the first layer's
  kernel mapped back from torch without its transpose.
  """
  pytest.importorskip("torch")
  params, batch = common.mnist_like_federation(4, 3, seed=1)
  radius = prfl.quantile_radius(0.6)
  _, torch_centres = torch_loop.run_mlp_loop(
      params, batch, radius, 5, repeats=1, budget_s=1.0, threads=1)
  _, prfl_centres = bench_round.run_plan(
      common.parse_plan("1:gram"), params, batch, radius, 5,
      repeats=1, budget_s=1.0)
  scale = np.max(np.abs(prfl_centres))
  # prfl's model matmuls follow JAX's default precision (TF32 / bf16 on
  # accelerators); torch runs float32 on CPU.
  np.testing.assert_allclose(torch_centres, prfl_centres, rtol=0,
                             atol=tolerances.model(0, 1e-5, scale=scale)[
                                 "atol"])
  # The ball is neither the owner alone nor every client.
  flat_grad = jax.jit(jax.vmap(jax.vmap(
      lambda p, b: flatten_util.ravel_pytree(jax.grad(common.mlp_loss)(p, b))[0],
      (None, 0)), (0, None)))
  grads = np.asarray(flat_grad(params, batch))  # [model, client, P]
  own = grads[np.arange(4), np.arange(4)]
  assert np.max(np.abs(prfl_centres - own)) > 1e-3 * scale
  assert np.max(np.abs(prfl_centres - grads.mean(1))) > 1e-3 * scale


def test_bench_quantile_paths_agree(tmp_path):
  """Both quantile paths (rank counting, sort) give the same balls and
  centres, and the benchmark writes its rows."""
  out = tmp_path / "quantile.json"
  assert bench_quantile.main([
      "--clients", "8", "--configs", "3", "--models", "2", "--repeats", "1",
      "--sweep-rounds", "2", "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert [r["case"] for r in rows] == ["kernel", "sweep"]
  assert rows[0]["same_ball"] and rows[0]["max_abs_diff"] == 0.0
  assert all(r["rank_s"] > 0 and r["sort_s"] > 0 for r in rows)


def test_benchmark_algorithms_come_from_the_registry():
  """`common.algorithm` builds through `experiments.registry` with the
  benchmark's settings over the registry's defaults: FC with a fixed radius
  and plain SGD gives, bit for bit, the round of the library's
  `federated_clustering` with the same arguments; a setting the algorithm
  does not read is refused by name.

  Seen to fail when the registry's FC ignores `Context.radius` (its
  quantile ball then holds the owner alone, not every client), and when
  `momentum=0.0` is dropped (the registry's default heavy-ball 0.9 then
  changes the second step).
  """
  rng = np.random.default_rng(0)
  batch = {"a": rng.normal(size=(4, 5, 3)).astype(np.float32),
           "y": rng.normal(size=(4, 5)).astype(np.float32)}
  plan = "full:direct"
  got = common.algorithm("fc", prfl.data.regression_loss, lr=0.1,
                         momentum=0.0, radius=1e6, num_iters=2,
                         **common.plan_settings(plan))
  want = prfl.algorithms.federated_clustering(
      prfl.data.regression_loss, optax.sgd(0.1), radius=1e6, num_iters=2,
      plan=common.parse_plan(plan))

  def two_rounds(alg, params, batch, key):
    state = alg.init(params)
    for r in range(2):  # Momentum shows from the second step on.
      state, _ = alg.step(state, batch, jax.random.fold_in(key, r))
    return state.params

  # One program for both: one compile, the test's cost.
  outs = jax.jit(lambda p, b, k: [two_rounds(a, p, b, k) for a in (
      got, want)])(jax.numpy.ones((4, 3)), batch, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(outs[0], outs[1])
  with pytest.raises(ValueError, match="local does not read.*groups"):
    common.algorithm("local", prfl.data.regression_loss, groups=2)
  with pytest.raises(ValueError, match="unknown algorithm 'fedprox'"):
    common.algorithm("fedprox", prfl.data.regression_loss)


@pytest.mark.torch
def test_float32_matmuls_turns_every_tf32_switch_off_and_restores_it():
  """Inside `common.float32_matmuls`: JAX at "highest", PyTorch's old TF32
  switches off and every newer `fp32_precision` setting at "ieee" (cuDNN's
  conv default is "tf32" in PyTorch >= 2.9); all restored after.

  Seen to fail before the `fp32_precision` settings were set (an H200 run's
  CUDA loop then differed from prfl's centres by 5e-3).
  """
  torch = pytest.importorskip("torch")
  conv = getattr(torch.backends.cudnn, "conv", None)
  if conv is None or not hasattr(conv, "fp32_precision"):
    pytest.skip("PyTorch < 2.9 has no fp32_precision settings")
  before = (conv.fp32_precision, torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_tf32)

  @common.float32_matmuls
  def read():
    return (conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_tf32,
            jax.config.jax_default_matmul_precision)

  assert read() == ("ieee", "ieee", False, False, "highest")
  assert (conv.fp32_precision, torch.backends.cudnn.allow_tf32,
          torch.backends.cuda.matmul.allow_tf32) == before


def test_check_centres_gpus_float64_clustering_is_the_librarys():
  """`check_centres_gpu` explains GPU centre differences by re-running
  Algorithm 2 in float64 on each gradient source, so its clustering must be
  the library's: 6 points in the plane (two groups and an outlier), centre
  started at point 0, quantile 0.4, 3 steps, against `threshold_clustering`;
  its recorded balls and edge margin by hand for the first step (distances
  from point 0: 0, 1, 1, 10, 10, 30; tau = quantile 0.4 = 1, so the ball is
  points 0-2; point 0 itself, at distance 0, is 1 from the edge: margin
  at most 1 over the steps).
  Seen to fail with the update's `(n - inside.sum()) * v` replaced by
  `(n - 1) * v`, and with `d <= tau` replaced by `d < tau`."""
  pytest.importorskip("torch")
  from benchmarks import check_centres_gpu  # pylint: disable=g-import-not-at-top
  z = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [10.0, 0.0],
                [0.0, 10.0], [30.0, 0.0]])
  v, balls, margin = check_centres_gpu.threshold_clustering_f64(z, 0, 0.4, 3)
  want = prfl.threshold_clustering(
      jax.numpy.asarray(z, jax.numpy.float32), jax.numpy.asarray(z[:1]),
      radius=prfl.quantile_radius(0.4), num_iters=3)
  np.testing.assert_allclose(v, np.asarray(want)[0], rtol=1e-6)
  np.testing.assert_array_equal(balls[0], [1, 1, 1, 0, 0, 0])
  assert 0 < margin <= 1.0 + 1e-12
  # The first step by hand: v1 = (sum of points 0-2 + 3 * v0) / 6.
  v1 = (z[:3].sum(0) + 3 * z[0]) / 6
  v_one, _, _ = check_centres_gpu.threshold_clustering_f64(z, 0, 0.4, 1)
  np.testing.assert_allclose(v_one, v1, rtol=1e-12)
