"""experiments/report.py: the READMEs' numbers are their results files'.

Mutation seen to fail: a committed results file edited by hand (a table
number in a README then disagrees), and `byzantine_grid` comparing with the
0% run instead of the same fraction's attack-free run.
"""

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
