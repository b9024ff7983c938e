"""`bench_peers`: the task every system gets, and the systems agree.

The prfl_jax side runs everywhere at a tiny size; the pfl and Flower sides
run only where the `peers` extra is installed (skipped otherwise, as in CI).
Speed numbers come from full runs, never from tests.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import bench_peers
from benchmarks import peers_step
from benchmarks import peers_task
from tests import tolerances

TINY = peers_task.Task(num_clients=5, examples=4, cohort=2, batch=2,
                       test_size=8)
TINY_ARGS = ["--clients", "5", "--examples", "4", "--cohort", "2",
             "--batch", "2", "--test-size", "8", "--segments", "2",
             "--rounds", "2"]


def test_torch_layout_is_pfls_flatten_order():
  """The converted dense kernel sees the torch model's (C, H, W) flattening.

  Seen to fail when `to_torch` reshapes Dense_0 without the (h, w, c) ->
  (c, h, w) transpose.
  """
  params = peers_task.init_params(1)
  state = peers_task.to_torch(params)
  fmap = np.random.default_rng(0).standard_normal(
      (peers_task.POOLED, peers_task.POOLED, peers_task.CONV[1]))
  flax_out = fmap.reshape(-1) @ params["Dense_0"]["kernel"]
  torch_out = state["8.weight"] @ fmap.transpose(2, 0, 1).reshape(-1)
  np.testing.assert_allclose(torch_out, flax_out, rtol=1e-4, atol=1e-4)
  assert state["1.weight"].shape == (32, 3, 3, 3)  # [out, in, kh, kw].
  back = peers_task.from_torch(state)
  assert peers_task.max_abs_diff(params, back) == 0.0


def test_every_process_makes_the_same_clients():
  """A client's data from its seed equals its rows of the whole federation.

  Seen to fail when `client_data` seeds its generator without the client id.
  """
  x, y = peers_task.federation(TINY)
  assert x.shape == (5, 4, 32, 32, 3) and y.shape == (5, 4)
  for i in (0, 3):
    xi, yi = peers_task.client_data(TINY, i)
    np.testing.assert_array_equal(xi, x[i])
    np.testing.assert_array_equal(yi, y[i])
  assert not np.array_equal(x[0], x[1])


def test_cohorts_are_distinct_clients_and_reproducible():
  key = jax.random.PRNGKey(3)
  ids = bench_peers.cohort_ids(key, TINY, 6)
  assert ids.shape == (6, 2)
  assert all(len(set(r)) == 2 and r.min() >= 0 and r.max() < 5 for r in ids)
  np.testing.assert_array_equal(ids, bench_peers.cohort_ids(key, TINY, 6))


@pytest.mark.parametrize("task, match", [
    (TINY._replace(cohort=6), "cohort"),
    (TINY._replace(batch=3), "batch"),
    (TINY._replace(examples=0), "examples"),
    (TINY._replace(noise=-1.0), "noise"),
])
def test_bad_task_is_named(task, match):
  with pytest.raises(ValueError, match=match):
    peers_task.check_task(task)


@pytest.mark.parametrize("argv", [
    ["--systems", "prfl_jax,tff"], ["--systems", "pfl,pfl"],
    ["--cohort", "9", "--clients", "5"], ["--rounds", "0"],
    ["--clients-at-once", "0"], ["--clients-at-once", "some"]])
def test_bad_arguments_exit_before_any_work(argv, tmp_path):
  out = tmp_path / "peers.json"
  with pytest.raises(SystemExit) as e:
    bench_peers.main(argv + ["--out", str(out)])
  assert e.value.code == 2 and not out.exists()


def test_patches_fast_and_xla_convolutions_agree():
  """The benchmark's CNN gives the same logits with every convolution."""
  params = jax.tree.map(jnp.asarray, peers_task.init_params(0))
  x, _ = peers_task.client_data(TINY, 0)
  a = bench_peers.cnn_apply("patches")(params, x)
  assert a.shape == (4, 10)
  for conv in ("xla", "fast"):
    # TF32 on a GPU at JAX's default precision: an H200 read 5.9e-4.
    np.testing.assert_allclose(bench_peers.cnn_apply(conv)(params, x), a,
                               **tolerances.model(1e-4, 1e-5))


@pytest.mark.slow
def test_prfl_jax_side_runs_and_writes_json(tmp_path):
  """The prfl_jax side of the benchmark runs and writes its JSON.

  `slow` (a benchmark smoke run, 17 CPU-seconds; not in CI): CI checks the
  task (test_every_process_makes_the_same_clients,
  test_cohorts_are_distinct_clients_and_reproducible), the model's
  convolutions (test_patches_fast_and_xla_convolutions_agree) and FedAvg
  with `clients_at_once` in
  test_baselines_core.py::test_fedavg_clients_at_once_trains_the_same_clients.
  """
  out = tmp_path / "peers.json"
  assert bench_peers.main(TINY_ARGS + ["--systems", "prfl_jax",
                                       "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  (row,) = result["rows"]
  assert row["system"] == "prfl_jax" and len(row["round_s"]) == 2
  assert row["s_per_round"] > 0 and len(row["first_round_s"]) == 2
  assert len(row["accuracy"]) == 2 and 0 <= row["final_accuracy"] <= 1
  assert result["rounds"] == 4 and result["task"]["cohort"] == 2


def _one_round_pfl_vs_prfl(tmp_path, system):
  out = tmp_path / "peers.json"
  assert bench_peers.main(TINY_ARGS + ["--systems", f"prfl_jax,{system}",
                                       "--ray-cpus", "1",
                                       "--out", str(out)]) == 0
  rows = {r["system"]: r for r in json.loads(out.read_text())["rows"]}
  return rows[system]


def test_pfl_trains_the_same_model(tmp_path):
  """pfl-research, replaying prfl_jax's cohorts, ends at prfl_jax's model.

  Seen to fail (difference 0.61) when pfl's user sampler draws its own
  random users instead of replaying the cohorts.
  """
  pytest.importorskip("torch")
  pytest.importorskip("pfl")
  row = _one_round_pfl_vs_prfl(tmp_path, "pfl")
  assert row["max_param_diff"] < 1e-5  # float32 summation order only.


def test_flower_trains_the_same_model(tmp_path):
  """Flower's simulation, replaying the cohorts, ends at prfl_jax's model."""
  pytest.importorskip("torch")
  pytest.importorskip("flwr")
  pytest.importorskip("ray")
  row = _one_round_pfl_vs_prfl(tmp_path, "flower")
  assert row["max_param_diff"] < 1e-5


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--repeats", "0"]])
def test_peers_step_bad_arguments_exit_before_any_work(argv):
  with pytest.raises(SystemExit) as e:
    peers_step.main(argv)
  assert e.value.code == 2
