"""Smoke tests of `benchmarks/bench_models.py` on tiny sizes.

They check that the configurations agree (the exit status: every centre within
1e-3 relative of the Gram kernel's) and that the PyTorch twins of the Flax
models compute the same function; the speed numbers come from full runs only.
"""

import json

import jax
import numpy as np
import pytest

from benchmarks import bench_models
from benchmarks import torch_loop
from benchmarks import zoo


@pytest.mark.torch
@pytest.mark.slow
def test_smoke_run_agrees_and_writes_json(tmp_path):
  """`--smoke` on the CNN: torch loop, Gram and automatic kernels agree.

  `slow` (a benchmark smoke run, 26 CPU-seconds; not in CI): CI checks the
  PyTorch twins against the Flax models in
  test_torch_twin_computes_the_flax_model, and the ghost kernel's centres
  against the Gram kernel's on a Flax CNN in
  test_kernels_conv.py::test_engine_ghost_centres_equal_gram_on_a_flax_cnn.
  """
  pytest.importorskip("torch")
  out = tmp_path / "models.json"
  assert bench_models.main(["--smoke", "--models", "cnn", "--out",
                            str(out)]) == 0
  record = json.loads(out.read_text())
  assert record["complete"]  # Saved after every (model, N), then complete.
  rows = record["rows"]
  configs = {r["config"] for r in rows}
  assert configs == {"torch-loop/1t", "prfl gram", "prfl auto"}
  for r in rows:
    assert r["time_s"] > 0 and r["rel_diff"] < 1e-3
  auto = next(r for r in rows if r["config"] == "prfl auto")
  assert auto["plan"].endswith("/ghost")  # The conv layers were found.


@pytest.mark.torch
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n == "vgg8" else n
    for n in sorted(zoo.SPECS)])
def test_torch_twin_computes_the_flax_model(name):
  """Same logits from the Flax model and its PyTorch twin (widths / 16).

  VGG-8 is `slow` (24 CPU-seconds; not in CI): its twin is built by the
  same code from the same layer kinds as the two CNNs that CI checks.
  """
  torch = pytest.importorskip("torch")
  spec = zoo.SPECS[name].scaled(16)
  model, _ = zoo.make_loss(spec)
  images = np.random.default_rng(0).random((3,) + spec.image, np.float32)
  params = jax.jit(model.init)(jax.random.key(1), images)
  with jax.default_matmul_precision("highest"):  # fp32 as torch on CPU.
    logits = jax.jit(model.apply)(params, images)
  net = torch_loop.torch_net(torch, spec, params)
  with torch.no_grad():
    theirs = net(torch.from_numpy(images).permute(0, 3, 1, 2))
  np.testing.assert_allclose(theirs.numpy(), logits, rtol=1e-4, atol=1e-5)


def test_bad_arguments_exit_before_any_work(capsys):
  """Invalid values are rejected by argparse (status 2) with the option named."""
  for argv in (["--clients", "1"], ["--models", "resnet"],
               ["--configs", "prfl gram,prfl gram"], ["--radius", "x"]):
    with pytest.raises(SystemExit) as e:
      bench_models.main(argv)
    assert e.value.code == 2
  assert "--clients" in capsys.readouterr().err
