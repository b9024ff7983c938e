"""Tests of prfl_jax.data's loaders on files the tests write (no downloads)."""

import gzip
import os
import re
import sys
import tarfile

import numpy as np
import pytest

import prfl_jax as prfl
from prfl_jax.data import datasets
from prfl_jax.data import idx

IDX_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def idx_bytes(array: np.ndarray) -> bytes:
  """An IDX file of a uint8 array, written by hand from the format spec."""
  header = bytes([0, 0, 0x08, array.ndim])
  header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
  return header + array.astype(np.uint8).tobytes()


def write(path, data: bytes, gz: bool = False):
  if gz:
    with gzip.open(str(path) + ".gz", "wb") as f:
      f.write(data)
  else:
    with open(path, "wb") as f:
      f.write(data)


def write_mnist(directory, gz=False, sizes=(6, 4), labels_max=10, seed=0):
  """Writes the four MNIST files; returns {split: (images, labels)}."""
  rng = np.random.default_rng(seed)
  out = {}
  for split, m in zip(("train", "test"), sizes):
    images = rng.integers(0, 256, (m, 5, 5), dtype=np.uint8)
    labels = rng.integers(0, labels_max, m, dtype=np.uint8)
    write(directory / IDX_NAMES[split][0], idx_bytes(images), gz)
    write(directory / IDX_NAMES[split][1], idx_bytes(labels), gz)
    out[split] = images, labels
  return out


@pytest.fixture(name="no_tfds")
def fixture_no_tfds(monkeypatch):
  """Makes tensorflow-datasets look absent, as in CI."""
  monkeypatch.setattr(datasets, "tfds_installed", lambda: False)
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_files_load_as_float_images_in_unit_range(tmp_path, gz, no_tfds):
  raw = write_mnist(tmp_path, gz=gz)
  for split in ("train", "test"):
    ds = prfl.data.load_dataset("mnist", split=split, data_dir=str(tmp_path))
    images, labels = raw[split]
    assert ds.images.shape == images.shape + (1,)
    assert ds.images.dtype == np.float32 and ds.labels.dtype == np.int32
    np.testing.assert_allclose(ds.images[..., 0], images / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ds.labels, labels)
    assert ds.num_classes == 10 and "IDX files in" in ds.source
  both = prfl.data.load_dataset("fashion_mnist", split="train+test",
                                data_dir=tmp_path, source="idx")
  np.testing.assert_array_equal(
      both.labels, np.concatenate([raw["train"][1], raw["test"][1]]))


def test_read_idx_parses_header_dims_and_dtype(tmp_path):
  a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  write(tmp_path / "a", idx_bytes(a))
  np.testing.assert_array_equal(idx.read_idx(str(tmp_path / "a")), a)
  # Type code 0x0B: big-endian int16.
  b = np.array([[-2, 300]], np.int16)
  data = bytes([0, 0, 0x0B, 2]) + (1).to_bytes(4, "big") + (2).to_bytes(
      4, "big") + b.astype(">i2").tobytes()
  write(tmp_path / "b", data)
  np.testing.assert_array_equal(idx.read_idx(str(tmp_path / "b")), b)


def test_malformed_idx_files_name_the_file(tmp_path, no_tfds):
  write_mnist(tmp_path)
  bad = tmp_path / IDX_NAMES["train"][0]
  good = bad.read_bytes()
  bad.write_bytes(b"\x01\x02" + good[2:])
  with pytest.raises(ValueError, match="train-images-idx3-ubyte.*bad magic"):
    prfl.data.load_dataset("mnist", data_dir=tmp_path)
  with pytest.raises(ValueError, match="train-images-idx3-ubyte"):
    idx.read_idx(str(bad))
  bad.write_bytes(good[:-3])  # Truncated data.
  with pytest.raises(ValueError, match="train-images-idx3-ubyte.*size mismatch"):
    prfl.data.load_dataset("mnist", data_dir=tmp_path)
  bad.write_bytes(good)
  # Labels for another number of images.
  write(tmp_path / IDX_NAMES["train"][1], idx_bytes(np.zeros(5, np.uint8)))
  with pytest.raises(ValueError, match="6 images but .* 5 labels"):
    prfl.data.load_dataset("mnist", data_dir=tmp_path)
  # A label outside [0, 10).
  write(tmp_path / IDX_NAMES["train"][1], idx_bytes(np.full(6, 11, np.uint8)))
  with pytest.raises(ValueError, match="up to 11"):
    prfl.data.load_dataset("mnist", data_dir=tmp_path)
  # Images stored as idx1.
  write(tmp_path / IDX_NAMES["train"][0], idx_bytes(np.zeros(6, np.uint8)))
  with pytest.raises(ValueError, match=r"expected images \[M, H, W\]"):
    prfl.data.load_dataset("mnist", data_dir=tmp_path)
  (tmp_path / "g.gz").write_bytes(b"not gzip")
  with pytest.raises(ValueError, match="g.gz"):
    idx.read_idx(str(tmp_path / "g.gz"))


