"""Smoke test of tools/mutation/: every preset still resolves, its mutants are
valid Python and each can be swapped in by an in-process worker (the tool is
run by hand, not in CI)."""

import ast

import pytest

from tools import mutation as tool


def _mutants(preset):
  mutants = []
  for target in tool.resolve_preset(preset):
    if target.edit is not None:
      e = target.edit
      mutants.append(tool.edit_mutant(target.path, target.spec, e.old, e.new,
                                      e.why, len(mutants)))
    else:
      mutants += tool.generate(target.path, target.spec, len(mutants))
  return mutants


def test_core_preset_resolves_and_mutants_compile(capsys):
  assert tool.main(["--preset", "core", "--list"]) == 0
  listing = capsys.readouterr().out
  # Every core module is found (wherever the engine keeps it) with its tests.
  for name in ("clustering/radius.py:", "clustering/threshold.py:", "ghost.py:",
               "federated_clustering.py:"):
    assert name in listing
  # The rank formula of the quantile is among the mutants.
  assert "'count - 1' -> 'count + 1'" in listing
  # So is the owner-centring of the Gram kernels (its `+ G_ii` term): the
  # engine's kernel registry once moved it out of the preset's reach, where
  # it was skipped with a note only.
  assert "'gram - col[:, None] - col[None, :] + gram[index, index]' -> " in (
      listing)
  assert len(_mutants("core")) > 50


@pytest.mark.parametrize("preset", sorted(tool.PRESETS))
def test_preset_mutants_compile_and_apply_in_process(preset):
  mutants = _mutants(preset)
  assert mutants
  for m in mutants[::25] + [m for m in mutants if m.kind == "edit"]:
    source = tool.mutated_source(m)
    ast.parse(source)
    with open(m.path, encoding="utf-8") as f:
      assert source not in (f.read(), tool.unparsed_source(m.path))
    tool.inprocess_site(m.path, m.line)  # In-process mode applies.
