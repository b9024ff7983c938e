"""experiments/options.py and experiments/cli.py: options declared once, the
command line and config files built from them, the run sequence."""

import dataclasses
import json
import os
from typing import Optional, Union

import pytest

from experiments import cli
from experiments import files
from experiments import options
from experiments.options import group, option


@dataclasses.dataclass(frozen=True)
class _Inner:
  rounds: int = option(5, "rounds", low=1)
  quantile: float = option(0.2, "radius quantile", low=0, high=1,
                           low_open=True)
  chunk: Union[int, str] = option("auto", "chunk", low=1,
                                  keywords=("auto", "all"))


@dataclasses.dataclass(frozen=True)
class _Toy:
  inner: _Inner = group(_Inner, rounds=7)
  lrs: tuple[float, ...] = option((0.1, 0.05), "learning rates", low=0,
                                  low_open=True)
  algorithms: tuple[str, ...] = option(("fc", "ifca"), "algorithms",
                                       choices=("fc", "ifca", "local"))
  model: str = option("mlp", "model", choices=("mlp", "cnn"))
  size: Optional[int] = option(None, "size (auto: by data)", low=1)
  out: Optional[str] = option(None, "output directory")
  plots: bool = option(True, "plots")
  per_algorithm: dict = option({}, "per-algorithm settings",
                               choices=("fc", "ifca", "local"),
                               groups=(_Inner,))


def _parse(argv):
  return cli.parse(_Toy, argv)[0]


def test_defaults_group_overrides_and_good_values():
  cfg = _parse([])
  assert cfg.inner.rounds == 7 and cfg.lrs == (0.1, 0.05)  # group(rounds=7).
  assert options.to_dict(cfg) == {
      "rounds": 7, "quantile": 0.2, "chunk": "auto", "lrs": (0.1, 0.05),
      "algorithms": ("fc", "ifca"), "model": "mlp", "size": None,
      "out": None, "plots": True, "per_algorithm": {}}
  cfg = _parse(["--rounds", "3", "--quantile", "1", "--lrs", "3e-2",
                "--algorithms", "local", "--model", "cnn", "--size", "4",
                "--chunk", "8", "--no-plots", "--per-algorithm",
                "fc.rounds=9", "--per-algorithm", "ifca.chunk=all"])
  assert (cfg.inner.rounds, cfg.inner.quantile, cfg.lrs, cfg.algorithms,
          cfg.model, cfg.size, cfg.inner.chunk, cfg.plots) == (
              3, 1.0, (0.03,), ("local",), "cnn", 4, 8, False)
  assert cfg.per_algorithm == {"fc": {"rounds": 9}, "ifca": {"chunk": "all"}}
  assert _parse(["--size", "auto"]).size is None


@pytest.mark.parametrize("argv, flag", [
    (["--rounds", "-5"], "--rounds"),
    (["--rounds", "2.5"], "--rounds"),
    (["--quantile", "0"], "--quantile"),  # (0, 1]: 0 excluded.
    (["--quantile", "nan"], "--quantile"),
    (["--lrs", "inf"], "--lrs"),
    (["--lrs", "0.1,,0.2"], "--lrs"),
    (["--lrs", ""], "--lrs"),
    (["--lrs", "0.1,0.1"], "--lrs"),
    (["--algorithms", "fc,sgd"], "--algorithms"),
    (["--algorithms", "fc,fc"], "--algorithms"),
    (["--model", "mlp,cnn"], "--model"),
    (["--chunk", "some"], "--chunk"),
    (["--out", ""], "--out"),
    (["--per-algorithm", "fc.rounds"], "--per-algorithm"),
    (["--per-algorithm", "fc.rounds=0"], "--per-algorithm fc.rounds"),
    (["--per-algorithm", "fc.model=cnn"], "not a per-algorithm setting"),
    (["--per-algorithm", "sgd.rounds=3"], "unknown algorithm"),
])
def test_bad_values_name_the_option(argv, flag, capsys):
  """`--out ''` used to mean the default output directory silently (issue
  21); seen to fail with the empty-string check of `Option.problem`
  removed."""
  with pytest.raises(SystemExit) as e:
    _parse(argv)
  assert e.value.code == 2
  assert flag in capsys.readouterr().err