def test_missing_idx_files_name_the_path_and_file_names(tmp_path, no_tfds):
  with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
    prfl.data.load_dataset("mnist", data_dir=tmp_path, source="idx")
  with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path)) +
                     ".*t10k-labels-idx1-ubyte.*pip install"):
    prfl.data.load_dataset("mnist", data_dir=tmp_path)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    prfl.data.load_dataset("mnist", data_dir=tmp_path / "nope")
  # Only the training files: split="train" works, "test" names what is missing.
  write_mnist(tmp_path)
  os.remove(tmp_path / IDX_NAMES["test"][0])
  assert len(prfl.data.load_dataset("mnist", data_dir=tmp_path).labels) == 6
  with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte"):
    prfl.data.load_dataset("mnist", split="test", data_dir=tmp_path,
                           source="idx")


def cifar_records(m, label_bytes, rng):
  labels = rng.integers(0, 10, (m, label_bytes), dtype=np.uint8)
  pixels = rng.integers(0, 256, (m, 3, 32, 32), dtype=np.uint8)
  rows = np.concatenate([labels, pixels.reshape(m, -1)], axis=1)
  return rows.tobytes(), labels, pixels.transpose(0, 2, 3, 1)


def write_cifar10(directory, rng):
  """data_batch_1..5 with 2 records each and test_batch with 3."""
  directory.mkdir(parents=True, exist_ok=True)
  out = {"train": ([], []), "test": ([], [])}
  files = [(f"data_batch_{i}.bin", "train", 2) for i in range(1, 6)]
  for name, split, m in files + [("test_batch.bin", "test", 3)]:
    data, labels, images = cifar_records(m, 1, rng)
    (directory / name).write_bytes(data)
    out[split][0].append(images)
    out[split][1].append(labels[:, 0])
  return {s: tuple(np.concatenate(v) for v in out[s]) for s in out}


@pytest.mark.parametrize("layout", ["dir", "parent", "tar", "tar_in_dir"])
def test_cifar10_binary_from_directory_or_archive(tmp_path, layout, no_tfds):
  raw = write_cifar10(tmp_path / "cifar-10-batches-bin",
                      np.random.default_rng(0))
  data_dir = {"dir": tmp_path / "cifar-10-batches-bin",
              "parent": tmp_path}.get(layout)
  if layout.startswith("tar"):
    archive = tmp_path / "out" / "cifar-10-binary.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
      tar.add(tmp_path / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
    data_dir = archive if layout == "tar" else archive.parent
  for split in ("train", "test"):
    ds = prfl.data.load_dataset("cifar10", split=split, data_dir=data_dir)
    images, labels = raw[split]
    assert ds.images.shape == (len(labels), 32, 32, 3)
    # Channel-major records become [H, W, C]: red plane first.
    np.testing.assert_allclose(ds.images, images / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ds.labels, labels)
    assert ds.num_classes == 10 and "cifar10 binary files" in ds.source


def test_cifar100_binary_returns_fine_labels(tmp_path, no_tfds):
  rng = np.random.default_rng(1)
  d = tmp_path / "cifar-100-binary"
  d.mkdir()
  data, labels, images = cifar_records(4, 2, rng)
  labels[:, 1] += 90  # Fine labels 90..99, coarse 0..9.
  rows = np.frombuffer(data, np.uint8).reshape(4, -1).copy()
  rows[:, :2] = labels
  (d / "train.bin").write_bytes(rows.tobytes())
  (d / "test.bin").write_bytes(rows[:1].tobytes())
  ds = prfl.data.load_dataset("cifar100", data_dir=tmp_path)
  np.testing.assert_array_equal(ds.labels, labels[:, 1])
  np.testing.assert_allclose(ds.images, images / 255.0, rtol=1e-6)
  assert ds.num_classes == 100


def test_malformed_and_wrong_format_data_dirs(tmp_path, no_tfds):
  d = tmp_path / "c10"
  write_cifar10(d, np.random.default_rng(0))
  (d / "data_batch_3.bin").write_bytes(b"\0" * 3000)
  with pytest.raises(ValueError, match="data_batch_3.bin.*3073-byte"):
    prfl.data.load_dataset("cifar10", data_dir=d)
  with pytest.raises(ValueError, match="holds cifar10 binary files.*not mnist"):
    prfl.data.load_dataset("mnist", data_dir=d)
  with pytest.raises(ValueError, match="holds cifar10 binary files"):
    prfl.data.load_dataset("cifar100", data_dir=d, source="cifar_binary")
  m = tmp_path / "m"
  m.mkdir()
  write_mnist(m)
  with pytest.raises(ValueError, match="holds MNIST-format IDX files"):
    prfl.data.load_dataset("cifar10", data_dir=m)
  with pytest.raises(FileNotFoundError, match="data_batch_1.bin"):
    prfl.data.load_dataset("cifar10", data_dir=tmp_path / "c10" / "..",
                           source="cifar_binary", split="test")
  (tmp_path / "cifar-10-binary.tar.gz").write_bytes(b"garbage")
  with pytest.raises(ValueError, match="cannot read the archive"):
    prfl.data.load_dataset("cifar10", data_dir=tmp_path / "cifar-10-binary.tar.gz")


def test_digits_are_the_bundled_sklearn_images_scaled_to_unit_range():
  from sklearn import datasets as sk  # pylint: disable=g-import-not-at-top
  ds = prfl.data.load_dataset("digits")
  ref = sk.load_digits()
  assert ds.images.shape == (1797, 8, 8, 1) and ds.num_classes == 10
  np.testing.assert_allclose(ds.images[..., 0], ref.images / 16.0)
  assert ds.images.max() == 1.0 and ds.images.min() == 0.0
  np.testing.assert_array_equal(ds.labels, ref.target)
  assert "scikit-learn" in ds.source
  assert prfl.data.load_dataset("digits", split="train+test",
                                source="sklearn").images.shape[0] == 1797


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="emnist"), "unknown data set `name` 'emnist'.*fashion_mnist"),
    (dict(name="mnist", source="web"), "unknown `source` 'web'.*cifar_binary"),
    (dict(name="mnist", split="valid"), "`split` must be one of"),
    (dict(name="digits", source="idx"), "cannot load 'digits'.*sklearn"),
    (dict(name="cifar10", source="debian"), "cannot load 'cifar10'"),
    (dict(name="digits", data_dir="/tmp"), "bundled with scikit-learn"),
    (dict(name="digits", split="test"), "no test split"),
    (dict(name="mnist", source="idx"), "needs a `data_dir`"),
    (dict(name="fashion_mnist", source="debian", data_dir="/tmp"),
     "pass source='idx'"),
])
def test_bad_arguments_fail_at_once_with_what_to_do(kwargs, match):
  with pytest.raises(ValueError, match=match):
    prfl.data.load_dataset(**kwargs)


