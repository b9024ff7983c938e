"""experiments/threshold_clustering: Figure 7 and the Theorem 1 check."""

import json

import numpy as np
import pytest

import prfl_jax as prfl
from experiments import cli
from experiments import options
from experiments import threshold_clustering
from experiments.threshold_clustering import config
from experiments.threshold_clustering import figure7
from experiments.threshold_clustering import theorem as tc


def _smoke_cfg(out):
  return config.resolve(cli.parse(config.Config, ["--config", cli.preset(
      "threshold_clustering", "smoke"), "--smoke", "--out", out,
                                                  "--progress", "lines"])[0])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  """One `--smoke` run shared by the tests that read its files."""
  out = tmp_path_factory.mktemp("tc") / "out"
  fig7, theorem = threshold_clustering.main(["--smoke", "--out", str(out),
                                             "--progress", "lines"])
  return out, fig7, theorem


def test_smoke_run_writes_sane_files(smoke):
  out, _, _ = smoke
  for png in ("figure7.png", "theorem1.png"):
    assert (out / png).read_bytes()[:4] == b"\x89PNG"
  assert not list(out.glob(".tmp-*"))
  results = json.loads((out / "results.json").read_text())
  cfg = _smoke_cfg(str(out))
  assert results["config"]["fig7_sigmas"] == list(cfg.fig7_sigmas)
  assert {"jax", "numpy", "scikit-learn"} <= set(results["versions"])
  # `--smoke` gives exactly the smoke preset, recorded first in config.json
  # with the seed and platform.
  record = json.loads((out / "config.json").read_text())
  expect = json.loads(json.dumps(options.to_dict(cfg)))
  assert record["config"] == expect == results["config"]
  assert record["seed"] == 0 and record["platform"]["backend"]
  f = np.array(results["figure7"]["distance"])
  assert f.shape == (cfg.repeats, len(cfg.fig7_sigmas), cfg.fig7_iters + 1)
  assert np.all(np.isfinite(f)) and np.all(f > 0)
  for row, sigma in zip(results["figure7"]["rows"], cfg.fig7_sigmas):
    # f(0) is the mean norm of a 10-d N(0, sigma^2 I) vector, ~3.08 sigma.
    assert 2.6 < row["f0"] / sigma < 3.5
    assert row["f_min"] < row["f0"]
    assert 0 <= row["elbow"] <= cfg.fig7_iters
  records = results["theorem1"]["records"]
  assert len(records) == sum(len(v) for v in tc.conditions(cfg).values())
  assert all(np.isfinite(r["error"]) and r["error"] > 0 for r in records)
  for fit in results["theorem1"]["fits"].values():
    assert min(fit["a"], fit["b"], fit["c"]) >= 0
  summary = (out / "summary.md").read_text()
  assert "Does the elbow move with sigma?" in summary
  assert "| 10% quantile, within" in summary
  assert "| theory tau, all" in summary
  assert "Does the bound hold?" in summary


def test_smoke_run_prints_progress(tmp_path, capsys):
  threshold_clustering.main(["--smoke", "--no-theorem", "--no-plots",
                             "--fig7-sigmas", "1", "--out",
                             str(tmp_path / "o"), "--progress", "lines"])
  printed = capsys.readouterr().out
  assert "[figure 7]" in printed and "elbow l=" in printed
  assert (tmp_path / "o" / "summary.md").exists()
  assert not (tmp_path / "o" / "figure7.png").exists()


def test_distance_curve_is_threshold_clustering_with_l_iterations():
  x, y, c = figure7.blobs(options.replace(config.Config(), fig7_sigmas=(2.0,),
                                         repeats=1))
  x, y = x[0, 0], y[0, 0]
  f = figure7.distance_curve(x, y, c[0], quantile=0.1, num_iters=4)
  mu = c[0][y]
  np.testing.assert_allclose(
      f[0], np.mean(np.linalg.norm(x - mu, axis=1)), rtol=1e-6)
  for l in (1, 4):
    v = prfl.threshold_clustering(x, x, radius=prfl.quantile_radius(0.1),
                                  num_iters=l)
    np.testing.assert_allclose(
        f[l], np.mean(np.linalg.norm(np.asarray(v) - mu, axis=1)), rtol=1e-5)


