"""Running a mutant's tests: in a long-lived worker process that swaps the
mutated code in (`inprocess`), or in a fresh pytest process on a scratch copy
of the repository (`process`)."""

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence, Tuple

from tools.mutation.operators import Mutant
from tools.mutation.operators import REPO
from tools.mutation.operators import mutated_source

# -n 0: in this process, where the mutated code is (setup.cfg's addopts would
# send the tests to pytest-xdist workers). -rfE: the summary names the failing
# test (setup.cfg's -rs lists only skips).
PYTEST_ARGS = ("-x", "-q", "-n", "0", "-rfE", "-p", "no:cacheprovider", "-p",
               "no:randomly")


def _repo_files() -> List[str]:
  out = subprocess.run(
      ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
      capture_output=True, text=True, check=True).stdout.split("\n")
  return [f for f in out if f and os.path.isfile(os.path.join(REPO, f))]


def make_scratch(root: str) -> str:
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
  cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests]
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




def inprocess_site(path: str, line: int) -> Tuple[str, str]:
  """What an in-process worker swaps for a mutant at `path:line`:
  `("function", name)` for a line of a top-level function (its code and
  default values), `("constant", name)` for a module-level `NAME = ...`.

  A constant is rebound on its module only: a copy imported elsewhere with
  `from module import NAME` keeps the original (use `--isolation process`).
  """
  tree = ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read())
  for node in tree.body:
    if not node.lineno <= line <= node.end_lineno:
      continue
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      return "function", node.name
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, ast.AnnAssign) else [])
    if len(targets) == 1 and isinstance(targets[0], ast.Name):
      return "constant", targets[0].id
  raise SystemExit(
      f"error: {path}:{line} is neither in a top-level function nor a "
      "module-level constant; use --isolation process for it")


def site_fingerprint(path: str, line: int, tests: Sequence[str]) -> dict:
  """What identifies a mutant's result across runs and sessions: the
  top-level function or constant holding `path:line` (None if neither), the
  sha256 of its source, and of its test files with `tests/conftest.py`.

  Equal fingerprints do not prove the same outcome (the tests also run code
  outside the mutated function), so no run skips a mutant on them; they let a
  reader match results of different sessions.
  """
  source = open(os.path.join(REPO, path), encoding="utf-8").read()
  node = next((n for n in ast.parse(source).body
               if n.lineno <= line <= n.end_lineno), None)
  name = getattr(node, "name", None)
  if isinstance(node, (ast.Assign, ast.AnnAssign)):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    name = ",".join(t.id for t in targets if isinstance(t, ast.Name)) or None
  segment = ast.get_source_segment(source, node) if node else ""
  files = sorted({t.split("::")[0] for t in tests} | {"tests/conftest.py"})
  digest = hashlib.sha256()
  for f in files:
    full = os.path.join(REPO, f)
    if os.path.exists(full):
      digest.update(f.encode() + b"\0" + open(full, "rb").read())
  return dict(function=name,
              source_sha=hashlib.sha256(segment.encode()).hexdigest()[:16],
              tests_sha=digest.hexdigest()[:16])


def _module_name(path: str) -> str:
  return os.path.splitext(path)[0].replace(os.sep, ".").replace("/", ".")


def _top_level(tree: ast.Module, name: str) -> ast.AST:
  return next(n for n in tree.body if getattr(n, "name", None) == name or (
      isinstance(n, (ast.Assign, ast.AnnAssign)) and name in [
          t.id for t in (n.targets if isinstance(n, ast.Assign) else
                         [n.target]) if isinstance(t, ast.Name)]))


def swap_in(m: Mutant) -> Callable[[], None]:
  """Puts mutant `m` into the imported library; returns the undo."""
  import importlib  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(_module_name(m.path))
  kind, name = inprocess_site(m.path, m.line)
  source = mutated_source(m)
  node = _top_level(ast.parse(source), name)
  evaluate = lambda e: eval(  # pylint: disable=eval-used
      compile(ast.Expression(e), m.path, "eval"), module.__dict__)
  if kind == "constant":
    old_value = getattr(module, name)
    setattr(module, name, evaluate(node.value))
    return lambda: setattr(module, name, old_value)
  code = compile(source, m.path, "exec")
  new = next(c for c in code.co_consts
             if isinstance(c, types.CodeType) and c.co_name == name)
  fn = getattr(module, name)
  while hasattr(fn, "__wrapped__"):  # jax.jit, functools.wraps.
    fn = fn.__wrapped__
  args = node.args
  defaults = tuple(evaluate(e) for e in args.defaults) or None
  kwdefaults = {a.arg: evaluate(e) for a, e in zip(args.kwonlyargs,
                                                   args.kw_defaults)
                if e is not None} or None
  old = fn.__code__, fn.__defaults__, fn.__kwdefaults__
  fn.__code__, fn.__defaults__, fn.__kwdefaults__ = new, defaults, kwdefaults

  def undo():
    fn.__code__, fn.__defaults__, fn.__kwdefaults__ = old
  return undo


class _Timeout(Exception):
  pass


def worker() -> int:
  """In-process worker: reads jobs (JSON lines) on stdin, answers on stdout.

  The library and the tests are imported once. For each mutant, `swap_in`
  replaces the code of the top-level function that holds the mutated line
  (every reference to the function, e.g. `prfl.masked_quantile` or a name
  imported by a test, runs the mutant) or rebinds the module constant, JAX's
  caches are cleared, pytest runs in this process, and the original is
  restored.
  """
  import contextlib  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
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
          rc = pytest.main([*PYTEST_ARGS, *tests])
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
      undo = swap_in(Mutant(**job["mutant"]))
      jax.clear_caches()
      try:
        status, seconds, failed = run(job["tests"], job["timeout"])
      finally:
        undo()
        jax.clear_caches()
      result = dict(status=status, seconds=seconds, failed=failed)
    reply.write(json.dumps(result) + "\n")
    reply.flush()
  return 0


class WorkerProcess:
  """A `--worker` subprocess and its pipes."""

  def __init__(self):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "tools.mutation", "--worker"], cwd=REPO,
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


