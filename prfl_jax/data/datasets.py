"""Image classification data sets as plain NumPy arrays, loaded once.

`load_dataset` returns an `ArrayDataset` (images float32 `[M, H, W, C]` in
[0, 1], labels int32 `[M]`) from one of five sources:

- "sklearn": scikit-learn's bundled 8x8 digits (1,797 real images, offline);
- "idx": MNIST-format IDX files in `data_dir` (MNIST, Fashion-MNIST);
- "cifar_binary": the CIFAR-10 / CIFAR-100 binary archives in `data_dir`;
- "debian": Debian's `dataset-fashion-mnist` package (IDX files under
  `/usr/share/datasets/fashion-mnist/`);
- "tfds": tensorflow-datasets (`pip install 'prfl_jax[data]'`), imported only
  when used.

`source="auto"` picks the first that applies: files in an explicit `data_dir`
(or, when it holds none and tfds is installed, tfds with that `data_dir`), then
the Debian package (Fashion-MNIST), then tfds, else it raises an error that says
what to install or pass. The returned `.source` says which one was used.
"""

import importlib.util
import os
from typing import NamedTuple, Optional

import numpy as np

from prfl_jax.data import cifar
from prfl_jax.data import idx

NAMES = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100")
SOURCES = ("auto", "tfds", "idx", "cifar_binary", "debian", "sklearn")
SPLITS = ("train", "test", "train+test")
NUM_CLASSES = {"digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10,
               "cifar100": 100}
# Where Debian's `dataset-fashion-mnist` installs its IDX files (read at call
# time, so tests may monkeypatch it).
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# Which sources can serve which data set.
_SERVES = {
    "sklearn": ("digits",),
    "idx": ("mnist", "fashion_mnist"),
    "cifar_binary": ("cifar10", "cifar100"),
    "debian": ("fashion_mnist",),
    "tfds": ("mnist", "fashion_mnist", "cifar10", "cifar100"),
}
_FILE_SOURCE = {"mnist": "idx", "fashion_mnist": "idx",
                "cifar10": "cifar_binary", "cifar100": "cifar_binary"}
_TFDS_BATCH = 10000
_PIP_HINT = ("pip install 'prfl_jax[data]' (or pip install tensorflow-datasets "
             "tensorflow)")


class ArrayDataset(NamedTuple):
  """A labelled image data set held in host memory."""
  images: np.ndarray  # float32 [M, H, W, C] in [0, 1].
  labels: np.ndarray  # int32 [M] in [0, num_classes).
  num_classes: int
  source: str  # which source was read, e.g. "IDX files in /data/mnist".


def tfds_installed() -> bool:
  """Whether tensorflow-datasets can be imported (without importing it)."""
  return importlib.util.find_spec("tensorflow_datasets") is not None


def _expected_files(name: str) -> str:
  if _FILE_SOURCE[name] == "idx":
    return ", ".join(f"{f}[.gz]" for pair in idx.IDX_FILES.values()
                     for f in pair)
  fmt = cifar.FORMATS[name]
  return (", ".join(fmt.files["train"] + fmt.files["test"]) +
          f" (in the directory or its {fmt.subdir}/, or {fmt.archive})")


def _holds(data_dir: str, name: str, split: str) -> bool:
  """Whether `data_dir` holds `name`'s files (for `split`, IDX)."""
  if _FILE_SOURCE[name] == "idx":
    return (os.path.isdir(data_dir) and
            all(idx.has_idx_files(data_dir, s) for s in _splits(split)))
  return cifar.locate(data_dir, name) is not None


def _wrong_format(data_dir: str, name: str, split: str) -> Optional[str]:
  """A hint when `data_dir` holds another data set's files, else None."""
  if not os.path.isdir(data_dir):
    return None
  same = {name, "mnist"} if name == "fashion_mnist" else {name}
  for other in ("mnist", "cifar10", "cifar100"):
    if other in same:
      continue
    if _holds(data_dir, other, split):
      what = ("MNIST-format IDX files (name='mnist' or 'fashion_mnist')"
              if other == "mnist" else f"{other} binary files (name='{other}')")
      return (f"`data_dir` {data_dir} holds {what}, not {name}: pass the "
              f"matching `name` or a `data_dir` with {_expected_files(name)}.")
  return None


