"""A reader for MNIST-format IDX files, with no TensorFlow.

The IDX format (LeCun et al., "The MNIST database") stores one array: two zero
bytes, a type code, the number of dimensions D, then D big-endian uint32 sizes,
then the values in C order (big-endian for multi-byte types). MNIST and
Fashion-MNIST ship four such files per data set, optionally gzipped:
`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`
and `t10k-labels-idx1-ubyte`.
"""

import gzip
import os

import numpy as np

# IDX type code -> NumPy dtype (big-endian where it matters).
_DTYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
           0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}

# split -> (images file, labels file), without the optional ".gz".
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: str) -> np.ndarray:
  """Reads one IDX file (gzipped when its name ends in `.gz`).

  Args:
    path: the file.

  Returns:
    the stored array, e.g. uint8 `[60000, 28, 28]` for MNIST training images.

  Raises:
    ValueError: naming `path`, if the magic number is wrong, the type code is
      unknown, or the data size does not match the header's dimensions.
  """
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      raw = f.read()
  except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError.
    raise ValueError(f"cannot read IDX file {path}: {e}") from e
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
    raise ValueError(
        f"{path} is not an IDX file: bad magic number {raw[:4].hex() or '(empty)'}"
        " (expected 0000 then a type code in 08/09/0b/0c/0d/0e and the number "
        "of dimensions, e.g. 00000803 for images).")
  dtype, ndim = _DTYPES[raw[2]], raw[3]
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes for "
                     f"{ndim} dimensions).")
  shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(raw) - header != expected:
    raise ValueError(
        f"{path}: size mismatch: the header says shape {shape} of "
        f"{dtype.name} ({expected} bytes) but the file holds "
        f"{len(raw) - header} bytes of data (truncated or corrupt file?).")
  return np.frombuffer(raw, dtype, offset=header).reshape(shape)


def find_idx_file(data_dir: str, name: str):
  """The path of `name` or `name.gz` in `data_dir`, or None."""
  for candidate in (name, name + ".gz"):
    path = os.path.join(data_dir, candidate)
    if os.path.isfile(path):
      return path
  return None


def has_idx_files(data_dir: str, split: str) -> bool:
  """Whether `data_dir` holds both IDX files of `split`."""
  return all(find_idx_file(data_dir, f) is not None for f in IDX_FILES[split])


def load_idx_split(data_dir: str, split: str):
  """Images and labels of one split from IDX files in `data_dir`.

  Args:
    data_dir: directory with the standard MNIST file names (each may be
      gzipped).
    split: "train" or "test".

  Returns:
    `(images uint8 [M, H, W], labels uint8 [M])`.

  Raises:
    FileNotFoundError: naming the directory and the expected file names.
    ValueError: on a malformed file, images that are not 3-D, labels that are
      not 1-D, or a different number of images and labels.
  """
  paths = []
  for name in IDX_FILES[split]:
    path = find_idx_file(data_dir, name)
    if path is None:
      raise FileNotFoundError(
          f"no {name} or {name}.gz in {data_dir}; an MNIST-format directory "
          "holds " + ", ".join(f"{n}[.gz]" for pair in IDX_FILES.values()
                               for n in pair) + ".")
    paths.append(path)
  images, labels = read_idx(paths[0]), read_idx(paths[1])
  if images.ndim != 3:
    raise ValueError(f"{paths[0]}: expected images [M, H, W] (idx3), got shape "
                     f"{images.shape}.")
  if labels.ndim != 1:
    raise ValueError(f"{paths[1]}: expected labels [M] (idx1), got shape "
                     f"{labels.shape}.")
  if len(images) != len(labels):
    raise ValueError(f"{paths[0]} holds {len(images)} images but {paths[1]} "
                     f"holds {len(labels)} labels.")
  return images, labels
