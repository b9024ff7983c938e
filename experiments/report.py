"""The numbers of the READMEs, rendered from the committed results files.

A README holds hand-written prose and generated blocks:

  <!-- begin: mnist/digits -->
  | algorithm | rotation acc. % (paper, MNIST) | ... |
  <!-- end: mnist/digits -->

`python -m experiments.report` rewrites every block of the READMEs listed in
`READMES` from `experiments/results/` (`BLOCKS`: block name -> renderer);
`--check` only reports blocks that differ (the tests run it), so a number in
a README is always the one in its results file, with a link to that file.
"""

import argparse
import json
import os
import re
import sys

from experiments import files
from experiments import registry
from experiments.byzantine.config import ATTACK_LABELS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join("experiments", "results")
READMES = ("README.md",) + tuple(
    os.path.join(RESULTS, name, "README.md")
    for name in ("mnist", "byzantine", "synthetic", "sweep"))
_BLOCK = re.compile(r"(<!-- begin: (\S+) -->\n)(.*?)(<!-- end: \2 -->)",
                    re.S)
# Werner et al. (2023), Table 1 (MNIST) accuracy %: (rotation, private label).
_PAPER = {"local": (71.3, 75.2), "global": (46.6, 22.2), "ditto": (62.0, 61.7),
          "ifca": (54.6, 65.4), "knn": (52.1, 63.2), "fc": (75.4, 77.0),
          "oracle": (84.7, 85.1)}


def _load(*parts):
  with open(os.path.join(ROOT, RESULTS, *parts)) as f:
    return json.load(f)


def _link(text, *parts) -> str:
  """`text` linked to a results file (paths relative to the repository)."""
  return f"[{text}]({'/'.join((RESULTS,) + parts)})"


def _accuracy(runs: list) -> dict:
  return {r["algorithm"]: 100 * r["accuracy"] for r in runs}


def table1(name: str) -> str:
  """Table 1 of a committed `experiments.mnist` run, beside the paper's."""
  res = _load("mnist", name, "results.json")["results"]
  rot, priv = _accuracy(res["rotation"]), _accuracy(res["private_label"])
  rows = []
  for alg in rot:
    paper = _PAPER.get(alg)
    cell = lambda acc, i: f"{acc:.1f}" + (f" ({paper[i]})" if paper else "")
    label = registry.label(alg)
    if alg == "fc":
      label = "**FC (ours)**"
    rows.append([label, cell(rot[alg], 0), cell(priv[alg], 1)])
  return files.markdown_table(
      ["algorithm", "rotation acc. % (paper, MNIST)",
       "private label acc. % (paper, MNIST)"], rows)


def fc_groups() -> str:
  """FC against the ground truth on Fashion-MNIST rotation, by groups."""
  rows = []
  for name, what in (("fashion_rotation_fc_groups16", "16 groups, 100 rounds"),
                     ("fashion_rotation_fc_groups4", "4 groups, 100 rounds"),
                     ("fashion_rotation_fc_groups4_300",
                      "4 groups, 300 rounds")):
    res = _load("mnist", name, "results.json")
    acc = _accuracy(res["results"]["rotation"])
    oracle = acc.get("oracle", _accuracy(_load(
        "mnist", "fashion_mnist", "results.json")["results"]["rotation"])[
            "oracle"])
    rows.append([what, _link(f"{acc['fc']:.1f}", "mnist", name, "table.md"),
                 f"{oracle:.1f}", f"{oracle - acc['fc']:.1f}",
                 f"{res['results']['rotation'][0]['seconds']:.0f}"])
  return files.markdown_table(
      ["FC on rotation", "FC acc. %", "ground truth %", "gap (points)",
       "FC time (s)"], rows)


def byzantine_grid() -> str:
  """FC in the committed digits grid: accuracy % (change from attack-free)."""
  rows = _load("byzantine", "digits_grid", "grid.json")["rows"]
  by = {(r["fraction"], r["attack"], r["method"]): r for r in rows}
  fractions = sorted({r["fraction"] for r in rows if r["fraction"] > 0})
  attacks = list(dict.fromkeys(r["attack"] for r in rows))
  out = []
  for a in attacks:
    cells = [ATTACK_LABELS[a]]
    for f in fractions:
      r, clean = by.get((f, a, "fc")), by[(f, "none", "fc")]
      change = "" if a == "none" else (
          f" ({100 * (r['accuracy'] - clean['accuracy']):+.1f})")
      cells.append(f"{100 * r['accuracy']:.1f}{change}")
    best = max((by[(0.2, a, m)] for m in ("global_median",
                                          "global_trimmed_mean",
                                          "global_krum", "global_gm",
                                          "global_cc")),
               key=lambda r: r["accuracy"])
    cells += [f"{100 * best['accuracy']:.1f}",
              f"{100 * by[(0.2, a, 'ifca_median')]['accuracy']:.1f}"]
    out.append(cells)
  return files.markdown_table(
      ["attack"] + [f"FC {int(100 * f)}%" for f in fractions] +
      ["best robust Global, 20%", "IFCA + median, 20%"], out)