def _check_args(name, split, data_dir, source, download):
  if not isinstance(name, str) or name not in NAMES:
    raise ValueError(f"unknown data set `name` {name!r}; valid names: "
                     f"{', '.join(NAMES)}.")
  if not isinstance(source, str) or source not in SOURCES:
    raise ValueError(f"unknown `source` {source!r}; valid sources: "
                     f"{', '.join(SOURCES)}.")
  if not isinstance(split, str) or split not in SPLITS:
    raise ValueError(f"`split` must be one of {', '.join(SPLITS)}, got "
                     f"{split!r}.")
  if not isinstance(download, bool):
    raise TypeError(f"`download` must be a bool, got {download!r}.")
  if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
    raise TypeError(f"`data_dir` must be a path or None, got {data_dir!r}.")
  if source != "auto" and name not in _SERVES[source]:
    raise ValueError(
        f"`source` {source!r} cannot load {name!r} (it serves "
        f"{', '.join(_SERVES[source])}); use source='auto' or one of "
        f"{', '.join(s for s in SOURCES[1:] if name in _SERVES[s])}.")
  if name == "digits":
    if data_dir is not None:
      raise ValueError("'digits' is bundled with scikit-learn: do not pass a "
                       f"`data_dir` (got {data_dir!r}).")
    if split == "test":
      raise ValueError("'digits' has no test split: use split='train' (all "
                       "1797 images); `federate` splits each client's "
                       "examples into train and test.")
  if source == "debian" and data_dir is not None:
    raise ValueError(
        f"source='debian' reads {DEBIAN_FASHION_MNIST_DIR}; to read IDX files "
        f"in {data_dir} pass source='idx' (or 'auto').")
  if source in ("idx", "cifar_binary") and data_dir is None:
    raise ValueError(f"source={source!r} needs a `data_dir` holding "
                     f"{_expected_files(name)}.")
  if (data_dir is not None and source != "tfds" and
      not os.path.exists(data_dir)):
    raise FileNotFoundError(f"`data_dir` {data_dir} does not exist.")


def _resolve(name: str, split: str, data_dir: Optional[str],
             source: str) -> str:
  """The concrete source that `source="auto"` stands for."""
  if source in ("idx", "cifar_binary") and not _holds(data_dir, name, split):
    hint = _wrong_format(data_dir, name, split)
    if hint:
      raise ValueError(hint)
  if source == "debian" and not _holds(DEBIAN_FASHION_MNIST_DIR, name, split):
    raise FileNotFoundError(
        f"Debian's Fashion-MNIST is not in {DEBIAN_FASHION_MNIST_DIR}: "
        "apt-get install dataset-fashion-mnist, or pass `data_dir` with "
        f"{_expected_files(name)}.")
  if source != "auto":
    return source
  if name == "digits":
    return "sklearn"
  if data_dir is not None:
    if _holds(data_dir, name, split):
      return _FILE_SOURCE[name]
    hint = _wrong_format(data_dir, name, split)
    if hint:
      raise ValueError(hint)
    if tfds_installed():
      return "tfds"
    raise FileNotFoundError(
        f"no {name} files in `data_dir` {data_dir}: expected "
        f"{_expected_files(name)}. For a tensorflow-datasets directory, "
        f"{_PIP_HINT}.")
  if (name == "fashion_mnist" and
      _holds(DEBIAN_FASHION_MNIST_DIR, name, split)):
    return "debian"
  if tfds_installed():
    return "tfds"
  debian = ("apt-get install dataset-fashion-mnist (real Fashion-MNIST, "
            "offline), " if name == "fashion_mnist" else "")
  raise FileNotFoundError(
      f"no source found for {name!r}. Either {debian}pass data_dir= (e.g. "
      f"--data-dir) a directory with {_expected_files(name)}, or "
      f"{_PIP_HINT} and use download=True. The bundled name='digits' always "
      "works offline.")


def _splits(split: str):
  return ("train", "test") if split == "train+test" else (split,)


def _from_idx(data_dir: str, name: str, split: str):
  images, labels = [], []
  for s in _splits(split):
    x, y = idx.load_idx_split(data_dir, s)
    if y.size and y.max() >= NUM_CLASSES[name]:
      raise ValueError(
          f"the {s} labels in {data_dir} go up to {int(y.max())}, outside "
          f"[0, {NUM_CLASSES[name]}) for {name}.")
    images.append(x)
    labels.append(y)
  return np.concatenate(images)[..., None], np.concatenate(labels)


def _from_cifar(data_dir: str, name: str, split: str):
  images, labels = [], []
  for s in _splits(split):
    x, y, where = cifar.load_cifar_split(data_dir, name, s)
    images.append(x)
    labels.append(y)
  return np.concatenate(images), np.concatenate(labels), where


