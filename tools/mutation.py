"""Mutation testing of prfl_jax's core lines with only the relevant tests.

Every mutant is one small change to one line of a library module (an operator,
a comparison, a constant, a swapped `jnp.where` branch, ...). A mutant is
*killed* when one of its tests fails (or errors, or times out) and *survives*
when they all pass. A surviving mutant on a core line is either a missing test
or an equivalent change, and must be explained.

How mutants run (`--isolation`):
* `inprocess` (default): a few long-lived worker processes import JAX, the
  library and the tests once; for each mutant the `__code__` of the top-level
  function holding the mutated line is swapped for the mutated one (so every
  reference to the function runs the mutant), JAX's caches are cleared,
  pytest runs in the worker (`-x`), and the code is restored. A mutant that
  crashes its worker counts as killed and the worker is restarted.
* `process`: a fresh `pytest -x` process per mutant on a scratch copy of the
  repository with the mutated module written in; slower by the ~45 s of
  importing JAX and collecting the tests on a loaded 2-core machine, but
  applicable to any line.

Why not mutmut: mutmut 3.8 runs JAX tests here (with `process_isolation =
forkserver` and `forkserver_warmup = none`; its default fork after importing
JAX risks XLA's fork deadlock), but it generated 800 mutants for
`clustering.py` alone, took ~20 s per mutant on a tiny test selection, and
selects code only by whole functions or `# pragma: no mutate` comments in
the source. This script mutates only the lines it is given, with a smaller
operator set.

Targets are `PATH`, `PATH:FUNC[,FUNC...]` (dotted names reach nested
functions: `federated_clustering.step`) or `PATH:FIRST-LAST` (line numbers),
optionally followed by `=TEST[,TEST...]`: the tests run against that target's
mutants (default: `--tests`). A function target covers its body without its
docstring. Never mutated: `raise`/`assert` statements, f-strings, and shape
plumbing (arguments of `reshape`/`astype`/..., `axis=`/`dtype=`-like keywords,
`x.shape[...]`, constant indices such as `x[0]`), where a change only crashes
at trace time or is clamped away by JAX's indexing.

  python tools/mutation.py --preset core --list         # the mutants
  python tools/mutation.py --preset core --workers 2 --out mutation.json
  python tools/mutation.py --preset core --only 12,40   # rerun two mutants
  python tools/mutation.py --target \
      "prfl_jax/clustering/radius.py:masked_quantile=tests/test_clustering.py"

The module paths are arguments, so the script keeps working when modules
move (e.g. `prfl_jax/ghost.py` -> `prfl_jax/kernels/ghost.py`); `--preset
core` looks for each module at its known locations.
"""