def test_blobs_share_centres_across_sigmas_and_are_seeded():
  cfg = options.replace(config.Config(), fig7_sigmas=(0.5, 4.0), repeats=2)
  x, y, c = figure7.blobs(cfg)
  assert x.shape == (2, 2, 90, 10) and y.shape == (2, 2, 90)
  np.testing.assert_array_equal(y[:, 0], y[:, 1])
  # Same centres and noise: the deviations scale with sigma.
  dev = x - c[np.arange(2)[:, None, None], y]  # [R, S, N, d]
  np.testing.assert_allclose(dev[:, 1], 8 * dev[:, 0], rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(figure7.blobs(cfg)[0], x)
  assert not np.array_equal(x[0], x[1])


def test_elbow_rule_by_hand():
  f = np.array([10.0, 6.0, 4.0, 3.0, 2.5, 2.5])
  ratio = figure7.elbow_ratio(f)
  np.testing.assert_allclose(ratio[:4], [-4 / 7.5, -2 / 3.5, -1 / 1.5, -1.0])
  gap = figure7.remaining_gap(f)
  np.testing.assert_allclose(gap, [1, 3.5 / 7.5, 1.5 / 7.5, 0.5 / 7.5, 0, 0])
  np.testing.assert_allclose(gap[1:5], np.cumprod(1 + ratio[:4]))
  assert figure7.elbow(f, 0.1) == 3
  assert figure7.elbow(f, 0.5) == 1
  assert figure7.elbow(np.ones(4), 0.05) == 0


def _error(n, delta, sigma, bad, far, theory, draws, iters=150):
  return float(tc.theorem_error(
      draws, n, delta, sigma, bad, far, theory, 0.1, bad_max=max(bad, 1),
      num_iters=iters))


def test_theorem_error_is_the_sample_mean_error_when_clusters_are_apart():
  draws = tc.draw(0, repeats=1, num_clusters=10, dim=10, n_max=8)
  draws = draws._replace(**{k: v[0] for k, v in draws._asdict().items()})
  # Delta = 1000: every ball holds its whole cluster (the first 5 of 8
  # padded draws) and nothing else, so the centre converges to the cluster's
  # sample mean.
  sample_mean = draws.noise[:, :5].mean(1) / np.sqrt(10)
  expected = np.mean(np.sum(sample_mean**2, axis=1))
  for theory in (True, False):
    got = _error(5, 1000.0, 1.0, 0, False, theory, draws)
    if theory:
      np.testing.assert_allclose(got, expected, rtol=1e-3)
    else:  # The 10% quantile ball holds ~9 of the 50 points: a subset.
      assert got < 1.0


def test_edge_attack_pulls_the_centre_and_far_attack_does_not():
  draws = tc.draw(1, repeats=1, num_clusters=10, dim=10, n_max=10)
  draws = draws._replace(**{k: v[0] for k, v in draws._asdict().items()})
  for theory in (True, False):
    clean = _error(10, 20.0, 1.0, 0, False, theory, draws)
    edge = _error(10, 20.0, 1.0, 5, False, theory, draws)
    assert edge > 3 * clean
  # With the fixed radius, far points are never inside: same limit. (With the
  # quantile they shift the quantile's position, so not there.)
  far = _error(10, 20.0, 1.0, 5, True, True, draws)
  np.testing.assert_allclose(far, _error(10, 20.0, 1.0, 0, False, True, draws),
                             rtol=1e-3)


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "argument --repeats"),
    (["--fig7-sigmas", "1,-2"], "argument --fig7-sigmas"),
    (["--fig7-sigmas", "1,x"], "argument --fig7-sigmas"),
    (["--fig7-quantile", "0"], "argument --fig7-quantile"),
    (["--fig7-quantile", "1"], "argument --fig7-quantile"),
    (["--elbow-tol", "1"], "argument --elbow-tol"),
    (["--beta-values", "0,1"], "argument --beta-values"),
    (["--attack-beta", "-0.1"], "argument --attack-beta"),
    (["--theorem-quantiles", "0.1,1"], "argument --theorem-quantiles"),
    (["--n-values", "0,4"], "argument --n-values"),
    (["--delta-values", "nan"], "argument --delta-values"),
    (["--base-sigma", "0"], "argument --base-sigma"),
    (["--seed", "-1"], "argument --seed"),
    (["--blob-clusters", "20", "--blob-points", "90"], "--blob-dim"),
    (["--blob-points", "5"], "--blob-points"),
    (["--fig7-iters", "0"], "argument --fig7-iters"),
    (["--smoke", "--fig7-iters", "0"], "argument --fig7-iters"),
])
def test_cli_rejects_bad_arguments_before_running(argv, message, tmp_path,
                                                   capsys):
  with pytest.raises(SystemExit):
    threshold_clustering.main(argv + ["--out", str(tmp_path / "x")])
  assert message in capsys.readouterr().err
  assert not (tmp_path / "x").exists()


def test_cli_rejects_an_output_path_inside_a_file(tmp_path, capsys):
  (tmp_path / "file").write_text("")
  with pytest.raises(SystemExit):
    threshold_clustering.main(["--smoke", "--out",
                               str(tmp_path / "file" / "sub")])
  assert "--out" in capsys.readouterr().err


def test_bound_terms_and_fit_recover_known_constants():
  conds = [tc.Condition("n_i", n, d, s, b, "edge", "theory", 0.0)
           for n, d, s, b in [(2, 10.0, 1.0, 0), (8, 10.0, 2.0, 0),
                              (4, 40.0, 1.0, 5), (16, 5.0, 0.5, 11)]]
  terms = np.array([tc.bound_terms(c, 10) for c in conds])
  np.testing.assert_allclose(
      terms[2], [1 / 4, 1 / 40, 5 / 45 * 40])  # beta = 5 / (40 + 5).
  errors = terms @ np.array([2.0, 0.5, 3.0])
  fit = tc.fit_bound(terms, errors)
  np.testing.assert_allclose(fit["coefs"], [2.0, 0.5, 3.0], rtol=1e-6)
  assert fit["rms_log10"] < 1e-6
  np.testing.assert_allclose(tc.log_slope([1, 2, 4], [3, 12, 48]), 2.0)
