"""The suite's own terminal summary (tests/conftest.py) under the reports
pytest hands it."""

from _pytest.reports import CollectReport
from _pytest.reports import TestReport

from tests import conftest


class _Reporter:
  """The two members of pytest's TerminalReporter the hook uses."""

  def __init__(self, stats):
    self.stats, self.lines = stats, []

  def write_line(self, line):
    self.lines.append(line)


def test_summary_lists_optional_paths_and_survives_a_collection_error():
  """A test file that fails to import gives a `CollectReport` (no
  `keywords`) under "error"; the summary must still name the optional-path
  tests. Seen to fail before the fix: AttributeError from the hook, which
  ended the whole pytest run with an internal error and exit code 1 (so
  the mutation tool's in-process worker died on mutants that break a test
  module's import: session 15's aggregators #16, #19, #22)."""
  collect = CollectReport("tests/test_broken.py", "failed", "ImportError",
                          [])
  torch = TestReport("tests/test_x.py::test_t", ("tests/test_x.py", 1, "t"),
                     {"torch": 1, "test_t": 1}, "passed", None, "call")
  setup = TestReport("tests/test_x.py::test_u", ("tests/test_x.py", 2, "u"),
                     {"tfds": 1}, "passed", None, "setup")
  reporter = _Reporter({"error": [collect], "passed": [torch, setup]})
  conftest.pytest_terminal_summary(reporter)
  assert reporter.lines == ["torch path (1): test_t passed"]
