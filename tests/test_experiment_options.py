"""Every experiment's options: declared once, and the command line, the saved
config.json, the config files and the help agree.

Mutations seen to fail these tests: a second declaration of `rounds` in an
experiment module (the one-declaration test), `Kind.format` writing tuples
with "; " (the round trip), a preset key misspelt (the presets test).
"""

import glob
import json
import os

import pytest

from experiments import byzantine
from experiments import cifar10
from experiments import cifar100
from experiments import cli
from experiments import failure_modes
from experiments import files
from experiments import mnist
from experiments import momentum_variants
from experiments import options
from experiments import sweep
from experiments import synthetic
from experiments import theorem2
from experiments import threshold_clustering

EXPERIMENTS = {e.name: e for e in (
    mnist.EXPERIMENT, byzantine.EXPERIMENT, cifar10.EXPERIMENT,
    cifar100.EXPERIMENT, synthetic.EXPERIMENT, threshold_clustering.EXPERIMENT,
    failure_modes.EXPERIMENT, sweep.EXPERIMENT, theorem2.EXPERIMENT,
    momentum_variants.EXPERIMENT)}


def _declarations():
  """Option name -> the set of declarations (option specs) using it."""
  found = {}
  for exp in EXPERIMENTS.values():
    for o in options.walk(exp.config):
      found.setdefault(o.name, set()).add(id(o.spec))
  return found


def test_every_option_name_has_exactly_one_declaration():
  twice = {n: len(d) for n, d in _declarations().items() if len(d) > 1}
  assert not twice, f"options declared more than once: {twice}"


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_cli_saved_config_and_help_agree(name, tmp_path, monkeypatch):
  """Each option: its flag is in the help with the experiment's default; the
  default written as on a command line parses back to itself; the saved
  config (`to_dict`) has it under its name and re-reads to the same
  configuration; every experiment has its experiment's smoke preset."""
  monkeypatch.setenv("COLUMNS", "100000")  # No help line wrapped.
  exp = EXPERIMENTS[name]
  default = exp.config()
  parser = cli.build_parser(exp.config, exp.doc)
  text = " ".join(parser.format_help().split())
  saved = options.to_dict(default)
  argv = []
  for o in options.walk(exp.config):
    assert o.flag in text, o.flag
    assert o.name in saved
    if o.kind.mapping:  # Per-algorithm settings and grids: test_cli.py.
      continue
    if o.kind.item is bool and not o.kind.tuple:
      argv.append(o.flag if o.value else "--no-" + o.flag[2:])
    else:
      argv += [o.flag, o.kind.format(o.value)]
    shown = "(default: " + (o.kind.format(o.value) or "''")
    assert shown in text, (o.flag, shown)
  assert cli.parse(exp.config, argv)[0] == default
  record = tmp_path / "config.json"
  record.write_text(json.dumps(files.to_jsonable(
      files.run_record(saved, "x"))))
  assert cli.parse(exp.config, ["--config", str(record)])[0] == default
  assert os.path.exists(cli.preset(name, "smoke"))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(
    cli.CONFIGS, "*", "*.toml"))),
                         ids=lambda p: os.path.relpath(p, cli.CONFIGS))
def test_every_committed_config_file_parses_and_resolves(path):
  """Presets are checked like command lines: a misspelt key or a value out of
  bounds fails here, not in a long run."""
  exp = EXPERIMENTS[os.path.basename(os.path.dirname(path))]
  cfg, _ = cli.parse(exp.config, ["--config", path])
  if exp.config.__module__.startswith("experiments.cifar") and (
      cfg.data.dataset in ("cifar10", "cifar100", "fashion_mnist")):
    return  # Resolving checks that the data are on this machine.
  exp.resolve(cfg)
