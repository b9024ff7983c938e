"""End-to-end: the synthetic federation (§5.1) and experiments/synthetic."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from experiments import synthetic
from experiments.synthetic import run as run_lib
from tests import tolerances


def _client_errors(result, data):
  return np.linalg.norm(np.asarray(result.state.params) -
                        np.asarray(data.test["x_star"]), axis=1)


def test_fc_reaches_oracle_error_where_local_and_global_do_not():
  data, _ = prfl.data.synthetic_regression(jax.random.key(0), num_clusters=4,
                                           clients_per_cluster=4)
  loss, opt = prfl.data.regression_loss, optax.sgd(0.02, momentum=0.9)
  algs = {
      "fc": prfl.algorithms.federated_clustering(
          loss, opt, radius=prfl.quantile_radius(0.1)),
      "oracle": prfl.algorithms.oracle(loss, opt, clusters=data.clusters),
      "local": prfl.algorithms.local(loss, opt),
      "global": prfl.algorithms.fedavg(loss, opt),
  }
  err = {}
  for name, alg in algs.items():
    result = prfl.train(alg, jnp.zeros((16, 10)), data, num_rounds=2000,
                        key=jax.random.key(1), eval_every=1000, verbose=False)
    err[name] = _client_errors(result, data)
  # The residuals `a @ x - y` are the model's own matmuls: at TF32 / bf16
  # (GPU / TPU defaults) the optimum is only found to that precision,
  # relative to ||x*||.
  scale = float(np.mean(np.linalg.norm(data.test["x_star"], axis=1)))
  solved = tolerances.model(atol=1e-4, scale=scale)["atol"]
  near = tolerances.model(atol=1e-3, scale=scale)["atol"]
  assert np.median(err["oracle"]) < solved
  # FC solves (almost) every client to the oracle's precision ...
  assert np.median(err["fc"]) < solved
  assert np.sum(err["fc"] < near) >= 14
  # ... while no client solves its problem alone or with everyone.
  assert np.min(err["local"]) > 0.1
  assert np.min(err["global"]) > 1.0
  assert np.mean(err["fc"]) < 0.25 * np.mean(err["local"])


def test_experiment_smoke_writes_results_and_config(tmp_path, capsys):
  out = tmp_path / "syn"
  # --smoke: 2x3, 20 rounds, lr 0.001, q 0.3, fc,oracle,local,global,ifca.
  synthetic.main(["--smoke", "--out", str(out), "--seed", "2", "--progress",
                  "lines"])
  printed = capsys.readouterr().out
  assert "fc" in printed and "[1/5]" in printed
  results = json.loads((out / "results.json").read_text())
  assert {r["algorithm"] for r in results["runs"]} == {
      "fc", "oracle", "local", "global", "ifca"}
  assert (out / "summary.csv").read_text().startswith("setting,algorithm")
  for png in ("figure3.png", "figure2.png"):
    assert (out / png).read_bytes()[:4] == b"\x89PNG"
  assert not list(out.glob(".tmp-*"))
  config = json.loads((out / "config.json").read_text())
  assert config["seed"] == 2 and config["config"]["smoke"]
  assert config["config"]["rounds"] == 20
  assert config["config"]["settings"] == ["2x3"]
  assert config["versions"]["jax"] == jax.__version__
  assert config["platform"]["backend"] == jax.default_backend()


@pytest.mark.parametrize("argv, message", [
    (["--settings", "4by4"], "--settings"),
    (["--algorithms", "fc,sgd"], "--algorithms"),
    (["--algorithms", "knn"], "--algorithms"),
    (["--algorithms", ""], "--algorithms"),
    (["--lrs", "-1"], "--lrs"),
    (["--lrs", "nan"], "--lrs"),
    (["--quantiles", "2"], "--quantiles"),
    (["--quantiles", "0"], "--quantiles"),
    (["--rounds", "0"], "--rounds"),
    (["--momentum", "1"], "--momentum"),
    (["--batch-size", "10"], "--batch-size"),
])
def test_experiment_rejects_bad_arguments_before_running(argv, message,
                                                         tmp_path, capsys,
                                                         monkeypatch):
  """`--lrs nan` (exit 0, NaN table) and `--algorithms ""` (failure at the
  CSV write, after all the runs) failed before experiments/cli.py."""
  monkeypatch.setattr(run_lib, "run_grid", _must_not_run)
  with pytest.raises(SystemExit) as e:
    synthetic.main(argv + ["--out", str(tmp_path / "x")])
  assert e.value.code == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "x").exists()


def _must_not_run(*args, **kwargs):
  raise AssertionError("the experiment ran before its arguments were checked")


def test_unwritable_out_is_found_before_any_run(tmp_path, capsys,
                                                monkeypatch):
  """Failed before: an unwritable `--out` was found after all the runs."""
  monkeypatch.setattr(run_lib, "run_grid", _must_not_run)
  (tmp_path / "file").write_text("")
  with pytest.raises(SystemExit):
    synthetic.main(["--smoke", "--out", str(tmp_path / "file" / "out")])
  assert "--out" in capsys.readouterr().err