def test_no_source_says_what_to_install(monkeypatch, tmp_path, no_tfds):
  monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path))
  with pytest.raises(FileNotFoundError,
                     match="apt-get install dataset-fashion-mnist.*--data-dir"
                     r".*pip install 'prfl_jax\[data\]'"):
    prfl.data.load_dataset("fashion_mnist")
  with pytest.raises(FileNotFoundError, match="apt-get install dataset-fash"):
    prfl.data.load_dataset("fashion_mnist", source="debian")
  with pytest.raises(ImportError, match=r"pip install 'prfl_jax\[data\]'"):
    prfl.data.load_dataset("mnist", source="tfds")


def test_debian_fashion_mnist_is_read_through_the_idx_reader(
    monkeypatch, tmp_path, no_tfds):
  raw = write_mnist(tmp_path, gz=True)
  monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path))
  ds = prfl.data.load_dataset("fashion_mnist", split="test")
  assert ds.source.startswith("fashion_mnist test from Debian dataset-fashion")
  assert str(tmp_path) in ds.source
  np.testing.assert_array_equal(ds.labels, raw["test"][1])
  with pytest.raises(FileNotFoundError):  # Debian serves Fashion-MNIST only.
    prfl.data.load_dataset("mnist")


@pytest.mark.skipif(
    not os.path.isdir(datasets.DEBIAN_FASHION_MNIST_DIR),
    reason="Debian's dataset-fashion-mnist is not installed")
def test_installed_debian_fashion_mnist_is_found_by_auto():
  ds = prfl.data.load_dataset("fashion_mnist", split="test")
  assert ds.images.shape == (10000, 28, 28, 1)
  assert np.bincount(ds.labels).tolist() == [1000] * 10
  assert "Debian dataset-fashion-mnist" in ds.source


@pytest.mark.tfds
def test_tfds_source_with_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=7):
    ds = prfl.data.load_dataset("mnist", source="tfds")
  assert ds.images.shape == (7, 28, 28, 1) and ds.labels.shape == (7,)
  assert ds.images.dtype == np.float32 and 0 <= ds.images.min()
  assert ds.images.max() <= 1 and ds.num_classes == 10
  assert "tensorflow-datasets mnist" in ds.source
