"""End-to-end `--smoke` runs of the CIFAR experiments and their option checks.

Mutations that these tests caught (each applied once, then restored):
- `to_cifar_shape` padding (2, 2) -> (0, 4): `test_to_cifar_shape_pads_and_tiles`
  fails (the digit is no longer centred).
- removing the repeated-value check of tuple options (`options.Option.problem`):
  `test_bad_options_exit_before_any_output[repeated quantile]` fails.
- removing the `--image-size` pool check in `cifar.resolve`:
  `test_bad_options_exit_before_any_output[vgg16 at 16 pixels]` fails (the run
  starts and writes config.json).
"""

import csv
import json
import os

import numpy as np
import pytest

from experiments import cifar10
from experiments import cifar100
from experiments import cifar as cc
from prfl_jax.data import datasets


def _read(out, name):
  with open(os.path.join(out, name)) as f:
    return f.read()


def test_to_cifar_shape_pads_and_tiles():
  x = np.arange(2 * 28 * 28, dtype=np.float32).reshape(2, 28, 28, 1) / 2000
  y = cc.to_cifar_shape(x, 32)
  assert y.shape == (2, 32, 32, 3)
  np.testing.assert_array_equal(y[:, 2:30, 2:30, 1], x[..., 0])
  np.testing.assert_array_equal(y[..., 0], y[..., 2])
  assert not y[:, :2].any() and not y[:, 30:].any() and not y[:, :, :2].any()
  # Resizing keeps the leading axes and a constant image constant.
  z = cc.to_cifar_shape(np.full((3, 4, 32, 32, 3), 0.5, np.float32), 8)
  assert z.shape == (3, 4, 8, 8, 3)
  np.testing.assert_allclose(z, 0.5, rtol=1e-6)


def test_synthetic_dataset_is_balanced_and_deterministic():
  a = cc.synthetic_dataset(10, 40, seed=3)
  b = cc.synthetic_dataset(10, 40, seed=3)
  np.testing.assert_array_equal(a.images, b.images)
  assert a.images.shape == (40, 32, 32, 3) and a.images.dtype == np.float32
  np.testing.assert_array_equal(np.bincount(a.labels), np.full(10, 4))
  assert "SYNTHETIC" in a.source


