"""Running a mutant's tests: in a long-lived worker process that swaps the
mutated code in (`inprocess`), or in a fresh pytest process on a scratch copy
of the repository (`process`)."""

import ast
import contextlib
import functools
import hashlib
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence, Tuple

from tools.mutation.operators import Mutant
from tools.mutation.operators import REPO
from tools.mutation.operators import mutated_source
from tools.mutation.ordering import ordered_tests

# -n 0: in this process, where the mutated code is (setup.cfg's addopts would
# send the tests to pytest-xdist workers). -rfE: the summary names the failing
# test (setup.cfg's -rs lists only skips).
PYTEST_ARGS = ("-x", "-q", "-n", "0", "-rfE", "-p", "no:cacheprovider", "-p",
               "no:randomly")

# A mutant's time limit is in CPU seconds of its tests (a mutant that loops
# uses them up: "timeout", killed); a run that reaches STARVED_FACTOR times
# the limit in wall time first was starved by other jobs on the machine
# ("starved": undecided, run again later, never counted as killed).
STARVED_FACTOR = 4.0


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


# Runs `python ARGS...` with a CPU-seconds limit (RLIMIT_CPU: SIGXCPU ends
# a process that uses it up, with all its threads).
_CPU_LIMITED = ("import os, resource, sys; s = int(sys.argv[1]); "
                "resource.setrlimit(resource.RLIMIT_CPU, (s, s + 5)); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")


def run_tests_in_subprocess(scratch: str, tests: Sequence[str],
                            timeout: float,
                            starved_factor: float = STARVED_FACTOR):
  """Runs pytest in `scratch` with `timeout` CPU seconds (wall guard:
  `starved_factor` times that); returns (status, wall seconds, first failure,
  None: the child's CPU seconds are not measured)."""
  env = dict(os.environ)
  env["PYTHONPATH"] = scratch
  env["PYTHONDONTWRITEBYTECODE"] = "1"
  env.setdefault("JAX_PLATFORMS", "cpu")
  cmd = [sys.executable, "-c", _CPU_LIMITED, str(math.ceil(timeout)), "-m",
         "pytest", *PYTEST_ARGS, *tests]
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True,
                          text=True, timeout=starved_factor * timeout)
  except subprocess.TimeoutExpired:
    return "starved", time.perf_counter() - t0, "", None
  seconds = time.perf_counter() - t0
  if proc.returncode == -signal.SIGXCPU:
    return "timeout", seconds, "", None
  if proc.returncode == 0:
    return "survived", seconds, "", None
  if proc.returncode in (1, 2):  # Test failure; collection/import error.
    return "killed", seconds, _first_failure(proc.stdout + proc.stderr), None
  return "error", seconds, (proc.stdout + proc.stderr)[-300:], None


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


@functools.lru_cache(maxsize=None)
def _source(path: str) -> str:
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    return f.read()


@functools.lru_cache(maxsize=None)
def _tree(path: str) -> ast.Module:
  return ast.parse(_source(path))


def _top_level_node(path: str, line: int) -> Optional[ast.AST]:
  return next((n for n in _tree(path).body
               if n.lineno <= line <= n.end_lineno), None)


def top_level_name(path: str, line: int) -> Optional[str]:
  """The top-level function or constant holding `path:line` (None if
  neither); the sources are read once per run (a run never changes them)."""
  node = _top_level_node(path, line)
  if isinstance(node, (ast.Assign, ast.AnnAssign)):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return ",".join(t.id for t in targets if isinstance(t, ast.Name)) or None
  return getattr(node, "name", None)


def site_fingerprint(path: str, line: int, tests: Sequence[str]) -> dict:
  """What identifies a mutant's result across runs and sessions: the
  top-level function or constant holding `path:line` (None if neither), the
  sha256 of its source, and of its test files with `tests/conftest.py`.

  Equal fingerprints do not prove the same outcome (the tests also run code
  outside the mutated function), so no run skips a mutant on them; they let a
  reader match results of different sessions.
  """
  source = _source(path)
  node = _top_level_node(path, line)
  name = top_level_name(path, line)
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
  closures = _swap_closures(fn.__code__, new)
  fn.__code__, fn.__defaults__, fn.__kwdefaults__ = new, defaults, kwdefaults

  def undo():
    fn.__code__, fn.__defaults__, fn.__kwdefaults__ = old
    for f, code in closures:
      f.__code__ = code
  return undo


def _nested_codes(code) -> dict:
  """The code objects of the functions defined inside `code`, at any depth,
  by qualified name."""
  import types  # pylint: disable=g-import-not-at-top
  out = {}
  for c in code.co_consts:
    if isinstance(c, types.CodeType):
      out[c.co_qualname] = c
      out.update(_nested_codes(c))
  return out


def _swap_closures(old_code, new_code) -> list:
  """Gives the live functions made from the functions nested in `old_code`
  (a factory's closures, e.g. a rule a test module built at import) the
  mutated code; returns (function, original code) pairs for the undo.

  Swapping the factory's `__code__` alone reaches only closures made after
  the swap. A closure whose mutated code has other free variables (an edit
  that names another variable) keeps its code.
  """
  import gc  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  old, new = _nested_codes(old_code), _nested_codes(new_code)
  by_code = {id(c): new[q] for q, c in old.items()
             if q in new and new[q].co_freevars == c.co_freevars}
  swapped = []
  for f in gc.get_objects():
    if isinstance(f, types.FunctionType) and id(f.__code__) in by_code:
      swapped.append((f, f.__code__))
      f.__code__ = by_code[id(f.__code__)]
  return swapped


class CpuLimit(Exception):
  """The tests used up their CPU seconds."""


class Starved(Exception):
  """The wall-clock guard ran out before the CPU limit."""