def test_config_files_are_flat_later_wins_and_flags_win_over_files(tmp_path):
  a, b = tmp_path / "a.toml", tmp_path / "b.toml"
  a.write_text('rounds = 3\nlrs = [0.5, 0.25]\nmodel = "cnn"\n'
               '[per_algorithm.fc]\nquantile = 0.5\n')
  b.write_text("rounds = 4\n[per_algorithm.fc]\nrounds = 2\n")
  cfg = _parse(["--config", str(a), "--config", str(b)])
  assert (cfg.inner.rounds, cfg.lrs, cfg.model) == (4, (0.5, 0.25), "cnn")
  assert cfg.per_algorithm == {"fc": {"quantile": 0.5, "rounds": 2}}
  cfg = _parse(["--config", str(a), "--rounds", "9", "--per-algorithm",
                "fc.quantile=0.75"])
  assert cfg.inner.rounds == 9 and cfg.per_algorithm["fc"]["quantile"] == 0.75
  # A saved config.json is a config file too (its "config" entry).
  record = tmp_path / "config.json"
  record.write_text(json.dumps(
      {"config": options.to_dict(cfg), "versions": {}}, default=list))
  assert _parse(["--config", str(record)]) == cfg


@pytest.mark.parametrize("text, message", [
    ("round = 3\n", "unknown option 'round'"),
    ("rounds = 0\n", "--rounds (rounds in"),
    ("rounds = 2.5\n", "--rounds (rounds in"),
    ("lrs = 0.1\n", "--lrs (lrs in"),
    ("plots = 1\n", "--plots (plots in"),
    ("rounds = \n", "not valid TOML"),
])
def test_bad_config_files_name_the_option_and_the_file(text, message,
                                                       tmp_path, capsys):
  path = tmp_path / "bad.toml"
  path.write_text(text)
  with pytest.raises(SystemExit):
    _parse(["--config", str(path)])
  err = capsys.readouterr().err
  assert message in err and "bad.toml" in err


def test_presets_apply_under_files_and_flags(tmp_path):
  """`--smoke` applies the experiment's smoke file below explicit values."""
  preset = tmp_path / "smoke.toml"
  preset.write_text("rounds = 2\nlrs = [0.5]\n")
  presets = {"plots": str(preset)}  # A boolean option switches a preset.
  cfg = cli.parse(_Toy, ["--plots", "--rounds", "3"], presets=presets)[0]
  assert (cfg.inner.rounds, cfg.lrs) == (3, (0.5,))
  cfg = cli.parse(_Toy, ["--no-plots"], presets=presets)[0]
  assert cfg.lrs == (0.1, 0.05)


def test_help_shows_every_option_with_its_experiment_default():
  text = cli.build_parser(_Toy, "Toy.").format_help()
  for o in options.walk(_Toy):
    assert o.flag in text
  assert "rounds; >= 1 (default: 7)" in text  # The group override's value.


def test_every_name_is_declared_once_within_a_configuration():
  @dataclasses.dataclass(frozen=True)
  class Twice:
    inner: _Inner = group(_Inner)
    rounds: int = option(1, "again")
  with pytest.raises(TypeError, match="rounds"):
    options.walk(Twice)
  with pytest.raises(TypeError, match="no option"):
    group(_Inner, round=3)


def test_check_writable_probes_without_leaving_anything(tmp_path):
  """A file in the way of `--out` (works as root, unlike chmod)."""
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(ValueError, match="--out"):
    cli.check_writable(str(blocker / "sub"))
  cli.check_writable(str(tmp_path / "new" / "dir"))
  assert sorted(os.listdir(tmp_path)) == ["file"]  # Nothing made.


def test_atomic_writes_leave_no_partial_file(tmp_path):
  path = str(tmp_path / "x.json")
  files.write_json(path, {"a": 1})

  def fail(f):
    f.write("half")
    raise RuntimeError("disk full")
  with pytest.raises(RuntimeError):
    files.atomic_write(path, fail)
  assert json.load(open(path)) == {"a": 1}
  assert os.listdir(tmp_path) == ["x.json"]
  with pytest.raises(ValueError, match="no rows"):
    files.write_csv(str(tmp_path / "s.csv"), [])


