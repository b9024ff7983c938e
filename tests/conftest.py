"""Suite-wide settings.

The experiments turn on JAX's persistent compilation cache under the user's
home (`experiments.cli.enable_compile_cache`); the tests run them with that
cache off, so that they write nothing outside their temporary directories.

The suite itself compiles into one persistent cache per session: a fresh
temporary directory (`$PRFL_JAX_TEST_CACHE` to keep one between runs),
removed at the end, shared by every pytest-xdist worker and by every
subprocess a test starts (the kill-and-resume, multi-process and sharding
tests): the controlling process sets `JAX_COMPILATION_CACHE_DIR` before any
of them starts. Many tests compile the same programs (the reference plan of a
parametrised comparison, the same round under several checks, a killed
subprocess's run and its uninterrupted twin), and a program compiled once
is then read from disk: 36% less CPU on test_ghost.py's plan comparisons
within one process. One directory for all, not one per worker: JAX puts the
directory's path into every key (the XLA caches it enables live under it),
so per-worker directories shared nothing across workers.

A hit returns the executable a compile would have built (the key is the
program, its compile options and the backend), so results do not depend on
which test or worker ran first. JAX writes an entry without a lock (unless
it evicts, which the suite never asks for); if a worker reads an entry that
another is writing at that moment, it fails zlib's checksum (CI installs no
zstandard), JAX warns and compiles the program itself: the race can cost a
compile, never a number.

On a host without an accelerator plugin, the suite also compiles at XLA's
backend optimisation level 0 (`--xla_backend_optimization_level=0` added to
`XLA_FLAGS`, for the workers and subprocesses too, unless `XLA_FLAGS`
already names a level): LLVM's optimisation of the generated CPU code is
much of XLA:CPU's compile time, and the suite's problems are small enough
that compiling dominates running. XLA hands the level to LLVM, which
optimises and emits the machine code: results may differ from the default
level's in the last bits, and two programs of one computation may round
apart where they agreed to the bit at the default level (the sweep's 1-point
and 4-point programs: 1 ulp; test_sweep_experiment.py compares them to
float32 rounding). Every other test passed at level 0 unchanged. The
Byzantine smoke run took 97 CPU-s at the default level and 55 at level 0;
the kernel-trace and streaming tests 182 and 112 (session 7, load 5-7). A
GPU run keeps JAX's defaults.

The paths through optional packages that the test extra installs (the tfds
loader on `tfds.testing.mock_data`, the PyTorch reference checks) are marked
`tfds` / `torch`; the end of the run names how each of them ended, so a CI
log shows them passing, not skipped, without listing every passed test.
"""

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile

import jax
import pytest

import prfl_jax as prfl

os.environ.setdefault("PRFL_JAX_COMPILE_CACHE", "off")

_CACHE_ENV = "PRFL_JAX_TEST_CACHE"
# Read by JAX in every process that imports it after `pytest_configure` ran
# in the controller: the xdist workers and the tests' subprocesses.
_JAX_ENV = {
    "JAX_COMPILATION_CACHE_DIR": None,
    # Every program, however quick to compile: under load the compile times
    # vary, and a threshold would make what is cached depend on the load.
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}


_OPT_LEVEL = "--xla_backend_optimization_level"


def _accelerator_plugin() -> bool:
  """Whether JAX would find a PJRT plugin (CUDA, ROCm, TPU) here."""
  return bool(importlib.metadata.entry_points(group="jax_plugins") or
              importlib.util.find_spec("jax_plugins"))


def pytest_configure(config):
  if not hasattr(config, "workerinput"):  # The controller (or no xdist).
    flags = os.environ.get("XLA_FLAGS", "")
    if _OPT_LEVEL not in flags and not _accelerator_plugin():
      os.environ["XLA_FLAGS"] = f"{flags} {_OPT_LEVEL}=0".strip()
    if os.environ.get(_CACHE_ENV):
      path = os.environ[_CACHE_ENV]
      os.makedirs(path, exist_ok=True)
    else:
      path = tempfile.mkdtemp(prefix="prfl-jax-test-xla-")
      config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    os.environ.update({k: v or path for k, v in _JAX_ENV.items()})
  # This process imported jax before the variables were set.
  jax.config.update("jax_compilation_cache_dir",
                    os.environ["JAX_COMPILATION_CACHE_DIR"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(name="data")
def fixture_data():
  """A small linear-regression federation (Section 5.1's, 3 clusters of 2
  clients, dimension 4, 5 examples each) for `prfl.train`'s tests."""
  return prfl.data.synthetic_regression(jax.random.key(0), num_clusters=3,
                                        clients_per_cluster=2, dim=4,
                                        num_samples=5)[0]


OPTIONAL_PATHS = ("tfds", "torch")  # Markers, registered in setup.cfg.


@pytest.hookimpl(trylast=True)  # After the durations, near the totals.
def pytest_terminal_summary(terminalreporter):
  """One line per optional-package path: its tests and how each ended."""
  outcomes = {name: [] for name in OPTIONAL_PATHS}
  for outcome in ("passed", "failed", "skipped", "error"):
    for report in terminalreporter.stats.get(outcome, ()):
      if report.when != "call" and outcome == "passed":
        continue
      for name in OPTIONAL_PATHS:  # A collection error's report has none.
        if name in getattr(report, "keywords", ()):
          outcomes[name].append(f"{report.nodeid.split('::', 1)[-1]} "
                                f"{outcome}")
  for name, ended in outcomes.items():
    if ended:
      terminalreporter.write_line(
          f"{name} path ({len(ended)}): " + ", ".join(sorted(ended)))
