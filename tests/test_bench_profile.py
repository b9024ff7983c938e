"""Smoke test of `benchmarks/profile_cnn.py` on a tiny CNN: every part of
the round compiles and runs; the numbers come from full runs only."""

import pytest

from benchmarks import profile_cnn


@pytest.mark.slow
def test_profile_names_every_layer_and_the_round(capsys):
  """Per layer (2 convolutions, 2 dense layers): its tokens and materialised
  weight gradients, and its ghost Gram where the kernel takes (*); plus the
  round's other parts.

  `slow` (31 CPU-seconds; not in CI): it checks the profile's printout; the
  values of the parts it times (ghost Gram, combination, clustering) are
  checked in CI by test_ghost.py, test_kernels_conv.py and
  test_kernels_trace.py.
  """
  assert profile_cnn.main(["--clients", "2", "--batch-size", "2",
                           "--width-divisor", "16", "--repeats", "1",
                           "--no-torch"]) == 0
  out = capsys.readouterr().out
  for k in range(4):
    assert out.count(f"layer {k} ") in (2, 3)
  assert out.count("input tokens") == out.count("weight grads a^T d") == 4
  assert out.count("ghost Gram (*)") == out.count(" (*): input tokens")
  for part in ("forward", "tapped fwd+bwd", "ghost_grads", "combine",
               "clustering", "round / N"):
    assert part in out