def test_run_record_holds_versions_platform_and_command():
  record = files.run_record({"seed": 3}, "python -m experiments.toy")
  assert record["seed"] == 3 and record["command"].endswith("toy")
  assert record["versions"]["jax"] and record["versions"]["python"]
  assert record["platform"]["backend"] in ("cpu", "gpu", "tpu")


def test_compile_cache_follows_the_environment(tmp_path, monkeypatch):
  """`PRFL_JAX_COMPILE_CACHE`: a directory turns JAX's persistent cache on
  there; `off` leaves it off (mutation seen to fail: ignoring the variable)."""
  import jax  # pylint: disable=import-outside-toplevel
  before = jax.config.jax_compilation_cache_dir
  min_time = jax.config.jax_persistent_cache_min_compile_time_secs
  try:
    monkeypatch.setenv(cli.CACHE_ENV, "off")
    assert cli.enable_compile_cache() is None
    assert jax.config.jax_compilation_cache_dir == before
    path = str(tmp_path / "xla")
    monkeypatch.setenv(cli.CACHE_ENV, path)
    assert cli.enable_compile_cache() == path
    assert jax.config.jax_compilation_cache_dir == path
    assert files.platform_info()["compile_cache"] == path
  finally:  # The suite's cache (tests/conftest.py) for the next tests.
    jax.config.update("jax_compilation_cache_dir", before)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)


def _with_run_group():
  from experiments import groups  # pylint: disable=import-outside-toplevel

  @dataclasses.dataclass(frozen=True)
  class ToyRun:
    inner: _Inner = group(_Inner)
    run: groups.Run = group(groups.Run, tensorboard=False, progress="lines")
  return ToyRun


def _toy_experiment(calls, prepare=lambda cfg: "data"):
  def resolve(cfg):
    if cfg.inner.rounds > 10:
      raise ValueError(f"--rounds must be <= 10, got {cfg.inner.rounds}.")
    return cfg

  def run(cfg, prepared, tracker, command=""):
    calls.append((cfg, prepared, command))
    tracker.log("ran")
    return "done"
  return cli.Experiment("toy", "Toy.", _with_run_group(), resolve, prepare,
                        run)


def test_main_resolves_loads_then_writes_config_and_runs(tmp_path, capsys):
  calls = []
  exp = _toy_experiment(calls)
  out = str(tmp_path / "o")
  assert cli.main(exp, ["--rounds", "4", "--out", out]) == "done"
  ((cfg, prepared, command),) = calls
  assert cfg.inner.rounds == 4 and prepared == "data"
  assert command == f"python -m experiments.toy --rounds 4 --out {out}"
  with open(os.path.join(out, "config.json")) as f:
    record = json.load(f)
  assert record["config"]["rounds"] == 4 and record["command"] == command
  assert "ran" in capsys.readouterr().out


def test_main_bad_combination_and_bad_data_write_nothing(tmp_path, capsys):
  """Data errors used to come as tracebacks after config.json was written
  (issue 21): now the data are loaded before anything is written, and a
  failure is one line naming the problem. Seen to fail with the config
  written before `prepare`."""
  calls = []
  exp = _toy_experiment(calls)
  out = tmp_path / "o"
  with pytest.raises(SystemExit) as e:
    cli.main(exp, ["--rounds", "11", "--out", str(out)])
  assert e.value.code == 2 and "--rounds must be <= 10, got 11" in (
      capsys.readouterr().err)

  def missing(cfg):
    raise FileNotFoundError("no source found for 'fashion_mnist'")
  exp = exp._replace(prepare=missing)
  with pytest.raises(SystemExit) as e:
    cli.main(exp, ["--out", str(out)])
  assert e.value.code == 1
  err = capsys.readouterr().err
  assert "cannot load the data: no source found" in err
  assert "Traceback" not in err
  assert not out.exists() and not calls
