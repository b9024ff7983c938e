"""experiments/report.py: the READMEs' numbers are their results files'.

Mutation seen to fail: a committed results file edited by hand (a table
number in a README then disagrees), and `byzantine_grid` comparing with the
0% run instead of the same fraction's attack-free run.
"""

import os
import re

from experiments import report


def test_every_generated_block_matches_its_results_file():
  assert report.stale() == [], (
      "run `python -m experiments.report` and commit the READMEs")


def test_blocks_render_from_the_files():
  text = ("x\n<!-- begin: byzantine/grid -->\nold\n"
          "<!-- end: byzantine/grid -->\n")
  out = report.render(text)
  assert "old" not in out and "| ALIE | 79.6 (-16.4) | 19.4 (-76.0) |" in out
  assert report.render(out) == out


def test_top_readme_is_short_and_its_links_resolve():
  """Issue 17: at most 250 lines, and every number links to a committed
  file. Seen to fail with a link to `benchmarks/results/cohort.json` (no
  such file)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "README.md")) as f:
    text = f.read()
  assert len(text.splitlines()) <= 250
  targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
  assert len(targets) > 20
  missing = [t for t in targets if not t.startswith("http") and
             not os.path.exists(os.path.join(root, t))]
  assert not missing, missing