import argparse
import ast
import concurrent.futures
import copy
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The core lines of issue 12: ball test, centre update, quantile, group
# assignment and write-back, Gram formula and centring. Each entry: candidate
# paths (the first that exists is used), functions, tests that exercise them.
CORE_PRESET = [
    (("prfl_jax/clustering/radius.py", "prfl_jax/clustering.py"),
     ("masked_quantile", "_inside"),
     (("tests/test_clustering.py",),
      ("tests/test_federated_clustering.py::test_rounds_match_numpy",),
      ("tests/test_federated_clustering.py::"
       "test_groups_match_numpy_under_every_plan",))),
    (("prfl_jax/clustering/threshold.py", "prfl_jax/clustering.py"),
     ("_direct", "gram_clustering_coefs", "centred_gram", "mask_gram",
      "combine_centred"),
     (("tests/test_clustering.py",),
      ("tests/test_federated_clustering.py::test_rounds_match_numpy",),
      ("tests/test_federated_clustering.py::"
       "test_groups_match_numpy_under_every_plan",))),
    (("prfl_jax/kernels/ghost.py", "prfl_jax/ghost.py"),
     ("_cross", "_block_gram", "_input_gram", "centred", "combine",
      "_cluster"),
     (("tests/test_kernels_ghost.py", "tests/test_ghost.py"),)),
    # The Gram kernel's centring and per-model clustering: in
    # `kernels/gram.py` since the engine's kernel registry, in
    # `clustering.py` (centring) and `gradients.py` (per model) before.
    (("prfl_jax/kernels/gram.py", "prfl_jax/kernels/gradients.py",
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
    (("prfl_jax/kernels/base.py",),
     ("owner_centred", "cluster_on_gram", "owner_coefs"),
     (("tests/test_kernels.py::test_cluster_at_models_matches_numpy",
       "tests/test_gradients.py::test_cluster_at_models_matches_numpy"),
      ("tests/test_ghost.py",))),
    (("prfl_jax/algorithms/federated_clustering.py",),
     ("random_groups", "_to_client_order", "clustered_update",
      "federated_clustering.step"),
     (("tests/test_federated_clustering.py",),)),
]


def _test_exists(test: str) -> bool:
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


_BINOP_SWAP = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd, ast.Mod: ast.FloorDiv,
}
_CMP_SWAP = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot,
    ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_CALL_SWAP = {
    "minimum": "maximum", "maximum": "minimum", "min": "max", "max": "min",
    "argmin": "argmax", "argmax": "argmin", "floor": "ceil", "ceil": "floor",
    "any": "all", "all": "any", "sum": "mean",
}


@dataclasses.dataclass
class Mutant:
  """One change to one node of one module."""
  index: int  # Run-wide number, stable for the same sources and targets.
  path: str
  line: int
  kind: str
  before: str
  after: str
  node_pos: int  # Position of the node in `_walk(tree)`.
  variant: int  # Which of the node's mutations.
  status: str = "pending"  # killed | survived | timeout | error
  seconds: float = 0.0
  failed: str = ""  # First failing test (killed mutants).


def _walk(tree: ast.AST) -> List[ast.AST]:
  """Every node, depth-first in source order (deterministic)."""
  out = []

  def visit(node):
    out.append(node)
    for child in ast.iter_child_nodes(node):
      visit(child)

  visit(tree)
  return out


def _find_function(tree: ast.Module, dotted: str) -> ast.AST:
  scope: Sequence[ast.AST] = tree.body
  node = None
  for part in dotted.split("."):
    node = next((n for n in scope if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and
                 n.name == part), None)
    if node is None:
      raise SystemExit(f"error: no function {dotted!r} (missing {part!r})")
    scope = [n for n in ast.walk(node) if n is not node]
    # Direct children first, so a nested name finds the nearest definition.
    scope = list(node.body) + scope
  return node


def core_lines(tree: ast.Module, spec: Optional[str]) -> Set[int]:
  """Lines selected by the part of a target after the colon."""
  if spec is None:
    return set(range(1, max(getattr(n, "end_lineno", 0) or 0
                            for n in ast.walk(tree)) + 1))
  m = re.fullmatch(r"(\d+)-(\d+)", spec)
  if m:
    return set(range(int(m.group(1)), int(m.group(2)) + 1))
  lines = set()
  for name in spec.split(","):
    fn = _find_function(tree, name.strip())
    body = list(fn.body)
    if (body and isinstance(body[0], ast.Expr) and
        isinstance(body[0].value, ast.Constant) and
        isinstance(body[0].value.value, str)):
      body = body[1:]  # Docstring.
    for stmt in body:
      lines.update(range(stmt.lineno, stmt.end_lineno + 1))
  return lines


# Shape plumbing: a mutation there only crashes at trace time (or, for a
# constant index, is silently clamped by JAX), so it is not generated.
_PLUMBING_CALLS = {"reshape", "astype", "broadcast_to", "transpose",
                   "split", "fold_in", "one_hot"}
_PLUMBING_KEYWORDS = {"axis", "axes", "axis1", "axis2", "keepdims", "dtype",
                      "in_axes", "out_axes", "batch_size", "precision"}


def _excluded_nodes(tree: ast.Module) -> Set[int]:
  """ids of nodes never mutated: raise/assert, f-strings, docstrings,
  annotations and shape plumbing (see `_PLUMBING_CALLS`)."""
  skip = set()
  for node in ast.walk(tree):
    roots = []
    if isinstance(node, ast.Call):
      func = node.func
      name = (func.attr if isinstance(func, ast.Attribute) else
              func.id if isinstance(func, ast.Name) else None)
      if name in _PLUMBING_CALLS:
        roots.extend(node.args)
      roots.extend(k.value for k in node.keywords
                   if k.arg in _PLUMBING_KEYWORDS)
    if isinstance(node, ast.Subscript):
      if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
        roots.append(node)  # x.shape[0], x.shape[2:]
      elif isinstance(node.slice, ast.Constant):
        roots.append(node.slice)  # x[0]
      elif isinstance(node.slice, ast.Tuple):
        roots.extend(e for e in node.slice.elts if isinstance(e, ast.Constant))
    if isinstance(node, (ast.Raise, ast.Assert, ast.JoinedStr)):
      roots.append(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      roots.extend(a.annotation for a in (node.args.args +
                                          node.args.kwonlyargs)
                   if a.annotation is not None)
      if node.returns is not None:
        roots.append(node.returns)
    if isinstance(node, ast.AnnAssign):
      roots.append(node.annotation)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
      roots.append(node)
    for r in roots:
      skip.update(id(n) for n in ast.walk(r))
  return skip


def _variants(node: ast.AST) -> List[Tuple[str, ast.AST]]:
  """(kind, replacement node) for every mutation of `node`."""
  out = []
  if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(
      node.op) in _BINOP_SWAP:
    new = copy.deepcopy(node)
    new.op = _BINOP_SWAP[type(node.op)]()
    out.append(("binop", new))
  elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(
      node.ops[0]) in _CMP_SWAP:
    new = copy.deepcopy(node)
    new.ops = [_CMP_SWAP[type(node.ops[0])]()]
    out.append(("compare", new))
  elif isinstance(node, ast.UnaryOp) and isinstance(
      node.op, (ast.USub, ast.Invert, ast.Not)):
    if not (isinstance(node.op, ast.USub) and
            isinstance(node.operand, ast.Constant)):
      out.append(("drop-unary", copy.deepcopy(node.operand)))
    elif isinstance(node.operand.value, (int, float)) and not isinstance(
        node.operand.value, bool):  # -1 -> -2 (constant tweak).
      new = copy.deepcopy(node)
      new.operand.value = node.operand.value + 1
      out.append(("constant", new))
  elif isinstance(node, ast.BoolOp):
    new = copy.deepcopy(node)
    new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    out.append(("boolop", new))
  elif isinstance(node, ast.Constant):
    v = node.value
    if isinstance(v, bool):
      out.append(("constant", ast.Constant(not v)))
    elif isinstance(v, (int, float)):
      out.append(("constant", ast.Constant(v + 1)))
  elif isinstance(node, ast.Call):
    func = node.func
    name = (func.attr if isinstance(func, ast.Attribute) else
            func.id if isinstance(func, ast.Name) else None)
    if name in _CALL_SWAP:
      new = copy.deepcopy(node)
      if isinstance(new.func, ast.Attribute):
        new.func.attr = _CALL_SWAP[name]
      else:
        new.func.id = _CALL_SWAP[name]
      out.append(("call", new))
    if name == "where" and len(node.args) == 3:
      new = copy.deepcopy(node)
      new.args = [new.args[0], new.args[2], new.args[1]]
      out.append(("where-swap", new))
  elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple):
    elts = node.slice.elts
    is_none = lambda e: isinstance(e, ast.Constant) and e.value is None
    is_all = lambda e: (isinstance(e, ast.Slice) and e.lower is None and
                        e.upper is None and e.step is None)
    if len(elts) == 2 and ((is_none(elts[0]) and is_all(elts[1])) or
                           (is_all(elts[0]) and is_none(elts[1]))):
      new = copy.deepcopy(node)
      new.slice.elts = [new.slice.elts[1], new.slice.elts[0]]
      out.append(("transpose-index", new))
  return out


def _is_constant_under_unary(node, parents) -> bool:
  parent = parents.get(id(node))
  return (isinstance(parent, ast.UnaryOp) and
          isinstance(parent.op, ast.USub))


def generate(path: str, spec: Optional[str], start: int) -> List[Mutant]:
  """Mutants of the selected lines of `path` (relative to the repo)."""
  source = open(os.path.join(REPO, path), encoding="utf-8").read()
  tree = ast.parse(source)
  lines = core_lines(tree, spec)
  skip = _excluded_nodes(tree)
  parents = {}
  for node in ast.walk(tree):
    for child in ast.iter_child_nodes(node):
      parents[id(child)] = node
  mutants = []
  for pos, node in enumerate(_walk(tree)):
    line = getattr(node, "lineno", None)
    if line is None or line not in lines or id(node) in skip:
      continue
    if isinstance(node, ast.Constant) and _is_constant_under_unary(
        node, parents):
      continue  # Handled as the unary expression (-1 -> -2).
    for variant, (kind, new) in enumerate(_variants(node)):
      before = ast.unparse(node)
      after = ast.unparse(new)
      mutants.append(Mutant(start + len(mutants), path, line, kind,
                            before[:120], after[:120], pos, variant))
  return mutants


def mutated_source(m: Mutant) -> str:
  """The module's source with mutant `m` applied (via `ast.unparse`)."""
  tree = ast.parse(open(os.path.join(REPO, m.path), encoding="utf-8").read())
  nodes = _walk(tree)
  target = nodes[m.node_pos]
  _, new = _variants(target)[m.variant]
  ast.copy_location(new, target)
  parents = {}
  for node in ast.walk(tree):
    for child in ast.iter_child_nodes(node):
      parents[id(child)] = node
  parent = parents[id(target)]
  for field, value in ast.iter_fields(parent):
    if value is target:
      setattr(parent, field, new)
      break
    if isinstance(value, list) and any(v is target for v in value):
      setattr(parent, field, [new if v is target else v for v in value])
      break
  else:
    raise RuntimeError(f"cannot place mutant {m.index}")
  return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def unparsed_source(path: str) -> str:
  """The module as `ast.unparse` writes it (what every mutant is based on)."""
  tree = ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read())
  return ast.unparse(tree) + "\n"


