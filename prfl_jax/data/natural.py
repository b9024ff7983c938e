"""Natural client partitions: clients are the values of an id column.

`natural_id_partition` is flwr-datasets' `NaturalIdPartitioner`: one client
per distinct value of a column such as a writer id. `natural_federation`
turns examples with such ids into a ragged `HostData` federation (each
client's examples split into train and test, nothing padded), and
`load_femnist` reads FEMNIST (federated EMNIST, one client per writer) from
LEAF's JSON files when the user has them (Caldas et al., 2018, "LEAF: A
Benchmark for Federated Settings"; `data/femnist/data/{train,test}/*.json`
made by LEAF's preprocessing). Everything runs once on the host, seeded.
"""

import glob
import json
import os
from typing import Any, List, NamedTuple, Optional

import jax
import numpy as np

from prfl_jax import validation
from prfl_jax.data import ragged

PyTree = Any


class NaturalFederation(NamedTuple):
  """A federation with natural clients."""
  data: ragged.HostData
  client_ids: np.ndarray  # [N]: the id value of each client.
  num_classes: int


def natural_id_partition(ids) -> tuple:
  """One partition per distinct id: `(values [N], [index arrays])`.

  Args:
    ids: `[M]` ids (any sortable dtype), one per example.

  Returns:
    `(values, parts)`: the N distinct ids in sorted order and, for each, the
    sorted indices of its examples.
  """
  ids = np.asarray(ids)
  if ids.ndim != 1 or ids.size == 0:
    raise ValueError(f"`ids` must be a non-empty 1-D array, got shape "
                     f"{ids.shape}.")
  values, inverse = np.unique(ids, return_inverse=True)
  order = np.argsort(inverse, kind="stable")
  cuts = np.cumsum(np.bincount(inverse, minlength=len(values)))[:-1]
  return values, np.split(order, cuts)


def natural_federation(examples: PyTree, ids, *, test_fraction: float = 0.2,
                       min_examples: int = 2, num_classes: int = 0,
                       clusters=None, seed: int = 0) -> NaturalFederation:
  """Clients = distinct `ids`; each client's examples split train / test.

  Args:
    examples: pytree, leaves `[M, ...]` (e.g. `(images, labels)`).
    ids: `[M]` client id of every example (e.g. the writer).
    test_fraction: share of each client's examples held out (at least one
      test and one training example per client).
    min_examples: clients with fewer examples are left out.
    num_classes: recorded in the result (0 if unknown).
    clusters: optional `[N]` true cluster per client (default all 0).
    seed: seed of the per-client shuffles.

  Returns:
    `NaturalFederation(data, client_ids, num_classes)`.

  Raises:
    ValueError: on a bad fraction, too few examples per client, or
      `clusters` of the wrong length.
  """
  if not 0.0 < float(test_fraction) < 1.0:
    raise ValueError(f"`test_fraction` must be in (0, 1), got "
                     f"{test_fraction!r}.")
  validation.check_positive_int(min_examples, "min_examples", minimum=2)
  values, parts = natural_id_partition(ids)
  keep = [i for i, p in enumerate(parts) if len(p) >= min_examples]
  if not keep:
    raise ValueError(f"no id has >= `min_examples`={min_examples} examples.")
  rng = np.random.default_rng(seed)
  train_idx, test_idx = [], []
  for i in keep:
    p = rng.permutation(parts[i])
    n_test = min(max(int(round(test_fraction * len(p))), 1), len(p) - 1)
    test_idx.append(np.sort(p[:n_test]))
    train_idx.append(np.sort(p[n_test:]))
  n = len(keep)
  if clusters is None:
    clusters = np.zeros(n, np.int32)
  clusters = np.asarray(clusters)
  if clusters.shape != (n,):
    raise ValueError(f"`clusters` must be [{n}] (one per kept client), got "
                     f"shape {clusters.shape}.")
  return NaturalFederation(
      ragged.HostData(_ragged(examples, train_idx),
                      _ragged(examples, test_idx), clusters),
      values[keep], num_classes)


def _ragged(examples: PyTree, parts: List[np.ndarray]) -> ragged.Ragged:
  index = np.concatenate(parts)
  offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
  return ragged.Ragged(
      jax.tree.map(lambda x: np.asarray(x)[index], examples),
      offsets.astype(np.int64))


def _read_leaf(files: List[str]):
  """Images `[M, 28, 28, 1]`, labels `[M]` and writer ids of LEAF JSONs."""
  images, labels, writers = [], [], []
  for path in files:
    with open(path, encoding="utf-8") as f:
      blob = json.load(f)
    for user in blob["users"]:
      data = blob["user_data"][user]
      x = np.asarray(data["x"], np.float32).reshape(-1, 28, 28, 1)
      images.append(x)
      labels.append(np.asarray(data["y"], np.int32))
      writers.extend([user] * len(x))
  return np.concatenate(images), np.concatenate(labels), np.asarray(writers)


def load_femnist(data_dir: str, *, test_fraction: Optional[float] = None,
                 min_examples: int = 2, max_clients: Optional[int] = None,
                 seed: int = 0) -> NaturalFederation:
  """FEMNIST from LEAF's JSON files: one client per writer, 62 classes.

  Reads `data_dir/train/*.json` and `data_dir/test/*.json` (LEAF's own
  per-writer split) when both exist; otherwise every `*.json` in `data_dir`
  is pooled and split per writer with `test_fraction` (default 0.2). Images
  are LEAF's 784 floats per example as `[28, 28, 1]`, unchanged.

  Args:
    data_dir: the directory of LEAF's `femnist/data` (or of its JSONs).
    test_fraction: split share when LEAF's split is absent.
    min_examples: writers with fewer examples are left out.
    max_clients: keep only the first writers (sorted by id), e.g. for tests.
    seed: seed of the split.

  Raises:
    FileNotFoundError: if `data_dir` holds no JSON file (nothing is
      downloaded here: LEAF's `preprocess.sh` makes them).
  """
  split = [sorted(glob.glob(os.path.join(data_dir, s, "*.json")))
           for s in ("train", "test")]
  pooled = sorted(glob.glob(os.path.join(data_dir, "*.json")))
  if not (all(split) or pooled):
    raise FileNotFoundError(
        f"no LEAF FEMNIST JSON files in {data_dir!r} (expected train/*.json "
        "and test/*.json, or *.json): run LEAF's femnist preprocessing, "
        "e.g. ./preprocess.sh -s niid --sf 0.05 -k 0 -t user.")
  if all(split) and test_fraction is None:
    x, y, w = _read_leaf(split[0])
    xt, yt, wt = _read_leaf(split[1])
    writers = np.intersect1d(np.unique(w), np.unique(wt))
    if max_clients is not None:
      writers = writers[:max_clients]
    keep_train, keep_test = np.isin(w, writers), np.isin(wt, writers)
    tr_ids, tr_parts = natural_id_partition(w[keep_train])
    te_ids, te_parts = natural_id_partition(wt[keep_test])
    data = ragged.HostData(
        _ragged((x[keep_train], y[keep_train]), tr_parts),
        _ragged((xt[keep_test], yt[keep_test]), te_parts),
        np.zeros(len(tr_ids), np.int32))
    return NaturalFederation(data, tr_ids, 62)
  files = pooled or split[0] + split[1]
  x, y, w = _read_leaf(files)
  if max_clients is not None:
    keep = np.isin(w, np.unique(w)[:max_clients])
    x, y, w = x[keep], y[keep], w[keep]
  return natural_federation((x, y), w, test_fraction=test_fraction or 0.2,
                            min_examples=min_examples, num_classes=62,
                            seed=seed)
