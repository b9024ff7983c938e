"""The entries a preset is made of, and what they resolve to."""

import dataclasses
from typing import Optional, Tuple

Paths = Tuple[str, ...]  # Candidate locations of one module, first found used.
TestSets = Tuple[Tuple[str, ...], ...]  # Per set: candidates, first found run.


@dataclasses.dataclass(frozen=True)
class Lines:
  """The operator mutants of `functions`' bodies (dotted names reach nested
  functions; a module-level constant is given as its line range `A-B`)."""
  paths: Paths
  functions: Tuple[str, ...]
  tests: TestSets


@dataclasses.dataclass(frozen=True)
class Edit:
  """One named text replacement: `old` (exactly once in `function`, or in the
  module when `function` is None) becomes `new`. `why` names the defect."""
  paths: Paths
  function: Optional[str]
  old: str
  new: str
  why: str
  tests: TestSets


@dataclasses.dataclass(frozen=True)
class Target:
  """A resolved entry: an existing module, its selection and its tests."""
  path: str
  spec: Optional[str]  # FUNC[,FUNC...] | FIRST-LAST | None (whole module).
  tests: Tuple[str, ...]
  edit: Optional[Edit] = None

  def __str__(self):
    where = f"{self.path}:{self.spec}" if self.spec else self.path
    if self.edit is not None:
      where += f" edit {self.edit.why!r}"
    return where + ("=" + ",".join(self.tests) if self.tests else "")
