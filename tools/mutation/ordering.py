"""The order a mutant's tests run in: those that name the mutated function
first, then those that name its module's other functions, then the rest.

pytest runs with `-x`, so a killed mutant costs the tests up to the first
failure; a test that calls the mutated function fails far more often than one
that does not. Only the order changes: every test of the set still runs
before a mutant is called a survivor, so no verdict depends on it.

A test file is split into its test functions' node ids (`file::test_x`,
`file::TestY::test_z`) by reading its source. A file this reading could
miss tests of (a module-level `test*` name that is not a `def`/`class`, e.g.
one imported or assigned) stays whole, at the end, unordered.
"""

import ast
import functools
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

from tools.mutation.operators import REPO


@functools.lru_cache(maxsize=None)
def _split(path: str) -> Optional[Tuple[Tuple[str, str], ...]]:
  """(node id, source with decorators) of each test in the file at `path`
  (relative to the repository), in file order; None if it cannot be split."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    source = f.read()
  tree = ast.parse(source)
  out = []
  segment = lambda n: "\n".join(
      [ast.get_source_segment(source, d) or "" for d in n.decorator_list] +
      [ast.get_source_segment(source, n) or ""])
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      if node.name.startswith("test"):
        out.append((f"{path}::{node.name}", segment(node)))
    elif isinstance(node, ast.ClassDef):
      if node.name.startswith("Test"):
        out += [(f"{path}::{node.name}::{m.name}", segment(m))
                for m in node.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                and m.name.startswith("test")]
    else:
      names = ([a.asname or a.name.split(".")[0] for a in node.names]
               if isinstance(node, (ast.Import, ast.ImportFrom)) else
               [t.id for t in ast.walk(node) if isinstance(t, ast.Name)
                and isinstance(t.ctx, ast.Store)])
      if any(n.startswith(("test", "Test")) for n in names):
        return None
  return tuple(out)


def _names(text: str, names: Sequence[str]) -> bool:
  return any(re.search(rf"\b{re.escape(n)}\b", text) for n in names)


def ordered_tests(tests: Sequence[str], function: Optional[str],
                  siblings: Sequence[str] = ()) -> List[str]:
  """`tests` (files or node ids) as node ids: those whose source names
  `function` first, then those naming one of `siblings` (the module's other
  functions), then the rest, each group in the given order; files that
  cannot be split come last, whole. Every test of `tests` is kept once (a
  node id of a test already listed, e.g. through its file, is dropped, and
  a parametrised case listed before its whole test gives way to it)."""
  groups: Dict[int, List[str]] = {0: [], 1: [], 2: []}
  whole, seen = [], set()
  others = [s for s in siblings if s != function]
  for test in tests:
    path, _, rest = test.partition("::")
    split = _split(path) if os.path.isfile(os.path.join(REPO, path)) else None
    if split is None:
      whole.append(test)
      continue
    items = split
    if rest:  # A node id: keep it as given (it may name a parameter).
      text = next((s for node, s in split
                   if test == node or test.startswith(node + "[")), "")
      items = ((test, text),)
    for node, text in items:
      if node in seen or node.partition("[")[0] in seen:  # Already there.
        continue
      if "[" not in node:  # The whole test covers its cases listed before.
        for group in groups.values():
          group[:] = [g for g in group if g.partition("[")[0] != node]
      seen.add(node)
      rank = (0 if function and _names(text, [function]) else
              1 if others and _names(text, others) else 2)
      groups[rank].append(node)
  return groups[0] + groups[1] + groups[2] + whole
