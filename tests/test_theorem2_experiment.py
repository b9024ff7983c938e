"""experiments/theorem2: the pieces of the rate measurement, by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import options
from experiments import theorem2


def test_noisy_loss_gradient_is_the_clean_gradient_plus_xi():
  """Seen to fail when the noise term was `<xi, x>^2 / 2` (gradient scaled
  by `<xi, x>`)."""
  a = jnp.array([[1.0, 2.0], [0.0, 1.0]])
  batch = {"a": a, "y": jnp.array([1.0, -1.0]), "xi": jnp.array([0.3, -2.0])}
  x = jnp.array([0.5, 0.25])
  # f = (1/4) ||a x - y||^2: gradient a^T (a x - y) / 2.
  clean = a.T @ (a @ x - batch["y"]) / 2
  np.testing.assert_allclose(jax.grad(theorem2.noisy_loss)(x, batch),
                             clean + batch["xi"], rtol=1e-6)


def test_best_over_lrs_takes_prefix_averages():
  """Two learning rates; the better one changes with T.

  Seen to fail when the average divided by the run's length instead of T.
  """
  curves = np.array([[4.0, 4.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
  best = theorem2.best_over_lrs(curves, np.array([0.1, 0.05]), (1, 4))
  assert best[0] == {"T": 1, "avg_grad_sq": 2.0, "lr": 0.05,
                     "lr_at_grid_edge": True}
  assert best[1]["avg_grad_sq"] == 2.0 and best[1]["lr"] == 0.1


def test_fit_slopes_recovers_exponents():
  rows = [{"n_i": n, "T": t, "avg_grad_sq": 3.0 * n ** -0.5 * t ** -0.25}
          for n in (2, 4, 8) for t in (10, 100)]
  fit = theorem2.fit_slopes(rows)
  assert fit["slope_n_i"] == pytest.approx(-0.5, abs=1e-9)
  assert fit["slope_T"] == pytest.approx(-0.25, abs=1e-9)
  assert fit["rms_residual"] < 1e-9


def test_federation_starts_at_the_given_distance_from_the_optima():
  cfg = options.replace(theorem2.Config(), seed=0, clusters=2,
                        separation=2.0, start_distance=0.1, clients=(3, 5))
  data, params = theorem2.federation(cfg, 3)
  # n_i = 3 keeps the first 3 clients of each cluster of the n_i = 5 one.
  more, more_params = theorem2.federation(cfg, 5)
  keep = np.array([0, 1, 2, 5, 6, 7])
  np.testing.assert_array_equal(data.train["a"], more.train["a"][keep])
  np.testing.assert_array_equal(params, more_params[keep])
  np.testing.assert_array_equal(data.clusters, [0, 0, 0, 1, 1, 1])
  dist = np.linalg.norm(np.asarray(params - data.test["x_star"]), axis=1)
  np.testing.assert_allclose(dist, 0.1, rtol=1e-5)
  # The targets are those of the scaled optima: a x* = y.
  np.testing.assert_allclose(
      np.einsum("nsd,nd->ns", data.train["a"], data.test["x_star"]),
      data.train["y"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("argv,message", [
    (["--clients", "4,x"], "--clients"),
    (["--methods", "fc,ifca"], "--methods"),
    (["--sigma", "0"], "--sigma"),
    (["--quantile", "1.5"], "--quantile")])
def test_bad_arguments_fail_before_running(argv, message, tmp_path, capsys):
  with pytest.raises(SystemExit):
    theorem2.main(argv + ["--out", str(tmp_path / "o")])
  assert message in capsys.readouterr().err
  assert not (tmp_path / "o").exists()
