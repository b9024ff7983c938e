"""The failure-mode examples of Werner et al. (2023), Section 2 and 3.1.3."""

import json
import os

import numpy as np
import pytest

from experiments import cli
from experiments import failure_modes
from experiments.failure_modes import config
from experiments.failure_modes import examples


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  out = tmp_path_factory.mktemp("failure_modes")
  res = failure_modes.main(["--out", str(out), "--example-rounds", "200",
                            "--example3-seeds", "200", "--example3-rounds",
                            "40", "--progress", "lines"])
  res["out"] = str(out)
  return res


def test_writes_json_and_plots(results):
  out = results["out"]
  with open(os.path.join(out, "failure_modes.json")) as f:
    saved = json.load(f)
  assert set(saved) >= {"config", "example1", "example2", "example3"}
  for i in (1, 2, 3):
    assert os.path.getsize(os.path.join(out, f"example{i}.png")) > 0
  with open(os.path.join(out, "config.json")) as f:
    config = json.load(f)
  assert config["config"]["example_rounds"] == 200 and config["seed"] == 0
  assert {"jax", "jaxlib", "flax", "optax", "numpy", "python"} <= set(
      config["versions"])
  assert config["platform"]["backend"]


@pytest.mark.parametrize("argv, option", [
    # Was an MLIRError after compiling.
    (["--example-rounds", "-5"], "--example-rounds"),
    # Was an IndexError after running.
    (["--example-rounds", "0"], "--example-rounds"),
    # Was a ValueError after examples 1-2.
    (["--example3-seeds", "0"], "--example3-seeds"),
    (["--eta-fc", "nan"], "--eta-fc"),
    (["--eta-cfl", "0"], "--eta-cfl"),
    (["--example3-cfl-warmup", "-1"], "--example3-cfl-warmup"),
    # >= --example3-rounds (100).
    (["--example3-cfl-warmup", "100"], "--example3-cfl-warmup"),
    (["--myopic-radius", "-0.1"], "--myopic-radius"),
    (["--example2-local-steps", "1.5"], "--example2-local-steps"),
])
def test_bad_options_are_rejected_before_running(argv, option, tmp_path,
                                                 capsys, monkeypatch):
  """Failed before experiments/cli.py: no option was checked."""
  def must_not_run(cfg):
    raise AssertionError("ran before the options were checked")
  monkeypatch.setattr(examples, "example1", must_not_run)
  with pytest.raises(SystemExit) as e:
    failure_modes.main(argv + ["--out", str(tmp_path / "x")])
  assert e.value.code == 2
  assert option in capsys.readouterr().err
  assert not (tmp_path / "x").exists()


def test_smoke_sizes(tmp_path):
  """--smoke sets small sizes (the run itself is what `results` runs, with
  other sizes: running it again here would cost ~40 s of compiling)."""
  cfg = cli.parse(config.Config, ["--smoke", "--example-rounds", "30"],
                  presets={"smoke": cli.preset("failure_modes", "smoke")})[0]
  assert cfg.run.smoke and (cfg.example_rounds, cfg.example3_seeds,
                            cfg.example3_rounds) == (30, 8, 30)


def test_example1_myopic_gets_stuck_and_merges(results):
  m = results["example1"]["myopic"]
  assert m["first_partitions"] == ["{1,2}|{3}", "{1}|{2,3}", "{1}|{2,3}"]
  x = np.asarray(m["final_x"])
  assert abs(x[1] - 1.0) < 0.02  # Client 2 stuck at the saddle point x=1.
  assert abs(x[0]) < 0.02 and abs(x[2] - 2.0) < 0.02
  assert m["final_partition"] == "{1,2,3}"
  assert m["single_cluster_from_round"] is not None


def test_example1_federated_clustering_reaches_optima(results):
  fc = results["example1"]["federated_clustering"]
  assert fc["eta"] == 0.1 and fc["radius"] == pytest.approx(5.0)
  np.testing.assert_allclose(fc["final_x"], [0.0, 0.0, 2.0], atol=1e-3)


@pytest.mark.parametrize("name", ["ifca_option1", "ifca_option2",
                                  "hypcluster"])
def test_example2_loss_based_methods_stuck(results, name):
  r = results["example2"][name]
  assert r["always_cluster_2"]
  np.testing.assert_allclose(r["final_models"], [-1.5, 0.0], atol=1e-6)


def test_example2_federated_clustering(results):
  fc = results["example2"]["federated_clustering"]
  np.testing.assert_allclose(fc["final_x"], [-0.5, 0.5], atol=1e-3)


def test_example3_cfl_separates_2_and_3_half_the_time(results):
  c = results["example3"]["cfl"]
  assert 0.35 <= c["separated_2_3_frequency"] <= 0.65
  assert set(c["final_partitions"]) == {"{1,3}|{2}", "{1}|{2,3}"}
  assert c["first_split_rounds"] == [21]


def test_example3_federated_clustering(results):
  fc = results["example3"]["federated_clustering"]
  np.testing.assert_allclose(fc["mean_final_x"][:2], [0.0, 0.5], atol=0.02)
  assert abs(fc["mean_final_x"][2] - 0.5) < 0.1
