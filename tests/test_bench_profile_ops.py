"""Smoke test of `benchmarks/profile_ops.py`: the traced round's ops are
found and named; the numbers come from full runs only."""

import pytest

from benchmarks import profile_ops


def test_op_sources_reads_names_shapes_and_origins():
  """Instructions with their shape and op_name; control flow left out.

  Seen to fail when the control-flow filter is dropped (`while.3` listed).
  """
  hlo = ('  %fusion.2 = f32[8,3]{1,0} fusion(%p), kind=kLoop, metadata='
         '{op_name="jit(f)/while/body/vmap(jvp())/concatenate"}\n'
         '  ROOT %dot.7 = f32[4,4]{1,0} dot(%a, %b)\n'
         '  %while.3 = (s32[]) while(%t), body=%b\n')
  assert profile_ops.op_sources(hlo) == {
      "fusion.2": "f32[8,3] vmap(jvp())/concatenate", "dot.7": "f32[4,4] "}


@pytest.mark.slow
def test_tiny_round_lists_its_ops(capsys):
  """`slow` (compiles of a CNN and an MLP round, ~20 CPU-seconds; not in
  CI)."""
  assert profile_ops.main(["--clients", "2", "--batch-size", "2",
                           "--width-divisor", "16", "--repeats", "1",
                           "--top", "5"]) == 0
  out = capsys.readouterr().out
  assert "concatenate" in out and "all ops" in out
  assert profile_ops.main(["--model", "user_mlp", "--clients", "2",
                           "--batch-size", "2", "--repeats", "1"]) == 0
  assert "dot_general" in capsys.readouterr().out
