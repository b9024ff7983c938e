"""`python -m tools.mutation ...` (or `python tools/mutation ...`)."""

import os
import sys

if __package__ in (None, ""):  # `python tools/mutation`: the repo on the path.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))

from tools.mutation.cli import main  # pylint: disable=g-import-not-at-top

if __name__ == "__main__":
  sys.exit(main())
