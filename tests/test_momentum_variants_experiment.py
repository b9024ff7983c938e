"""experiments/momentum_variants: bad options fail before anything runs;
the options reach the variants."""

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