def _repo_files() -> List[str]:
  out = subprocess.run(
      ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
      capture_output=True, text=True, check=True).stdout.split("\n")
  return [f for f in out if f and os.path.isfile(os.path.join(REPO, f))]


def _make_scratch(root: str) -> str:
  for rel in _repo_files():
    dest = os.path.join(root, rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(os.path.join(REPO, rel), dest)
  return root


def _first_failure(out: str) -> str:
  failed = re.search(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
  return failed.group(1) if failed else out[-300:]


def run_tests_in_subprocess(scratch: str, tests: Sequence[str],
                            timeout: float):
  """Runs pytest in `scratch`; returns (status, seconds, first failure)."""
  env = dict(os.environ)
  env["PYTHONPATH"] = scratch
  env["PYTHONDONTWRITEBYTECODE"] = "1"
  env.setdefault("JAX_PLATFORMS", "cpu")
  cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p",
         "no:cacheprovider", "-p", "no:randomly", *tests]
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True,
                          text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return "timeout", time.perf_counter() - t0, ""
  seconds = time.perf_counter() - t0
  if proc.returncode == 0:
    return "survived", seconds, ""
  if proc.returncode in (1, 2):  # Test failure; collection/import error.
    return "killed", seconds, _first_failure(proc.stdout + proc.stderr)
  return "error", seconds, (proc.stdout + proc.stderr)[-300:]


def _top_level_function(path: str, line: int) -> str:
  """Name of the top-level function of `path` that contains `line`."""
  tree = ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read())
  for node in tree.body:
    if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and
        node.lineno <= line <= node.end_lineno):
      return node.name
  raise SystemExit(
      f"error: {path}:{line} is not inside a top-level function; use "
      "--isolation process for it")


