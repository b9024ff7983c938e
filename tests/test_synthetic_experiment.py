"""End-to-end: the synthetic federation (§5.1) and experiments/synthetic.py."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from experiments import synthetic


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
  assert np.median(err["oracle"]) < 1e-4
  # FC solves (almost) every client to the oracle's precision ...
  assert np.median(err["fc"]) < 1e-4
  assert np.sum(err["fc"] < 1e-3) >= 14
  # ... while no client solves its problem alone or with everyone.
  assert np.min(err["local"]) > 0.1
  assert np.min(err["global"]) > 1.0
  assert np.mean(err["fc"]) < 0.25 * np.mean(err["local"])


def test_experiment_cli_writes_results(tmp_path, capsys):
  out = tmp_path / "syn"
  synthetic.main(["--settings", "2x3", "--rounds", "20", "--eval-every", "10",
                  "--lrs", "0.001", "--quantiles", "0.3", "--out", str(out),
                  "--algorithms", "fc,oracle,local,global,ifca"])
  printed = capsys.readouterr().out
  assert "fc" in printed and "[1/5]" in printed
  results = json.loads((out / "results.json").read_text())
  assert {r["algorithm"] for r in results["runs"]} == {
      "fc", "oracle", "local", "global", "ifca"}
  assert (out / "summary.csv").read_text().startswith("setting,algorithm")
  for png in ("figure3.png", "figure2.png"):
    assert (out / png).read_bytes()[:4] == b"\x89PNG"
  assert not list(out.glob(".tmp-*"))


@pytest.mark.parametrize("argv, message", [
    (["--settings", "4by4"], "settings"),
    (["--algorithms", "fc,sgd"], "unknown"),
    (["--lrs", "-1"], "lrs"),
    (["--quantiles", "2"], "quantiles"),
])
def test_experiment_rejects_bad_arguments_before_running(argv, message,
                                                         tmp_path, capsys):
  with pytest.raises(SystemExit):
    synthetic.main(argv + ["--out", str(tmp_path / "x")])
  assert message in capsys.readouterr().err
  assert not (tmp_path / "x").exists()
