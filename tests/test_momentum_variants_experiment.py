"""experiments/momentum_variants: bad options fail before anything runs."""

import pytest

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
