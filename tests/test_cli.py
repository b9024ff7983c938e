"""Tests of experiments/cli.py, the command line every experiment shares."""

import json
import os

import pytest

from experiments import cli


def _parser(tmp_path, **kw):
  p = cli.parser("Test experiment.\n\nMore.", out=str(tmp_path / "out"), **kw)
  p.add_argument("--rounds", type=cli.positive_int, default=5)
  p.add_argument("--quantile", type=cli.real(0, 1, low_open=True),
                 default=0.2)
  p.add_argument("--momentum", type=cli.real(0, 1, high_open=True),
                 default=0.9)
  p.add_argument("--lrs", type=cli.list_of(cli.real(0, low_open=True)),
                 default="0.1,0.05")
  p.add_argument("--algorithms", type=cli.choices(("fc", "ifca", "local")),
                 default="fc,ifca")
  p.add_argument("--model", type=cli.choices(("mlp", "cnn"), multiple=False),
                 default="mlp")
  return p


def test_defaults_and_good_values(tmp_path):
  args = cli.parse(_parser(tmp_path), [])
  assert args.lrs == (0.1, 0.05) and args.algorithms == ("fc", "ifca")
  assert args.rounds == 5 and args.seed == 0 and not args.smoke
  args = cli.parse(_parser(tmp_path), [
      "--rounds", "7", "--quantile", "1", "--momentum", "0", "--lrs", "3e-2",
      "--algorithms", "local", "--model", "cnn", "--seed", "4"])
  assert (args.rounds, args.quantile, args.momentum, args.lrs,
          args.algorithms, args.model, args.seed) == (
              7, 1.0, 0.0, (0.03,), ("local",), "cnn", 4)


@pytest.mark.parametrize("argv, option", [
    (["--rounds", "-5"], "--rounds"),
    (["--rounds", "0"], "--rounds"),
    (["--rounds", "2.5"], "--rounds"),
    (["--quantile", "0"], "--quantile"),  # (0, 1]: 0 excluded.
    (["--quantile", "nan"], "--quantile"),
    (["--momentum", "1"], "--momentum"),  # [0, 1): 1 excluded.
    (["--lrs", "nan"], "--lrs"),
    (["--lrs", "inf"], "--lrs"),
    (["--lrs", "0.1,,0.2"], "--lrs"),
    (["--lrs", ""], "--lrs"),
    (["--lrs", "-1"], "--lrs"),
    (["--algorithms", ""], "--algorithms"),
    (["--algorithms", "fc,sgd"], "--algorithms"),
    (["--algorithms", "fc,fc"], "--algorithms"),
    (["--model", "mlp,cnn"], "--model"),
    (["--seed", "-1"], "--seed"),
])
def test_bad_values_name_the_option(argv, option, tmp_path, capsys):
  """Failed before cli.py existed: synthetic.py accepted `--lrs nan` (exit 0,
  NaN table) and `--algorithms ""` (failed at the CSV write)."""
  with pytest.raises(SystemExit) as e:
    cli.parse(_parser(tmp_path), argv)
  assert e.value.code == 2
  assert f"argument {option}:" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()  # Nothing made before validation.


def test_check_runs_after_types_and_becomes_usage_error(tmp_path, capsys):
  def check(args):
    if args.rounds < 10:
      raise ValueError("`--rounds` must be >= 10 here.")
  with pytest.raises(SystemExit):
    cli.parse(_parser(tmp_path), [], check=check)
  assert "`--rounds` must be >= 10" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()
  assert cli.parse(_parser(tmp_path), ["--rounds", "10"], check=check).rounds


def test_unwritable_out_is_found_before_running(tmp_path, capsys):
  """A file in the way of `--out` (works as root, unlike chmod)."""
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(SystemExit):
    cli.parse(_parser(tmp_path), ["--out", str(blocker / "sub")])
  err = capsys.readouterr().err
  assert "argument --out:" in err and "not writable" in err
  # A writable one is created and left without the probe file.
  cli.parse(_parser(tmp_path), ["--out", str(tmp_path / "new" / "dir")])
  assert os.listdir(tmp_path / "new" / "dir") == []


def test_smoke_defaults_are_validated_and_explicit_options_win(tmp_path):
  p = lambda: _parser(tmp_path, smoke={"rounds": "2", "lrs": "0.5"})
  args = cli.parse(p(), ["--smoke"])
  assert args.smoke and args.rounds == 2 and args.lrs == (0.5,)
  args = cli.parse(p(), ["--smoke", "--rounds", "3"])
  assert args.rounds == 3
  assert cli.parse(p(), []).rounds == 5
  bad = _parser(tmp_path, smoke={"rounds": "0"})
  with pytest.raises(SystemExit):
    cli.parse(bad, ["--smoke"])