def test_cifar10_smoke_writes_every_output(tmp_path, capsys):
  """Every output of Figure 4's run, every panel.

  On the MLP stand-in (`--model mlp`): the outputs do not depend on the
  model, and FC's four compiles of the smoke CNN took 189 s of a CI run.
  The CNN runs through the experiment in the CIFAR-100 tests below.
  """
  out = str(tmp_path / "c10")
  runs = cifar10.main(["--smoke", "--model", "mlp", "--out", out,
                       "--progress", "lines"])
  stdout = capsys.readouterr().out
  assert "SYNTHETIC" in stdout and "[4/4]" in stdout
  # Left panel (fc, local), the radius sweep and the local-steps sweep.
  assert set(runs) == {"fc", "local", "fc_q0.5", "fc_local1"}
  for r in runs.values():
    assert r["eval_round"].tolist() == [0, 1, 2]
    assert np.all((r["curve_accuracy"] >= 0) & (r["curve_accuracy"] <= 1))
  config = json.loads(_read(out, "config.json"))
  assert config["config"]["dataset"] == "synthetic"
  assert config["config"]["smoke"] is True
  results = json.loads(_read(out, "results.json"))
  assert results["synthetic_data"] is True
  assert "private_label" in results["federation"]
  assert [r["panel"] for r in csv.DictReader(open(
      os.path.join(out, "summary.csv")))] == [
          "algorithms", "algorithms", "radius", "local_steps"]
  with open(os.path.join(out, "summary.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["run"] for r in rows] == [
      "FC (ours)", "Local", "FC, 50th percentile", "FC, 1 local steps"]
  assert "SYNTHETIC" in _read(out, "results.md")
  assert os.path.getsize(os.path.join(out, "figure4.png")) > 1000


def _write_cifar100_binaries(directory, records=100, seed=0):
  """Tiny `train.bin` / `test.bin` in the CIFAR-100 binary record format."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory)
  for name in ("train.bin", "test.bin"):
    fine = np.arange(records, dtype=np.uint8) % 100
    rows = np.concatenate(
        [np.zeros((records, 1), np.uint8), fine[:, None],
         rng.integers(0, 256, (records, 3072), dtype=np.uint8)], axis=1)
    with open(os.path.join(directory, name), "wb") as f:
      f.write(rows.tobytes())


def test_cifar100_smoke_on_cifar_binary_files(tmp_path, capsys):
  """CIFAR-100's binary files load into label blocks, and a run on them
  writes its outputs.

  Global only: FC's compile of the smoke CNN is what made this test take
  100 s in CI, and the loader does not depend on the algorithm. FC on a
  Flax CNN is checked in test_kernels_conv.py (ghost against Gram centres)
  and through this experiment's code in the CIFAR-10 smoke run above.
  """
  data = str(tmp_path / "cifar-100-binary")
  _write_cifar100_binaries(data)
  out = str(tmp_path / "c100")
  runs = cifar100.main(["--smoke", "--dataset", "cifar100", "--data-dir", data,
                        "--out", out, "--no-plots", "--algorithms", "global"])
  stdout = capsys.readouterr().out
  assert "SYNTHETIC" not in stdout and "cifar100 train+test" in stdout
  assert set(runs) == {"global"}
  results = json.loads(_read(out, "results.json"))
  assert results["num_classes"] == 100 and not results["synthetic_data"]
  assert "label_blocks" in results["federation"]
  assert not os.path.exists(os.path.join(out, "figure5.png"))
  with open(os.path.join(out, "summary.csv")) as f:
    assert [r["run"] for r in csv.DictReader(f)] == ["Global (FedAvg)"]


def test_cifar100_smoke_synthetic_plots(tmp_path):
  out = str(tmp_path / "c100s")
  cifar100.main(["--smoke", "--out", out, "--algorithms", "global"])
  assert os.path.getsize(os.path.join(out, "figure5.png")) > 1000
  assert "SYNTHETIC" in _read(out, "results.md")


@pytest.mark.parametrize("module,argv,message", [
    (cifar10, ["--rounds", "0"], "--rounds"),
    (cifar10, ["--rounds", "5", "--eval-every", "10"], "--eval-every"),
    (cifar10, ["--model", "vgg16", "--image-size", "16"], "--image-size"),
    (cifar10, ["--data-dir", "."], "--data-dir"),
    (cifar10, ["--algorithms", "fc,knn"], "--algorithms"),
    (cifar10, ["--panel-quantiles", "0.2,1.5"], "--panel-quantiles"),
    (cifar10, ["--panel-quantiles", "0.2,0.2"], "--panel-quantiles"),
    (cifar10, ["--panel-local-steps", "-1"], "--panel-local-steps"),
    (cifar10, ["--train-per-client", "8", "--test-per-client", "2",
               "--batch-size", "16"], "--batch-size"),
    (cifar100, ["--clusters", "3"], "--clusters"),
    (cifar100, ["--data-dir", "/nonexistent/cifar"], "--data-dir"),
    (cifar100, ["--algorithms", "ditto"], "--algorithms"),
], ids=["rounds 0", "eval-every > rounds", "vgg16 at 16 pixels",
        "synthetic with data dir", "unknown algorithm", "quantile > 1",
        "repeated quantile", "negative local steps",
        "batch > train", "classes not divisible", "missing data dir",
        "algorithm not in figure 5"])
def test_bad_options_exit_before_any_output(tmp_path, capsys, module, argv,
                                            message):
  out = str(tmp_path / "out")
  # --smoke: synthetic data, so that no other check (e.g. missing CIFAR files)
  # fires first; explicit options win over its defaults.
  with pytest.raises(SystemExit) as e:
    module.main(argv + ["--smoke", "--out", out])
  assert e.value.code == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert "error:" in error and message in error, error
  assert not os.path.exists(os.path.join(out, "config.json"))


def test_cifar_without_data_names_the_option(tmp_path, capsys, monkeypatch):
  # Without tensorflow-datasets (the test extra installs it; with it, CIFAR
  # may come from tfds and this error is not raised).
  monkeypatch.setattr(datasets, "tfds_installed", lambda: False)
  out = str(tmp_path / "out")
  empty = str(tmp_path / "empty")
  os.makedirs(empty)
  for argv in (["--dataset", "cifar10"], ["--data-dir", empty]):
    with pytest.raises(SystemExit):
      cifar10.main(argv + ["--out", out])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in error and "--data-dir" in error, error
  assert not os.path.exists(os.path.join(out, "config.json"))
