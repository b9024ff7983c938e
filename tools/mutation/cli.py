"""The command line: targets and presets in, mutants run, a summary and JSON
out (`python -m tools.mutation --help`)."""

import argparse
import concurrent.futures
import dataclasses
import json
import os
import random
import shutil
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import tools.mutation as package
from tools.mutation.operators import Mutant
from tools.mutation.operators import REPO
from tools.mutation.operators import edit_mutant
from tools.mutation.operators import generate
from tools.mutation.operators import mutated_source
from tools.mutation.operators import unparsed_source
from tools.mutation.presets import PRESETS
from tools.mutation.presets import parse_target
from tools.mutation.presets import resolve_preset
from tools.mutation.presets import test_exists
from tools.mutation.workers import WorkerProcess
from tools.mutation.workers import inprocess_site
from tools.mutation.workers import make_scratch
from tools.mutation.workers import run_tests_in_subprocess
from tools.mutation.workers import site_fingerprint
from tools.mutation.workers import top_level_name
from tools.mutation.workers import worker


def select(mutants: List[Mutant], only: Optional[Set[int]] = None,
           every: int = 1, sample: Optional[int] = None,
           seed: int = 0, exclude: Optional[Set[tuple]] = None,
           key: Optional[Callable[[Mutant], tuple]] = None) -> List[Mutant]:
  """The mutants to run, in the order they run.

  Of the operator mutants: those whose number is a multiple of `every`; of
  these, if `sample` is given, the first `sample` of a permutation drawn with
  `seed` (uniform without replacement), in that order, so that a larger
  `sample` extends a smaller one and the first n mutants a run finishes are
  the sample of n. Mutants whose `key(m)` is in `exclude` (those an earlier
  sample ran) are dropped from the permutation before the first `sample` are
  taken, so the rest is a uniform sample of the mutants not run before. Then
  every edit. Then only those in `only` (all if None).
  """
  ops = [m for m in mutants if m.kind != "edit" and m.index % every == 0]
  if sample is not None:
    random.Random(seed).shuffle(ops)
    if exclude:
      ops = [m for m in ops if key(m) not in exclude]
    ops = ops[:sample]
  return [m for m in ops + [m for m in mutants if m.kind == "edit"]
          if only is None or m.index in only]


def exclusion_key(path: str, function: Optional[str], kind: str, before: str,
                  after: str) -> tuple:
  """What `--exclude` matches a mutant on: its module, top-level function,
  kind and change, not its line (lines move when code above them changes)."""
  return path, function, kind, before, after


def excluded(paths: Sequence[str]) -> Set[tuple]:
  """The exclusion keys of the finished operator mutants of result JSONs."""
  out = set()
  for path in paths:
    with open(path, encoding="utf-8") as f:
      out |= {exclusion_key(m["path"], m.get("function"), m["kind"],
                            m["before"], m["after"])
              for m in json.load(f)["mutants"]
              if m["kind"] != "edit" and m["status"] != "pending"}
  return out


