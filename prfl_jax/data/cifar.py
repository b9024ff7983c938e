"""A reader for the CIFAR-10 / CIFAR-100 binary archives, with no TensorFlow.

Krizhevsky's "binary version" archives (`cifar-10-binary.tar.gz`,
`cifar-100-binary.tar.gz`) hold fixed-size records: CIFAR-10 one label byte then
3072 pixel bytes (1024 red, 1024 green, 1024 blue, each 32x32 row-major) in
`data_batch_1.bin` .. `data_batch_5.bin` and `test_batch.bin`; CIFAR-100 a
coarse-label byte, a fine-label byte, then the same 3072 pixel bytes in
`train.bin` and `test.bin`. We read either the extracted directory or the
`.tar.gz` itself (members are read in memory, nothing is extracted to disk).
"""

import os
import tarfile
from typing import NamedTuple

import numpy as np

_PIXELS = 3 * 32 * 32


class CifarFormat(NamedTuple):
  """Where one CIFAR variant keeps its files and how a record is laid out."""
  subdir: str  # directory inside the archive
  archive: str  # file name of the .tar.gz
  files: dict  # split -> tuple of record file names
  label_bytes: int  # bytes before the pixels of a record
  label_offset: int  # which of those bytes is the label we return
  num_classes: int


FORMATS = {
    "cifar10": CifarFormat(
        subdir="cifar-10-batches-bin", archive="cifar-10-binary.tar.gz",
        files={"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
               "test": ("test_batch.bin",)},
        label_bytes=1, label_offset=0, num_classes=10),
    # CIFAR-100: we return the fine label (100 classes), as tfds does.
    "cifar100": CifarFormat(
        subdir="cifar-100-binary", archive="cifar-100-binary.tar.gz",
        files={"train": ("train.bin",), "test": ("test.bin",)},
        label_bytes=2, label_offset=1, num_classes=100),
}


def _is_archive(path: str) -> bool:
  return os.path.isfile(path) and path.endswith((".tar.gz", ".tgz", ".tar"))


def locate(data_dir: str, name: str):
  """Where `name`'s files are under `data_dir`, or None.

  Args:
    data_dir: the extracted directory itself, its parent, a directory holding
      the `.tar.gz`, or the `.tar.gz` path.
    name: "cifar10" or "cifar100".

  Returns:
    `("dir", path)`, `("tar", path)` or None when nothing of `name` is there.
  """
  fmt = FORMATS[name]
  if _is_archive(data_dir):
    return ("tar", data_dir)
  first = fmt.files["test"][0]
  for d in (data_dir, os.path.join(data_dir, fmt.subdir)):
    if os.path.isfile(os.path.join(d, first)):
      return ("dir", d)
  archive = os.path.join(data_dir, fmt.archive)
  if os.path.isfile(archive):
    return ("tar", archive)
  return None


def _read_members(kind: str, path: str, names) -> dict:
  """{file name: bytes} for `names` from a directory or a tar archive."""
  out = {}
  if kind == "dir":
    for n in names:
      p = os.path.join(path, n)
      if not os.path.isfile(p):
        raise FileNotFoundError(
            f"no {n} in {path}; expected the files {', '.join(names)}.")
      with open(p, "rb") as f:
        out[n] = f.read()
    return out
  try:
    with tarfile.open(path, "r:*") as tar:
      members = {os.path.basename(m.name): m for m in tar.getmembers()
                 if m.isfile()}
      for n in names:
        if n not in members:
          raise FileNotFoundError(
              f"no {n} in the archive {path}; expected the files "
              f"{', '.join(names)}.")
        out[n] = tar.extractfile(members[n]).read()
  except (tarfile.TarError, EOFError, OSError) as e:
    if isinstance(e, FileNotFoundError):
      raise
    raise ValueError(f"cannot read the archive {path}: {e}") from e
  return out


def load_cifar_split(data_dir: str, name: str, split: str):
  """Images and labels of one split of CIFAR-10 or CIFAR-100.

  Args:
    data_dir: see `locate`.
    name: "cifar10" or "cifar100".
    split: "train" or "test".

  Returns:
    `(images uint8 [M, 32, 32, 3], labels uint8 [M], where)`; `where` is the
    directory or archive read.

  Raises:
    FileNotFoundError: naming `data_dir` and the expected file names.
    ValueError: on a file whose size is not a whole number of records or a
      label outside [0, num_classes), naming the file.
  """
  fmt = FORMATS[name]
  found = locate(data_dir, name)
  if found is None:
    raise FileNotFoundError(
        f"no {name} binary files in {data_dir}: expected "
        f"{', '.join(fmt.files['train'] + fmt.files['test'])} there or in "
        f"{fmt.subdir}/, or {fmt.archive}.")
  kind, path = found
  raw = _read_members(kind, path, fmt.files[split])
  record = fmt.label_bytes + _PIXELS
  images, labels = [], []
  for n, data in raw.items():
    if not data or len(data) % record:
      raise ValueError(
          f"{n} in {path} has {len(data)} bytes, not a positive multiple of "
          f"the {record}-byte {name} record (is this the {name} binary "
          "version?).")
    rows = np.frombuffer(data, np.uint8).reshape(-1, record)
    label = rows[:, fmt.label_offset]
    if label.max() >= fmt.num_classes:
      raise ValueError(f"{n} in {path} has label {int(label.max())} outside "
                       f"[0, {fmt.num_classes}) (is this {name}?).")
    labels.append(label)
    images.append(rows[:, fmt.label_bytes:].reshape(-1, 3, 32, 32)
                  .transpose(0, 2, 3, 1))
  return np.concatenate(images), np.concatenate(labels), path