def _module_name(path: str) -> str:
  return os.path.splitext(path)[0].replace(os.sep, ".").replace("/", ".")


class _Timeout(Exception):
  pass


def _worker() -> int:
  """In-process worker: reads jobs (JSON lines) on stdin, answers on stdout.

  The library and the tests are imported once. For each mutant, the
  `__code__` of the top-level function that holds the mutated line is
  replaced by the mutated one (every reference to the function, e.g.
  `prfl.masked_quantile` or a name imported by a test, runs the mutant),
  JAX's caches are cleared, pytest runs in this process, and the code is
  restored.
  """
  import contextlib  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top

  sys.path.insert(0, REPO)
  os.chdir(REPO)
  reply = os.fdopen(os.dup(1), "w")  # Tests' output goes to a log instead.

  def on_alarm(signum, frame):
    raise _Timeout()

  signal.signal(signal.SIGALRM, on_alarm)

  def run(tests, timeout):
    with tempfile.TemporaryFile("w+") as log:
      saved = os.dup(1), os.dup(2)
      os.dup2(log.fileno(), 1)
      os.dup2(log.fileno(), 2)
      t0 = time.perf_counter()
      timed_out = False
      signal.alarm(int(timeout))
      try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
          # -n 0: in this process, where the mutated code is (setup.cfg's
          # addopts would send the tests to pytest-xdist workers).
          rc = pytest.main(["-x", "-q", "-n", "0", "-p", "no:cacheprovider",
                            "-p", "no:randomly", *tests])
      except _Timeout:
        rc, timed_out = -1, True
      finally:
        signal.alarm(0)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
      seconds = time.perf_counter() - t0
      log.seek(0)
      out = log.read()
    if timed_out or "_Timeout" in out:
      return "timeout", seconds, ""
    if rc == 0:
      return "survived", seconds, ""
    if rc in (1, 2):
      return "killed", seconds, _first_failure(out)
    return "error", seconds, f"pytest exit {rc}: " + out[-300:]

  for line in sys.stdin:
    job = json.loads(line)
    if job["kind"] == "clean":
      status, seconds, failed = run(job["tests"], job["timeout"])
      result = dict(status=status, seconds=seconds, failed=failed)
    else:
      m = Mutant(**job["mutant"])
      code = compile(mutated_source(m), m.path, "exec")
      name = _top_level_function(m.path, m.line)
      new = next(c for c in code.co_consts
                 if isinstance(c, types.CodeType) and c.co_name == name)
      fn = getattr(importlib.import_module(_module_name(m.path)), name)
      old = fn.__code__
      fn.__code__ = new
      jax.clear_caches()
      try:
        status, seconds, failed = run(job["tests"], job["timeout"])
      finally:
        fn.__code__ = old
        jax.clear_caches()
      result = dict(status=status, seconds=seconds, failed=failed)
    reply.write(json.dumps(result) + "\n")
    reply.flush()
  return 0