def _save(path: str, header: dict, todo: List[Mutant],
          tests_of: Dict[int, Tuple[str, ...]],
          fingerprints: Dict[int, dict]) -> None:
  """Writes the run so far (atomically: after every mutant, so a stopped
  run keeps what it finished); `fingerprints` are `site_fingerprint`'s per
  mutant number, taken once before the run (the sources do not change)."""
  done = [m for m in todo if m.status != "pending"]
  count = lambda *s: sum(m.status in s for m in done)
  result = dict(header, counts=dict(
      mutants=len(todo), done=len(done), killed=count("killed", "timeout"),
      timeouts=count("timeout"), survived=count("survived"),
      starved=count("starved"),
      errors=len(done) - count("killed", "timeout", "survived", "starved")),
                mutants=[dict(dataclasses.asdict(m), tests=tests_of[m.index],
                              **fingerprints[m.index])
                         for m in todo])
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  os.replace(path + ".tmp", path)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      description=package.__doc__.split("\n")[0],
      epilog="presets: " + ", ".join(PRESETS))
  p.add_argument("--target", action="append", default=[],
                 help="PATH[:FUNC[,FUNC...] | :FIRST-LAST][=TEST[,TEST...]]")
  p.add_argument("--tests", nargs="+", default=[],
                 help="pytest files / node ids for targets without =TESTS")
  p.add_argument("--preset", action="append", default=[],
                 choices=list(PRESETS),
                 help="a named set of targets with their tests (added to "
                 "--target; repeatable); tools/README.md lists them")
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
                 help="CPU seconds per mutant (default: 3x the clean run of "
                 "its tests, >= 120; 1800 with --skip-clean); a mutant whose "
                 "tests reach 4x that in wall time first was starved by "
                 "other jobs: it runs again, and never counts as killed")
  p.add_argument("--retries", type=int, default=2,
                 help="how many times a starved mutant runs again, at the "
                 "end of the queue (default 2); then it is left 'starved'")
  p.add_argument("--only", default=None,
                 help="comma-separated mutant numbers to run")
  p.add_argument("--every", type=int, default=1,
                 help="a deterministic sample: only the mutants whose number "
                 "is a multiple of EVERY, and every edit (default 1: all)")
  p.add_argument("--sample", type=int, default=None,
                 help="a seeded random sample: the first SAMPLE operator "
                 "mutants (of those --every keeps) of a permutation drawn "
                 "with --seed, and every edit; --only then narrows it")
  p.add_argument("--seed", type=int, default=0,
                 help="the seed of --sample (default 0)")
  p.add_argument("--exclude", action="append", default=[],
                 help="a result JSON (repeatable): its finished operator "
                 "mutants (matched by module, function, kind and change) "
                 "are left out of --sample, which then samples the others")
  p.add_argument("--budget", type=float, default=None,
                 help="seconds of wall time after which no new mutant starts "
                 "(those left are recorded as pending; with --sample, the "
                 "mutants done are the sample of their number)")
  p.add_argument("--list", action="store_true",
                 help="print the mutants and exit")
  p.add_argument("--out", default=None, help="JSON results file")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    return worker()

  targets = [parse_target(t, args.tests) for t in args.target]
  for name in args.preset:
    targets += resolve_preset(name)
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
  if args.every < 1:
    p.error("--every must be >= 1")
  if args.budget is not None and args.budget <= 0:
    p.error(f"--budget must be > 0 seconds, got {args.budget}")
  if args.sample is not None and args.sample < 0:
    p.error(f"--sample must be >= 0, got {args.sample}")
  if args.retries < 0:
    p.error(f"--retries must be >= 0, got {args.retries}")
  if args.exclude and args.sample is None:
    p.error("--exclude needs --sample")
  for path in args.exclude:
    if not os.path.isfile(path):
      p.error(f"--exclude: {path} does not exist")

  mutants: List[Mutant] = []
  tests_of: Dict[int, Tuple[str, ...]] = {}
  for t in targets:
    if not os.path.exists(os.path.join(REPO, t.path)):
      p.error(f"--target: {t.path} does not exist")
    if not t.tests and not args.list:
      p.error(f"no tests for target {str(t)!r}: add =TESTS or --tests")
    for test in t.tests:
      if not test_exists(test):
        p.error(f"tests of {str(t)!r}: {test} does not exist")
    if t.edit is not None:
      new = [edit_mutant(t.path, t.spec, t.edit.old, t.edit.new, t.edit.why,
                         len(mutants))]
    else:
      new = generate(t.path, t.spec, len(mutants))
    tests_of.update({m.index: t.tests for m in new})
    mutants += new
  print(f"{len(mutants)} mutants in {len(targets)} targets:", flush=True)
  for t in targets:
    print(f"  {t}")
  todo = select(mutants, only, args.every, args.sample, args.seed,
                excluded(args.exclude),
                lambda m: exclusion_key(m.path, top_level_name(m.path, m.line),
                                        m.kind, m.before, m.after))
  if args.list:
    for m in todo:
      print(f"{m.index:4d} {m.path}:{m.line} {m.kind:15s} {m.before!r} -> "
            f"{m.after!r}" + (f"  [{m.why}]" if m.why else ""))
    return 0
  if args.isolation == "inprocess":
    for m in todo:
      inprocess_site(m.path, m.line)  # Fails early if not applicable.

  t0 = time.perf_counter()
  tmp = tempfile.mkdtemp(prefix="prfl_mutation_")
  workers: List = []
  try:
    if args.isolation == "process":
      scratches = [make_scratch(os.path.join(tmp, f"w{w}"))
                   for w in range(args.workers)]
      for s in scratches:  # Every mutant starts from the unparsed module.
        for path in sorted({m.path for m in mutants}):
          with open(os.path.join(s, path), "w", encoding="utf-8") as f:
            f.write(unparsed_source(path))
    else:
      workers = [WorkerProcess() for _ in range(args.workers)]
    clean: Dict[Tuple[str, ...], object] = {}
    clean_lock = threading.Lock()

    def clean_run(tests, run):
      """CPU seconds of the tests' run without a mutant (wall seconds in
      process isolation; None: --skip-clean), or why they fail without one;
      run once per test set, when first needed."""
      tests = tuple(sorted(tests))  # The same set in another order.
      with clean_lock:
        if tests not in clean and args.skip_clean:
          clean[tests] = None
        elif tests not in clean:
          status, seconds, failed, cpu = run(tests, 3600)
          clean[tests] = ((seconds if cpu is None else cpu)
                          if status == "survived" else
                          f"its tests fail without any mutant ({status}): "
                          f"{failed}")
          print(f"clean run of {' '.join(tests)}: {clean[tests]}", flush=True)
        return clean[tests]

    def timeout_of(m):
      if args.timeout:
        return args.timeout
      c = clean[tuple(sorted(tests_of[m.index]))]
      return 1800.0 if c is None else max(120.0, 3.0 * c)

    lock = threading.Lock()
    queue = list(todo)
    done = []
    header = dict(
        presets=args.preset, operator_mutants=sum(
            m.kind != "edit" for m in mutants),
        targets=[str(t) for t in targets], workers=args.workers,
        isolation=args.isolation, every=args.every, sample=args.sample,
        seed=args.seed, budget=args.budget, retries=args.retries,
        exclude=args.exclude)
    fingerprints = {m.index: site_fingerprint(m.path, m.line, tests_of[m.index])
                    for m in todo} if args.out else {}

    def state(elapsed):
      return dict(header, total_s=elapsed, loadavg_end=os.getloadavg(),
                  clean_run_s={" ".join(k): v for k, v in clean.items()})

    tries: Dict[int, int] = {}

    def report(m):
      with lock:
        tries[m.index] = tries.get(m.index, 0) + 1
        if m.status == "starved" and tries[m.index] <= args.retries:
          print(f"#{m.index} starved ({m.seconds:.0f} s wall, "
                f"{m.cpu_seconds or 0:.0f} s CPU): it runs again at the end",
                flush=True)
          m.status = "pending"
          queue.append(m)
          return
        done.append(m)
        n = len(done)
        killed = sum(x.status in ("killed", "timeout") for x in done)
        survived = sum(x.status == "survived" for x in done)
        elapsed = time.perf_counter() - t0
        left = elapsed / n * (len(todo) - n)
        print(f"[{n}/{len(todo)}] #{m.index} {m.status:8s} "
              f"{m.path}:{m.line} {m.before!r} -> {m.after!r} "
              f"({m.seconds:.0f} s) | killed {killed}, survived "
              f"{survived}, ~{left / 60:.0f} min left", flush=True)
        if args.out:
          _save(args.out, state(elapsed), todo, tests_of, fingerprints)

    def take():
      with lock:
        if args.budget and time.perf_counter() - t0 > args.budget:
          return None
        return queue.pop(0) if queue else None

    def unclean(m, run):
      """Records an error for `m` if its tests fail without any mutant."""
      c = clean_run(tests_of[m.index], run)
      if isinstance(c, str):
        m.status, m.failed = "error", c
        report(m)
      return isinstance(c, str)

    def serve_process(w):
      scratch = scratches[w]
      run = lambda tests, timeout: run_tests_in_subprocess(scratch, tests,
                                                           timeout)
      while (m := take()) is not None:
        if unclean(m, run):
          continue
        dest = os.path.join(scratch, m.path)
        try:
          with open(dest, "w", encoding="utf-8") as f:
            f.write(mutated_source(m))
          m.status, m.seconds, m.failed, m.cpu_seconds = (
              run_tests_in_subprocess(scratch, tests_of[m.index],
                                      timeout_of(m)))
        finally:
          with open(dest, "w", encoding="utf-8") as f:
            f.write(unparsed_source(m.path))
        report(m)

    def serve_inprocess(w):
      def run(tests, timeout):
        r = workers[w].ask(dict(kind="clean", tests=tests, timeout=timeout))
        return ((r["status"], r["seconds"], r["failed"], r["cpu_seconds"])
                if r else ("error", 0.0, "worker died", None))
      while (m := take()) is not None:
        if unclean(m, run):
          continue
        job = dict(kind="mutant", mutant=dataclasses.asdict(m),
                   tests=tests_of[m.index], timeout=timeout_of(m))
        t_start = time.perf_counter()
        r = workers[w].ask(job)
        if r is None:  # The mutant crashed the worker: killed.
          m.status, m.seconds = "killed", time.perf_counter() - t_start
          m.failed = f"worker died (exit {workers[w].proc.poll()})"
          workers[w].close()
          workers[w] = WorkerProcess()
        else:
          m.status, m.seconds, m.failed, m.cpu_seconds = (
              r["status"], r["seconds"], r["failed"], r["cpu_seconds"])
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
  pending = [m for m in todo if m.status == "pending"]
  errors = [m for m in todo if m.status == "error"]
  starved = [m for m in todo if m.status == "starved"]
  timeouts = sum(m.status == "timeout" for m in todo)
  print(f"\n{len(todo) - len(pending)} of {len(todo)} mutants run: "
        f"{len(killed)} killed ({timeouts} of them by their CPU limit), "
        f"{len(survived)} survived, {len(starved)} starved (undecided), "
        f"{len(errors)} errors, {total_s / 60:.1f} "
        f"min ({args.workers} workers, {args.isolation}, load "
        f"{os.getloadavg()[0]:.1f} at the end)")
  for m in survived:
    print(f"  survived #{m.index} {m.path}:{m.line} [{m.kind}] {m.before!r}"
          f" -> {m.after!r}")
  for m in errors:
    print(f"  error #{m.index} {m.path}:{m.line}: {m.failed}")
  for m in starved:
    print(f"  starved #{m.index} {m.path}:{m.line}: run it again (--only)")
  if args.out:
    _save(args.out, state(total_s), todo, tests_of, fingerprints)
    print(f"saved {args.out}")
  return 2 if any(isinstance(c, str) for c in clean.values()) else 0

