"""experiments/momentum_variants: bad options fail before anything runs;
the options reach the variants."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import cli
from experiments import momentum_variants


@pytest.mark.parametrize("argv,message", [
    (["--variants", "paper,fc"], "--variants"),
    (["--clients-per-cluster", "1"], "--clients-per-cluster"),
    (["--data", "synthetic", "--train-per-client", "5"],
     "--train-per-client"),
    (["--assigned-quantile", "1.5"], "--assigned-quantile")])
def test_bad_options_fail_before_running(argv, message, tmp_path, capsys):
  """Seen to fail when `resolve` let a cluster of one client through."""
  with pytest.raises(SystemExit):
    momentum_variants.main(argv + ["--out", str(tmp_path / "o")])
  assert message in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


def test_warmup_rounds_reaches_the_warm_variants_only(monkeypatch):
  """`--warmup-rounds 3` seeds the '_warm' and '_warmup' variants at round
  3 and leaves the others at 0. Seen to fail with the warm-up still
  written as 10 in `VARIANTS`."""
  seen = {}
  monkeypatch.setattr(momentum_variants.prfl.algorithms,
                      "momentum_clustering",
                      lambda *args, **kw: seen.update(kw))
  cfg, _ = cli.parse(momentum_variants.Config, ["--warmup-rounds", "3"])
  for name, rounds in (("assigned_stable_warm", 3), ("paper_warmup", 3),
                       ("assigned_stable", 0), ("paper", 0)):
    momentum_variants.build(name, cfg, None, None, 0.1, 0.9)
    assert seen["warmup_rounds"] == rounds, name


def test_own_variant_steps_alone_for_every_round(monkeypatch):
  """'own' never seeds the centres (warm-up = --rounds), and the driver's
  'start' key never reaches the library. Seen to fail with 'own' given
  WARMUP instead of ROUNDS, and with `build` passing START on."""
  seen = {}
  monkeypatch.setattr(momentum_variants.prfl.algorithms,
                      "momentum_clustering",
                      lambda *args, **kw: seen.update(kw))
  cfg, _ = cli.parse(momentum_variants.Config, ["--rounds", "7"])
  momentum_variants.build("own", cfg, None, None, 0.1, 0.9)
  assert seen["warmup_rounds"] == 7
  seen.clear()
  momentum_variants.build("truth_frozen", cfg, None, None, 0.1, 0.9)
  assert momentum_variants.START not in seen
  assert seen["warmup_rounds"] == 0 and seen["freeze_when_stable"] == 1


@pytest.mark.parametrize("name,distinct", [
    ("truth_frozen", True), ("truth_frozen_equal_centres", False)])
def test_truth_frozen_starts_seeded_at_the_truth_and_frozen(name, distinct):
  """The state is past seeding (round 1 > warm-up 0), holds the true
  assignment, counts as still for the freeze (still >= freeze_when_stable
  = 1), and its carried centres are distinct or all 0. Seen to fail with
  `still` left at 0 (not frozen) and with the centres' scale dropped."""
  cfg, _ = cli.parse(momentum_variants.Config,
                     ["--clusters", "2", "--clients-per-cluster", "2"])
  truth = np.array([1, 0, 1, 0])
  alg = momentum_variants.build(name, cfg, lambda p, b: jnp.sum(p), truth,
                                0.1, 0.9)
  state = momentum_variants.initial_state(name, alg, jnp.zeros((4, 3)),
                                          truth)
  np.testing.assert_array_equal(state.assignment, truth)
  assert int(state.round) == 1 and int(state.still) >= 1
  c = np.asarray(state.centers)
  assert (np.abs(c[0] - c[1]).min() > 0) == distinct
  assert momentum_variants.initial_state(
      "assigned_stable_warm", alg, jnp.zeros((4, 3)), truth) is None


def test_cluster_spreads_are_each_true_clusters_rms_spread():
  """`sep_spread_per_cluster[c]` is the rms distance of cluster c's benign
  momenta to their mean (numpy), the Byzantine client left out. Seen to
  fail with the Byzantine rows counted and with the mask of cluster c
  dropped (every entry then the whole federation's spread)."""
  momentum = jnp.array([[0.0, 0.0], [2.0, 0.0], [10.0, 10.0], [10.0, 13.0],
                        [99.0, 99.0]])
  truth = np.array([0, 0, 1, 1, 1])
  byz = jnp.array([False, False, False, False, True])
  class State(NamedTuple):
    momentum: jax.Array
    byzantine: jax.Array

  alg = momentum_variants.prfl.algorithms.base.Algorithm(
      lambda p: None, lambda s, b, k: (State(momentum, byz), {}))
  step = momentum_variants.with_cluster_spreads(alg, truth).step
  _, metrics = jax.jit(step)(None, None, None)  # Jitted: 0.3 s, eager 2 s.
  np.testing.assert_allclose(metrics["sep_spread_per_cluster"], [1.0, 1.5],
                             rtol=1e-6)