class _WorkerProcess:
  """A `--worker` subprocess and its pipes."""

  def __init__(self):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    self.proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker"], cwd=REPO,
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

  def ask(self, job: dict) -> Optional[dict]:
    """Sends a job; returns its result, or None if the worker died."""
    try:
      self.proc.stdin.write(json.dumps(job) + "\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      return None
    line = self.proc.stdout.readline()
    return json.loads(line) if line else None

  def close(self):
    try:
      self.proc.stdin.close()
    except BrokenPipeError:
      pass
    try:
      self.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.proc.kill()


def resolve_preset() -> List[str]:
  """`--target` strings of the core preset, at the paths that exist."""
  exists = lambda p: os.path.exists(os.path.join(REPO, p))
  targets = []
  for paths, funcs, test_sets in CORE_PRESET:
    path = next((p for p in paths if exists(p)), None)
    if path is None:  # A module of another layout of the engine.
      print(f"note: none of {paths} exists; skipped", file=sys.stderr)
      continue
    tree = ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read())
    present = []
    for f in funcs:
      try:
        _find_function(tree, f)
        present.append(f)
      except SystemExit:
        print(f"note: {path} has no {f}; skipped", file=sys.stderr)
    tests = [next((t for t in c if _test_exists(t)), None)
             for c in test_sets]
    tests = [t for t in tests if t]
    if present and tests:
      targets.append(f"{path}:{','.join(present)}={','.join(tests)}")
  if not targets:
    raise SystemExit("error: no module of the core preset exists")
  return targets


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--target", action="append", default=[],
                 help="PATH[:FUNC[,FUNC...] | :FIRST-LAST][=TEST[,TEST...]]")
  p.add_argument("--tests", nargs="+", default=[],
                 help="pytest files / node ids for targets without =TESTS")
  p.add_argument("--preset", choices=["core"],
                 help="issue 12's core lines with their tests (added to "
                 "--target)")
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--isolation", choices=["inprocess", "process"],
                 default="inprocess",
                 help="inprocess: long-lived workers swap the mutated "
                 "function's code (JAX and the tests are imported once); "
                 "process: a fresh pytest process per mutant in a scratch "
                 "copy of the repository (slower, for anything else)")
  p.add_argument("--skip-clean", action="store_true",
                 help="do not run the tests once without mutants first")
  p.add_argument("--timeout", type=float, default=None,
                 help="seconds per mutant (default: 3x the clean run of its "
                 "tests, >= 120; 1800 with --skip-clean)")
  p.add_argument("--only", default=None,
                 help="comma-separated mutant numbers to run")
  p.add_argument("--list", action="store_true",
                 help="print the mutants and exit")
  p.add_argument("--out", default=None, help="JSON results file")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    return _worker()

  targets = list(args.target) + (resolve_preset() if args.preset else [])
  if not targets:
    p.error("give --target or --preset")
  only = None
  if args.only:
    try:
      only = {int(x) for x in args.only.split(",")}
    except ValueError:
      p.error(f"--only must be comma-separated integers, got {args.only!r}")
  if args.workers < 1:
    p.error("--workers must be >= 1")

  mutants: List[Mutant] = []
  tests_of: Dict[int, Tuple[str, ...]] = {}
  for t in targets:
    where, _, test_spec = t.partition("=")
    path, _, spec = where.partition(":")
    tests = tuple(test_spec.split(",")) if test_spec else tuple(args.tests)
    if not os.path.exists(os.path.join(REPO, path)):
      p.error(f"--target: {path} does not exist")
    if not tests and not args.list:
      p.error(f"no tests for target {t!r}: add =TESTS or --tests")
    for test in tests:
      if not _test_exists(test):
        p.error(f"tests of {t!r}: {test} does not exist")
    new = generate(path, spec or None, len(mutants))
    tests_of.update({m.index: tests for m in new})
    mutants += new
  print(f"{len(mutants)} mutants in {len(targets)} targets:", flush=True)
  for t in targets:
    print(f"  {t}")
  if args.list:
    for m in mutants:
      print(f"{m.index:4d} {m.path}:{m.line} {m.kind:15s} {m.before!r} -> "
            f"{m.after!r}")
    return 0
  todo = [m for m in mutants if only is None or m.index in only]
  if args.isolation == "inprocess":
    for m in todo:
      _top_level_function(m.path, m.line)  # Fails early if not applicable.

  t0 = time.perf_counter()
  tmp = tempfile.mkdtemp(prefix="prfl_mutation_")
  workers: List = []
  try:
    if args.isolation == "process":
      scratches = [_make_scratch(os.path.join(tmp, f"w{w}"))
                   for w in range(args.workers)]
      for s in scratches:  # Every mutant starts from the unparsed module.
        for path in sorted({m.path for m in mutants}):
          with open(os.path.join(s, path), "w", encoding="utf-8") as f:
            f.write(unparsed_source(path))
    else:
      workers = [_WorkerProcess() for _ in range(args.workers)]
    clean = {}
    for tests in sorted({tests_of[m.index] for m in todo}):
      if args.skip_clean:
        clean[tests] = None
        continue
      if args.isolation == "process":
        status, seconds, failed = run_tests_in_subprocess(scratches[0], tests,
                                                          3600)
      else:
        r = workers[0].ask(dict(kind="clean", tests=tests, timeout=3600))
        status, seconds, failed = ((r["status"], r["seconds"], r["failed"])
                                   if r else ("error", 0.0, "worker died"))
      if status != "survived":
        print(f"the tests fail without any mutant ({status}): {failed}")
        return 2
      clean[tests] = seconds
      print(f"clean run of {' '.join(tests)}: {seconds:.1f} s", flush=True)

    def timeout_of(m):
      if args.timeout:
        return args.timeout
      c = clean[tests_of[m.index]]
      return 1800.0 if c is None else max(120.0, 3.0 * c)

    lock = threading.Lock()
    queue = list(todo)
    done = []

    def report(m):
      with lock:
        done.append(m)
        n = len(done)
        killed = sum(x.status in ("killed", "timeout") for x in done)
        elapsed = time.perf_counter() - t0
        left = elapsed / n * (len(todo) - n)
        print(f"[{n}/{len(todo)}] #{m.index} {m.status:8s} "
              f"{m.path}:{m.line} {m.before!r} -> {m.after!r} "
              f"({m.seconds:.0f} s) | killed {killed}, survived "
              f"{n - killed}, ~{left / 60:.0f} min left", flush=True)

    def take():
      with lock:
        return queue.pop(0) if queue else None

    def serve_process(w):
      scratch = scratches[w]
      while (m := take()) is not None:
        dest = os.path.join(scratch, m.path)
        try:
          with open(dest, "w", encoding="utf-8") as f:
            f.write(mutated_source(m))
          m.status, m.seconds, m.failed = run_tests_in_subprocess(
              scratch, tests_of[m.index], timeout_of(m))
        finally:
          with open(dest, "w", encoding="utf-8") as f:
            f.write(unparsed_source(m.path))
        report(m)

    def serve_inprocess(w):
      while (m := take()) is not None:
        job = dict(kind="mutant", mutant=dataclasses.asdict(m),
                   tests=tests_of[m.index], timeout=timeout_of(m))
        t_start = time.perf_counter()
        r = workers[w].ask(job)
        if r is None:  # The mutant crashed the worker: killed.
          m.status, m.seconds = "killed", time.perf_counter() - t_start
          m.failed = f"worker died (exit {workers[w].proc.poll()})"
          workers[w].close()
          workers[w] = _WorkerProcess()
        else:
          m.status, m.seconds, m.failed = r["status"], r["seconds"], r["failed"]
        report(m)

    serve = serve_process if args.isolation == "process" else serve_inprocess
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
      list(pool.map(serve, range(args.workers)))
    total_s = time.perf_counter() - t0
  finally:
    for w in workers:
      w.close()
    shutil.rmtree(tmp, ignore_errors=True)

  killed = [m for m in todo if m.status in ("killed", "timeout")]
  survived = [m for m in todo if m.status == "survived"]
  errors = [m for m in todo if m.status not in ("killed", "timeout",
                                                "survived")]
  print(f"\n{len(todo)} mutants: {len(killed)} killed, {len(survived)} "
        f"survived, {len(errors)} errors, {total_s / 60:.1f} min "
        f"({args.workers} workers, {args.isolation}, load "
        f"{os.getloadavg()[0]:.1f} at the end)")
  for m in survived:
    print(f"  survived #{m.index} {m.path}:{m.line} [{m.kind}] {m.before!r}"
          f" -> {m.after!r}")
  for m in errors:
    print(f"  error #{m.index} {m.path}:{m.line}: {m.failed}")
  if args.out:
    result = dict(
        targets=targets, workers=args.workers, isolation=args.isolation,
        clean_run_s={" ".join(k): v for k, v in clean.items()},
        total_s=total_s, loadavg_end=os.getloadavg(),
        counts=dict(mutants=len(todo), killed=len(killed),
                    survived=len(survived), errors=len(errors)),
        mutants=[dict(dataclasses.asdict(m), tests=tests_of[m.index])
                 for m in todo])
    tmp_out = args.out + ".tmp"
    with open(tmp_out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
    os.replace(tmp_out, args.out)
    print(f"saved {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