@contextlib.contextmanager
def limits(cpu_seconds: float, starved_factor: float = STARVED_FACTOR):
  """Raises `CpuLimit` in the block once this process has used `cpu_seconds`
  of CPU (all threads: ITIMER_PROF), or `Starved` once `starved_factor`
  times that has passed in wall time. Main thread only (signals)."""

  def raise_(exc):
    def handler(signum, frame):
      raise exc()
    return handler

  old = (signal.signal(signal.SIGPROF, raise_(CpuLimit)),
         signal.signal(signal.SIGALRM, raise_(Starved)))
  signal.setitimer(signal.ITIMER_PROF, cpu_seconds)
  signal.setitimer(signal.ITIMER_REAL, starved_factor * cpu_seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGPROF, old[0])
    signal.signal(signal.SIGALRM, old[1])


def cpu_seconds() -> float:
  """CPU seconds this process has used (user + system, all threads)."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def run_pytest_here(tests: Sequence[str], timeout: float):
  """Runs pytest on `tests` in this process under `limits(timeout)`; returns
  (status, wall seconds, first failure, CPU seconds)."""
  import pytest  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryFile("w+") as log:
    saved = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    t0, c0 = time.perf_counter(), cpu_seconds()
    limit = None
    try:
      with limits(timeout):
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
          rc = pytest.main([*PYTEST_ARGS, *tests])
    except (CpuLimit, Starved) as e:
      rc, limit = -1, type(e).__name__
    finally:
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      os.close(saved[0])
      os.close(saved[1])
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    log.seek(0)
    out = log.read()
  # A limit raised inside a test is caught by pytest: read its name.
  if limit == "Starved" or (limit is None and "Starved" in out):
    return "starved", seconds, "", cpu
  if limit == "CpuLimit" or "CpuLimit" in out:
    return "timeout", seconds, "", cpu
  if rc == 0:
    return "survived", seconds, "", cpu
  if rc in (1, 2):
    return "killed", seconds, _first_failure(out), cpu
  return "error", seconds, f"pytest exit {rc}: " + out[-300:], cpu


def reset_persistent_cache():
  """Lets the next pytest session choose JAX's persistent compilation cache.

  JAX opens the cache's directory once per process, at the first compile,
  and keeps it; tests/conftest.py gives each pytest session a fresh
  temporary directory and removes it when the session ends. In a worker,
  which runs one session per mutant, every session after the first then
  wrote its entries into the removed directory (a warning) and missed: seen
  by hand with no mutant at all, two sessions in one process, the second
  failed test_train.py's
  test_runs_that_differ_in_the_key_share_one_compiled_program (it asserts
  no miss). The results name it as the killer of 16 train.py mutants
  (session 16's census #29 and #50 at 9158dc9, 13 of session 8's whole run,
  1 of session 7's sample): #29 survives both files by hand.
  """
  from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
  compilation_cache.reset_cache()


def _is_project_module(name: str) -> bool:
  """A module of the library, the experiments, the benchmarks or the tests
  (whose caches may hold what a mutant built), not of the tool or a
  dependency."""
  top = name.split(".")[0]
  return (top in ("prfl_jax", "experiments", "benchmarks", "tests",
                  "conftest") or name.split(".")[-1].startswith("test_"))


def clear_project_caches() -> int:
  """Empties every `functools` cache of a project function; returns how many.

  A test module is imported once per worker, so a module-level cache (e.g.
  tests/test_momentum_clustering.py's `_loss_alg`, tests/test_fc_defence.py's
  and tests/test_ghost.py's `lru_cache`s) keeps what the first session that
  called it built: an algorithm made by that session's mutated factory,
  whose closures carry that mutant's code (not the clean code a later swap
  replaces). Every later mutant's session reused it: session 17 found 35
  `algorithms` kills credited to the two tests that call `_loss_alg`, 19 of
  them surviving with the mutant written into the source. Cleared before
  each session, as JAX's caches are.
  """
  import gc  # pylint: disable=g-import-not-at-top
  cleared = 0
  for obj in gc.get_objects():
    if (isinstance(obj, functools._lru_cache_wrapper)  # pylint: disable=protected-access
        and _is_project_module(getattr(obj, "__module__", None) or "")):
      obj.cache_clear()
      cleared += 1
  return cleared


def worker() -> int:
  """In-process worker: reads jobs (JSON lines) on stdin, answers on stdout.

  The library and the tests are imported once. For each mutant, `swap_in`
  replaces the code of the top-level function that holds the mutated line
  (every reference to the function, e.g. `prfl.masked_quantile` or a name
  imported by a test, runs the mutant) or rebinds the module constant, JAX's
  caches are cleared, pytest runs in this process (the tests that name the
  mutated function first: `ordering.ordered_tests`), and the original is
  restored.
  """
  import jax  # pylint: disable=g-import-not-at-top

  sys.path.insert(0, REPO)
  os.chdir(REPO)
  reply = os.fdopen(os.dup(1), "w")  # Tests' output goes to a log instead.

  for line in sys.stdin:
    job = json.loads(line)
    undo, tests = None, job["tests"]
    if job["kind"] == "mutant":
      m = Mutant(**job["mutant"])
      undo = swap_in(m)
      tests = ordered_tests(tests, top_level_name(m.path, m.line), [
          n.name for n in _tree(m.path).body
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))])
    jax.clear_caches()
    reset_persistent_cache()
    clear_project_caches()
    try:
      status, seconds, failed, cpu = run_pytest_here(tests, job["timeout"])
    finally:
      if undo is not None:
        undo()
        jax.clear_caches()
    reply.write(json.dumps(dict(status=status, seconds=seconds, failed=failed,
                                cpu_seconds=cpu)) + "\n")
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