def figure6() -> str:
  rows = []
  runs = {name: {(r["attack"], r["method"]): r for r in
                 _load("byzantine", name, "figure6.json")["runs"]}
          for name in ("digits_figure6", "digits_figure6_q010")}
  for attack in ("none", "large", "bit_flip"):
    a, b = runs["digits_figure6"], runs["digits_figure6_q010"]
    rows.append([ATTACK_LABELS[attack],
                 f"{100 * a[(attack, 'fc')]['accuracy']:.1f}",
                 f"{100 * b[(attack, 'fc')]['accuracy']:.1f}",
                 f"{100 * a[(attack, 'global')]['accuracy']:.1f}"])
  return files.markdown_table(
      ["attack", "FC, quantile 0.2, 2 groups", "FC, quantile 0.1, 1 group",
       "Global"], rows)


def synthetic() -> str:
  """Best grid point per (setting, algorithm): mean error, solved clients."""
  best = _load("synthetic", "results.json")["best"]
  settings = list(dict.fromkeys(r["setting"] for r in best))
  algs = list(dict.fromkeys(r["algorithm"] for r in best))
  by = {(r["setting"], r["algorithm"]): r for r in best}
  rows = [[registry.label(a)] + [
      f"{float(by[(s, a)]['final_error']):.3g} / "
      f"{by[(s, a)]['clients_solved']}" for s in settings] for a in algs]
  return files.markdown_table(
      ["algorithm"] + [f"{s}: mean error / solved" for s in settings], rows)


def sweep(name: str) -> str:
  """The sweep's own table (grid points x tasks)."""
  with open(os.path.join(ROOT, RESULTS, "sweep", name, "table.md")) as f:
    return f.read().split("\n\n")[0] + "\n"


def summary() -> str:
  """The top README's results table: every number links to its source."""
  d = _accuracy_pair("digits")
  f = _accuracy_pair("fashion_mnist")
  grid = {(r["fraction"], r["attack"], r["method"]): r for r in _load(
      "byzantine", "digits_grid", "grid.json")["rows"]}
  syn = {(r["setting"], r["algorithm"]): r for r in _load(
      "synthetic", "results.json")["best"]}
  digits = ("mnist", "digits", "table.md")
  fashion = ("mnist", "fashion_mnist", "table.md")
  byz = ("byzantine", "digits_grid", "grid.md")
  syn_src = ("synthetic", "summary.csv")
  pct = lambda r: f"{100 * r['accuracy']:.1f}"
  rows = [
      ["Table 1, bundled digits: rotation / private label acc. %",
       _link(f"{d['fc'][0]:.1f} / {d['fc'][1]:.1f}", *digits),
       _link(f"{d['oracle'][0]:.1f} / {d['oracle'][1]:.1f}", *digits),
       _link(f"{d['local'][0]:.1f} / {d['local'][1]:.1f}", *digits)],
      ["Table 1, Fashion-MNIST (paper's settings): acc. %",
       _link(f"{f['fc'][0]:.1f} / {f['fc'][1]:.1f}", *fashion),
       _link(f"{f['oracle'][0]:.1f} / {f['oracle'][1]:.1f}", *fashion),
       _link(f"{f['local'][0]:.1f} / {f['local'][1]:.1f}", *fashion)],
      ["Digits, 20% Byzantine per cluster: large / ALIE attack, acc. %",
       _link(f"{pct(grid[(0.2, 'large', 'fc')])} / "
             f"{pct(grid[(0.2, 'alie', 'fc')])}", *byz),
       _link(pct(grid[(0.0, "none", "oracle")]) + " (no attack)", *byz),
       _link(f"{pct(grid[(0.2, 'large', 'global_median')])} / "
             f"{pct(grid[(0.2, 'alie', 'global_median')])} (Global + "
             "median)", *byz)],
      ["Synthetic 4 x 16: clients solved (error < 0.01)",
       _link(syn[("4x16", "fc")]["clients_solved"], *syn_src),
       _link(syn[("4x16", "oracle")]["clients_solved"], *syn_src),
       _link(syn[("4x16", "local")]["clients_solved"], *syn_src)],
  ]
  return files.markdown_table(["result", "FC", "ground truth", "Local (or "
                               "as named)"], rows)


def _accuracy_pair(name: str) -> dict:
  res = _load("mnist", name, "results.json")["results"]
  rot, priv = _accuracy(res["rotation"]), _accuracy(res["private_label"])
  return {a: (rot[a], priv[a]) for a in rot}


BLOCKS = {
    "summary": summary,
    "mnist/digits": lambda: table1("digits"),
    "mnist/fashion_mnist": lambda: table1("fashion_mnist"),
    "mnist/fashion_authors": lambda: table1("fashion_authors"),
    "mnist/fc_groups": fc_groups,
    "byzantine/figure6": figure6,
    "byzantine/grid": byzantine_grid,
    "synthetic/best": synthetic,
    "sweep/digits_fc_lr_quantile": lambda: sweep("digits_fc_lr_quantile"),
}


def render(text: str) -> str:
  """`text` with every generated block rendered again."""
  def fill(match):
    return match.group(1) + BLOCKS[match.group(2)]() + match.group(4)
  return _BLOCK.sub(fill, text)


def stale(paths=READMES) -> list:
  """The READMEs whose generated blocks differ from the results files."""
  out = []
  for path in paths:
    with open(os.path.join(ROOT, path)) as f:
      text = f.read()
    if render(text) != text:
      out.append(path)
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--check", action="store_true",
                 help="only list the READMEs that are out of date")
  args = p.parse_args(argv)
  if args.check:
    out = stale()
    print("\n".join(out) if out else "every README is up to date")
    return 1 if out else 0
  for path in READMES:
    full = os.path.join(ROOT, path)
    with open(full) as f:
      text = f.read()
    files.write_text(full, render(text))
  print(f"rendered {', '.join(READMES)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
