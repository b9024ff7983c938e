"""Presets: named sets of mutation targets, each with the tests that guard it.

A preset entry is `Lines(paths, functions, test_sets)`: the operator mutants
of those functions' bodies, or `Edit(paths, function, old, new, why,
test_sets)`: one named text replacement (a defect someone found, reproduced).
`paths` are candidate locations (the first that exists is used: modules move);
each of `test_sets` is a tuple of candidate tests, the first that exists runs.
A function, edit or module missing from the checked-out layout is skipped with
a note on stderr.
"""

import ast
import os
import re
import sys
from typing import List

from tools.mutation import preset_experiments
from tools.mutation import preset_library
from tools.mutation.operators import REPO
from tools.mutation.operators import core_lines
from tools.mutation.preset_types import Edit
from tools.mutation.preset_types import Lines
from tools.mutation.preset_types import Target


# The core lines of issue 12: ball test, centre update, quantile, group
# assignment and write-back, Gram formula and centring.
CORE = [
    Lines(("prfl_jax/clustering/radius.py", "prfl_jax/clustering.py"),
     ("masked_quantile", "_inside"),
     (("tests/test_clustering.py",),
      ("tests/test_federated_clustering.py::test_rounds_match_numpy",),
      ("tests/test_federated_clustering.py::"
       "test_groups_match_numpy_under_every_plan",))),
    Lines(("prfl_jax/clustering/threshold.py", "prfl_jax/clustering.py"),
     ("_direct", "gram_clustering_coefs", "centred_gram", "mask_gram",
      "combine_centred"),
     (("tests/test_clustering.py",),
      ("tests/test_federated_clustering.py::test_rounds_match_numpy",),
      ("tests/test_federated_clustering.py::"
       "test_groups_match_numpy_under_every_plan",))),
    Lines(("prfl_jax/kernels/ghost.py", "prfl_jax/ghost.py"),
     ("_cross", "_block_gram", "_input_gram", "centred", "combine",
      "_cluster"),
     (("tests/test_kernels_ghost.py", "tests/test_ghost.py"),)),
    # The Gram kernel's centring and per-model clustering: in
    # `kernels/gram.py` since the engine's kernel registry, in
    # `clustering.py` (centring) and `gradients.py` (per model) before.
    Lines(("prfl_jax/kernels/gram.py", "prfl_jax/kernels/gradients.py",
      "prfl_jax/kernels/pairs.py", "prfl_jax/gradients.py"),
     ("centred_gram", "combine_centred", "_cluster", "_cluster_one_model",
      "_cluster_one_model_ghost"),
     (("tests/test_kernels.py::test_cluster_at_models_matches_numpy",
       "tests/test_gradients.py::test_cluster_at_models_matches_numpy"),
      ("tests/test_kernels_ghost.py::"
       "test_cluster_at_models_matches_gram_schedule",
       "tests/test_ghost.py::test_cluster_at_models_matches_gram_schedule",
       "tests/test_ghost.py::test_cluster_at_models_matches_direct"))),
    # The owner-centred Gram matrix `G_jk - G_ji - G_ik + G_ii` shared by
    # the Gram-matrix kernels (`ghost.centred` before the kernel registry).
    Lines(("prfl_jax/kernels/base.py",),
     ("owner_centred", "cluster_on_gram", "owner_coefs"),
     (("tests/test_kernels.py::test_cluster_at_models_matches_numpy",
       "tests/test_gradients.py::test_cluster_at_models_matches_numpy"),
      ("tests/test_ghost.py",))),
    Lines(("prfl_jax/algorithms/federated_clustering.py",),
     ("random_groups", "_to_client_order", "clustered_update",
      "federated_clustering.step"),
     (("tests/test_federated_clustering.py",),)),
]


PRESETS = {"core": CORE, **preset_library.PRESETS,
           **preset_experiments.PRESETS}


def test_exists(test: str) -> bool:
  """`file` or `file::function` exists (node ids may carry [params])."""
  path, _, name = test.partition("::")
  full = os.path.join(REPO, path)
  if not os.path.exists(full):
    return False
  if not name:
    return True
  name = name.split("[")[0].split("::")[-1]
  source = open(full, encoding="utf-8").read()
  return re.search(rf"^def {re.escape(name)}\(", source, re.M) is not None


def parse_target(text: str, default_tests=()) -> Target:
  """`PATH[:FUNC[,FUNC...] | :FIRST-LAST][=TEST[,TEST...]]` as a Target."""
  where, _, test_spec = text.partition("=")
  path, _, spec = where.partition(":")
  tests = tuple(test_spec.split(",")) if test_spec else tuple(default_tests)
  return Target(path, spec or None, tests)


def _present(path: str, functions) -> List[str]:
  tree = ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read())
  out = []
  for f in functions:
    try:
      core_lines(tree, f)
      out.append(f)
    except SystemExit:
      print(f"note: {path} has no {f}; skipped", file=sys.stderr)
  return out


def resolve_preset(name: str = "core") -> List[Target]:
  """The targets of preset `name`, at the paths and tests that exist."""
  exists = lambda p: os.path.exists(os.path.join(REPO, p))
  targets = []
  for entry in PRESETS[name]:
    path = next((p for p in entry.paths if exists(p)), None)
    if path is None:  # A module of another layout.
      print(f"note: none of {entry.paths} exists; skipped", file=sys.stderr)
      continue
    tests = [next((t for t in c if test_exists(t)), None)
             for c in entry.tests]
    tests = tuple(t for t in tests if t)
    if not tests:
      print(f"note: no test of {entry} exists; skipped", file=sys.stderr)
      continue
    if isinstance(entry, Edit):
      targets.append(Target(path, entry.function, tests, entry))
      continue
    present = _present(path, entry.functions)
    if present:
      targets.append(Target(path, ",".join(present), tests))
  if not targets:
    raise SystemExit(f"error: no module of the {name} preset exists")
  return targets
