"""The authors' protocol preset (`experiments/configs/mnist/authors.toml`)."""

from experiments import cli
from experiments import registry
from experiments.mnist import EXPERIMENT


def test_authors_preset_gives_fc_its_own_batches_rounds_steps_and_groups():
  """liehe/PRFL's mnist/run.sh: baselines 30 epochs x 7 batches of 32 (210
  steps); FC `fc-grad-3-quantile0.2-15` 50 epochs of one full local batch,
  3 Threshold-Clustering steps, 15 groups. One configuration, two settings.

  Seen to fail when FC's `rounds = 50` was left out of the preset (FC then
  ran the baselines' 210 rounds).
  """
  cfg, _ = cli.parse(EXPERIMENT.config,
                     ["--config", cli.preset("mnist", "authors")])
  cfg = EXPERIMENT.resolve(cfg)
  fc = registry.settings(cfg, "fc")
  assert (fc.rounds, fc.batch_size, fc.num_iters, fc.groups,
          fc.quantile) == (50, 200, 3, 15, 0.2)
  assert fc.batch_size == cfg.federation.train_per_client
  for name in cfg.algorithms.algorithms:
    if name != "fc":
      s = registry.settings(cfg, name)
      assert (s.rounds, s.batch_size, s.lr, s.momentum) == (210, 32, 0.1,
                                                            0.9), name