def test_write_config_records_versions_backend_and_seed(tmp_path):
  args = cli.parse(_parser(tmp_path), ["--seed", "3", "--lrs", "0.2"])
  path = cli.write_config(args.out, args, extra={"note": "x"})
  record = json.loads(open(path).read())
  assert path == os.path.join(args.out, "config.json")
  assert record["seed"] == 3 and record["config"]["lrs"] == [0.2]
  assert set(record["versions"]) == {"python", "jax", "jaxlib", "flax",
                                     "optax", "numpy"}
  assert all(record["versions"].values())
  assert record["platform"]["backend"] in ("cpu", "gpu", "tpu")
  assert record["note"] == "x" and record["command"]
  assert not [f for f in os.listdir(args.out) if f.startswith(".tmp-")]
  with pytest.raises(TypeError, match="config"):
    cli.write_config(args.out, [1, 2])


def test_write_csv_refuses_no_rows(tmp_path):
  """Failed before with a bare IndexError (how `--algorithms ""` ended)."""
  from experiments import common  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="no rows"):
    common.write_csv(str(tmp_path / "s.csv"), [])
  assert not list(tmp_path.iterdir())


def test_compile_cache_follows_the_environment(tmp_path, monkeypatch):
  """`PRFL_JAX_COMPILE_CACHE`: a directory turns JAX's persistent cache on
  there; `off` leaves it off (mutation seen to fail: ignoring the variable)."""
  import jax  # pylint: disable=import-outside-toplevel
  before = jax.config.jax_compilation_cache_dir
  try:
    monkeypatch.setenv(cli.CACHE_ENV, "off")
    assert cli.enable_compile_cache() is None
    assert jax.config.jax_compilation_cache_dir == before
    path = str(tmp_path / "xla")
    monkeypatch.setenv(cli.CACHE_ENV, path)
    assert cli.enable_compile_cache() == path
    assert jax.config.jax_compilation_cache_dir == path
    assert cli.platform_info()["compile_cache"] == path
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def _toy_main(tmp_path, argv, monkeypatch=None):
  """`cli.run_main` on a one-option experiment; returns what `run` saw."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass(frozen=True)
  class Config:
    rounds: int
    out: str

  def build_parser():
    p = cli.parser("Toy.", out=str(tmp_path / "default"))
    p.add_argument("--rounds", type=cli.integer(minimum=1), default=3)
    return p

  def resolve(cfg):
    if cfg.rounds > 10:
      raise ValueError(f"`--rounds` must be <= 10, got {cfg.rounds}.")
    return dataclasses.replace(cfg, out=cfg.out + "_resolved")

  calls = []

  def run(cfg, log, command=""):
    calls.append((cfg, command))
    return "done"

  result = cli.run_main("experiments.toy", build_parser,
                        lambda a: Config(a.rounds, a.out), resolve, run, argv)
  return result, calls


def test_run_main_resolves_once_writes_config_and_records_the_command(
    tmp_path, monkeypatch):
  """The resolved config reaches `run` and config.json; the command is the one
  typed, from `sys.argv` when `argv` is None (mnist recorded no options).

  Mutation seen to fail: `argv = list(argv or [])` in `run_main`.
  """
  out = str(tmp_path / "o")
  monkeypatch.setattr("sys.argv", ["mnist.py", "--rounds", "4", "--out", out])
  result, calls = _toy_main(tmp_path, None)
  assert result == "done"
  ((cfg, command),) = calls
  assert (cfg.rounds, cfg.out) == (4, out + "_resolved")
  assert command == f"python -m experiments.toy --rounds 4 --out {out}"
  with open(os.path.join(out + "_resolved", "config.json")) as f:
    assert json.load(f)["config"]["rounds"] == 4


def test_run_main_bad_combination_is_a_usage_error_before_run(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    _toy_main(tmp_path, ["--rounds", "11", "--out", str(tmp_path / "x")])
  assert e.value.code == 2
  assert "`--rounds` must be <= 10, got 11" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "x_resolved")


def test_check_dataset_names_the_option_and_its_values():
  """A config built in code (not through argparse) gets the same messages."""
  cli.check_dataset("digits", "auto", ("digits", "mnist"))
  with pytest.raises(ValueError, match=r"--dataset must be one of digits, "
                     r"mnist, got 'cifar'"):
    cli.check_dataset("cifar", "auto", ("digits", "mnist"))
  with pytest.raises(ValueError, match=r"--source must be one of auto, .*"
                     r"got 'web'"):
    cli.check_dataset("digits", "web", ("digits", "mnist"))