def _from_sklearn():
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  digits = sk_datasets.load_digits()
  # Pixel values are integers 0..16.
  return digits.images[..., None] / 16.0, digits.target


def _from_tfds(name, split, data_dir, download):
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"source='tfds' needs tensorflow-datasets: {_PIP_HINT}."
                      ) from e
  # Batches of _TFDS_BATCH rather than batch_size=-1 (one tensor): with
  # tensorflow 2.21 / tfds 4.9.10, batch_size=-1 aborts the process under
  # tfds.testing.mock_data (std::length_error), batches work everywhere.
  try:
    ds, info = tfds.load(name, split=split, data_dir=data_dir,
                         download=download, batch_size=_TFDS_BATCH,
                         as_supervised=True, with_info=True)
    batches = list(tfds.as_numpy(ds))
  except ModuleNotFoundError as e:  # tfds imports TensorFlow lazily.
    raise ImportError(f"tensorflow-datasets needs TensorFlow to load {name} "
                      f"({e}): {_PIP_HINT}.") from e
  if not batches:
    raise ValueError(f"tfds split {split!r} of {name} is empty.")
  images = np.concatenate([x for x, _ in batches])
  labels = np.concatenate([y for _, y in batches])
  return images, labels, info


def load_dataset(name: str, *, split: str = "train",
                 data_dir: Optional[str] = None, source: str = "auto",
                 download: bool = False) -> ArrayDataset:
  """Loads a labelled image data set into NumPy arrays, once, outside jit.

  Args:
    name: "digits" | "mnist" | "fashion_mnist" | "cifar10" | "cifar100".
    split: "train" | "test" | "train+test" (both concatenated). "digits" has no
      test split: "train" (or "train+test") gives all 1797 images.
    data_dir: a directory with IDX files (MNIST names, optionally gzipped) or
      the CIFAR binary files (the extracted directory, its parent, or the
      `.tar.gz`); for source="tfds", the tfds data directory.
    source: "auto" | "tfds" | "idx" | "cifar_binary" | "debian" | "sklearn"
      (see the module docstring for what "auto" picks).
    download: passed to `tfds.load` (only used by the tfds source).

  Returns:
    `ArrayDataset(images float32 [M, H, W, C] in [0, 1], labels int32 [M],
    num_classes, source)`; e.g. digits `[1797, 8, 8, 1]`, MNIST
    `[60000, 28, 28, 1]`, CIFAR `[50000, 32, 32, 3]` for split="train".

  Raises:
    ValueError: an unknown name, source or split, a source that cannot serve
      `name`, a `data_dir` holding another data set's files, or a malformed
      file (naming it).
    FileNotFoundError: a missing `data_dir` or missing files (naming the
      path and the expected file names), or no source available (saying what
      to install or pass).
    ImportError: source="tfds" without tensorflow-datasets installed.
  """
  if isinstance(data_dir, os.PathLike):
    data_dir = os.fspath(data_dir)
  _check_args(name, split, data_dir, source, download)
  used = _resolve(name, split, data_dir, source)
  num_classes = NUM_CLASSES[name]
  if used == "sklearn":
    images, labels = _from_sklearn()
    where = ("scikit-learn load_digits (bundled 8x8 digits, pixel values "
             "0..16 scaled to [0, 1])")
  elif used == "idx":
    images, labels = _from_idx(data_dir, name, split)
    images = images / np.float32(255)
    where = f"IDX files in {data_dir}"
  elif used == "debian":
    images, labels = _from_idx(DEBIAN_FASHION_MNIST_DIR, name, split)
    images = images / np.float32(255)
    where = f"Debian dataset-fashion-mnist ({DEBIAN_FASHION_MNIST_DIR})"
  elif used == "cifar_binary":
    images, labels, path = _from_cifar(data_dir, name, split)
    images = images / np.float32(255)
    where = f"{name} binary files ({path})"
  else:
    images, labels, info = _from_tfds(name, split, data_dir, download)
    images = np.asarray(images, np.float32) / np.float32(255)
    num_classes = int(info.features["label"].num_classes)
    where = (f"tensorflow-datasets {info.full_name} "
             f"(data_dir {info.data_dir})")
  return ArrayDataset(images=np.asarray(images, np.float32),
                      labels=np.asarray(labels, np.int32),
                      num_classes=num_classes,
                      source=f"{name} {split} from {where}")
