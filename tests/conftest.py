"""Suite-wide settings.

The experiments turn on JAX's persistent compilation cache under the user's
home (`experiments.cli.enable_compile_cache`); the tests run them with that
cache off, so that they write nothing outside their temporary directories.

The suite itself compiles into a persistent cache per session: a fresh
temporary directory (`$PRFL_JAX_TEST_CACHE` to keep one between runs) with
one subdirectory per pytest-xdist worker (JAX's cache writes without a lock
unless it evicts, so two workers never share a directory), removed at the
end. Many tests compile the
same programs (the reference plan of a parametrised comparison, the same
round under several checks); a program compiled once is then read from disk,
which measured 36% less CPU on test_ghost.py's plan comparisons. A hit returns
the executable a compile would have built (the key is the program, its
compile options and the backend), so results do not depend on which test ran
first. Subprocesses (the multi-process and kill tests) do not use it.
"""

import os
import shutil
import tempfile

import jax
import pytest

import prfl_jax as prfl

os.environ.setdefault("PRFL_JAX_COMPILE_CACHE", "off")

_CACHE_ENV = "PRFL_JAX_TEST_CACHE"
# Set by the controlling process, read by every xdist worker (they inherit the
# environment when they start, after `pytest_configure` ran in the controller).
_SESSION_ENV = "PRFL_JAX_TEST_SESSION_CACHE"


def pytest_configure(config):
  if not hasattr(config, "workerinput"):  # The controller (or no xdist).
    if os.environ.get(_CACHE_ENV):
      path = os.environ[_CACHE_ENV]
      os.makedirs(path, exist_ok=True)
    else:
      path = tempfile.mkdtemp(prefix="prfl-jax-test-xla-")
      config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    os.environ[_SESSION_ENV] = path
  path = os.path.join(os.environ[_SESSION_ENV],
                      os.environ.get("PYTEST_XDIST_WORKER", "main"))
  jax.config.update("jax_compilation_cache_dir", path)
  # Every program, however quick to compile: under load the compile times
  # vary, and a threshold would make what is cached depend on the load.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(name="data")
def fixture_data():
  """A small linear-regression federation (Section 5.1's, 3 clusters of 2
  clients, dimension 4, 5 examples each) for `prfl.train`'s tests."""
  return prfl.data.synthetic_regression(jax.random.key(0), num_clusters=3,
                                        clients_per_cluster=2, dim=4,
                                        num_samples=5)[0]
