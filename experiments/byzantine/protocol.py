"""Issue 20's worst-case table, merged from several Byzantine grid runs.

A grid run covers one data set and heterogeneity; the protocol's cells come
from several (one per data set, per defence, or a run stopped early whose
`rows_so_far.json` holds what finished). This module merges them and writes,
into the results directory:

  table.md      per data set, heterogeneity and Byzantine fraction: every
                method's attack-free accuracy, its worst case over the
                measured attacks (the attack-free run counts as one of the
                attacker's choices, as in ByzFL) and the drop; then every
                run's accuracy, attacks x methods.
  summary.json  the same numbers.
  heatmap.png   methods x attacks, one panel per cell.
  worst_case_heterogeneity.png
                methods x heterogeneity levels, the worst case of each,
                one panel per data set, Byzantine fraction and length
                (also a table in table.md; `levels`).

and rewrites the `<!-- begin: protocol -->` block of its README.md with
table.md. A method measured without any attack is listed with its
attack-free accuracy as an upper bound of its worst case.

One cell may be measured by several runs, each with its own attack-free
run: runs on different machines give slightly different floats (XLA's CPU
code depends on the host's vector units), and 60-round trajectories turn a
1e-4 loss difference into tenths of a point. So every run's rows are kept,
and an attack's drop is taken against the attack-free run of the same run
file; the cell's drop is the largest of them. Since one evaluation's
accuracy is noisy (the attack-free Fashion-MNIST run gains 4 points
between rounds 50 and 60), the drop is also given between the means of the
last three evaluations.

  python -m experiments.byzantine.protocol \
      experiments/results/byzantine/protocol_20pct \
      --also experiments/results/byzantine/digits_fc_defences
"""

import argparse
import glob
import json
import os
import re

import numpy as np

from experiments import files
from experiments.byzantine import config
from experiments.byzantine import figures
from experiments.byzantine import levels

_BLOCK = re.compile(r"(<!-- begin: protocol -->\n).*?(<!-- end: protocol -->)",
                    re.S)


def load_rows(results: str, also: tuple = ()) -> list:
  """Rows of every run under `results` and the directories `also`
  (`grid.json`, else the `rows_so_far.json` of a run stopped early), tagged
  with data set, heterogeneity, rounds and file (relative to `results`).

  A row that another file measured to the same accuracy is dropped, except
  an attack-free row, which every run file keeps for its own drops.

  Raises:
    ValueError: no run found, or one run file holding a measurement twice
      with different accuracies.
  """
  rows, seen = [], {}
  paths = [p for d in (results,) + tuple(also)
           for p in sorted(glob.glob(os.path.join(d, "*", "config.json")))]
  for cfg_path in paths:
    run = os.path.dirname(cfg_path)
    with open(cfg_path) as f:
      cfg = json.load(f)["config"]
    name = ("grid.json" if os.path.exists(os.path.join(run, "grid.json"))
            else "rows_so_far.json")
    if not os.path.exists(os.path.join(run, name)):
      continue
    source = os.path.relpath(os.path.join(run, name), results)
    with open(os.path.join(run, name)) as f:
      for r in json.load(f)["rows"]:
        key = (cfg["dataset"], cfg["heterogeneity"], r["fraction"],
               cfg["rounds"], r["attack"], r["method"], cfg.get("quantile"))
        if (key, source) in seen:
          if abs(seen[(key, source)] - r["accuracy"]) > 1e-9:
            raise ValueError(
                f"{key} measured twice in {source} with different "
                f"accuracies ({seen[(key, source)]}, {r['accuracy']}).")
          continue
        repeat = any(k == key and abs(v - r["accuracy"]) <= 1e-9
                     for (k, _), v in seen.items())
        seen[(key, source)] = r["accuracy"]
        if repeat and r["attack"] != "none":
          continue
        rows.append({**r, "dataset": cfg["dataset"],
                     "heterogeneity": cfg["heterogeneity"],
                     "rounds": cfg["rounds"], "source": source,
                     "quantile": cfg.get("quantile")})
  if not rows:
    raise ValueError(f"no grid results under {results}/*/")
  return _split_by_quantile(rows)


def _split_by_quantile(rows: list) -> list:
  """A method run at several radius quantiles becomes one method per
  quantile ("fc_ball_cap@0.3"), so that two settings of a hyperparameter
  are never merged into one worst case."""
  quantiles = {}
  for r in rows:
    quantiles.setdefault(r["method"], set()).add(r["quantile"])
  return [{**r, "method": f"{r['method']}@{r['quantile']}"}
          if len(quantiles[r["method"]]) > 1 else r for r in rows]


def _cell(r: dict) -> tuple:
  return (r["dataset"], r["heterogeneity"], r["fraction"], r["rounds"])


def cells(rows: list) -> list:
  """(dataset, heterogeneity, fraction, rounds) of the rows, in order
  (runs of different lengths are separate cells)."""
  return sorted({_cell(r) for r in rows})


def _last_mean(r: dict, k: int = 3):
  """Mean accuracy of a row's last `k` evaluations (None without curves)."""
  curve = r.get("curve_accuracy")
  return float(np.mean(curve[-k:])) if curve else None


def _drops(runs: list) -> list:
  """(drop, drop of the last-3 means, attack) of every attacked row against
  the attack-free row of its own run file (points; None without one)."""
  out = []
  for r in runs:
    if r["attack"] == "none":
      continue
    clean = [c for c in runs
             if c["attack"] == "none" and c["source"] == r["source"]]
    if not clean:
      out.append((None, None, r["attack"]))
      continue
    c = clean[0]
    last_c, last_r = _last_mean(c), _last_mean(r)
    last = (None if last_c is None or last_r is None
            else round(100 * (last_c - last_r), 2))
    out.append((round(100 * (c["accuracy"] - r["accuracy"]), 2), last,
                r["attack"]))
  return out


def summarise(rows: list) -> list:
  """Per cell and method: attack-free accuracies (one per run that measured
  it), worst case and its attack, and the largest drop against the
  attack-free run of the same run file, also between last-3 means (both
  at least 0: the attack-free run is one of the attacker's choices)."""
  out = []
  for cell in cells(rows):
    here = [r for r in rows if _cell(r) == cell]
    for m in sorted({r["method"] for r in here}):
      runs = [r for r in here if r["method"] == m]
      clean = [r["accuracy"] for r in runs if r["attack"] == "none"]
      low = min(runs, key=lambda r: r["accuracy"])
      drops = [d for d in _drops(runs) if d[0] is not None]
      top = max(drops, default=(0.0, None, "none"), key=lambda d: d[0])
      if top[0] < 0:
        top = (0.0, None, "none")
      lasts = [d[1] for d in drops if d[1] is not None]
      out.append({
          "dataset": cell[0], "heterogeneity": cell[1], "fraction": cell[2],
          "rounds": cell[3], "method": m,
          "attack_free": clean[0] if clean else None,
          "attack_free_runs": clean,
          "worst": low["accuracy"], "worst_attack": low["attack"],
          "attacks": sorted({r["attack"] for r in runs
                             if r["attack"] != "none"}),
          "drop": top[0] if clean else None,
          "drop_attack": top[2] if clean else None,
          "drop_last3": max(0.0, *lasts) if lasts else None})
  return out


def _pct(x):
  return "-" if x is None else f"{100 * x:.1f}"


def _pcts(values) -> str:
  """Distinct accuracies, in order, as "79.2 / 79.6" (- when none)."""
  seen = []
  for v in values:
    if _pct(v) not in seen:
      seen.append(_pct(v))
  return " / ".join(seen) or "-"


def markdown(rows: list, summary: list) -> str:
  lines = ["Worst case per method (benign mean test accuracy, %; the "
           "attack-free run counts as one of the attacker's choices). "
           "A cell measured by several runs lists each run's attack-free "
           "accuracy; a drop is taken against the attack-free run of the "
           "same run, at the last evaluation and between the means of the "
           "last three evaluations:", "",
           "| data | clients | Byzantine | rounds | method | attack-free | "
           "worst case (attack) | drop (attack) | drop, last 3 | "
           "attacks run |",
           "|---|---|---:|---:|---|---:|---|---|---:|---:|"]
  for s in summary:
    worst = f"{_pct(s['worst'])} ({config.ATTACK_LABELS[s['worst_attack']]})"
    if not s["attacks"]:
      worst = f"<= {_pct(s['worst'])} (no attack run: upper bound)"
    drop = ("-" if s["drop"] is None else
            f"{s['drop']:.1f} ({config.ATTACK_LABELS[s['drop_attack']]})")
    last = "-" if s["drop_last3"] is None else f"{s['drop_last3']:.1f}"
    lines.append(
        f"| {s['dataset']} | {s['heterogeneity']} | "
        f"{int(100 * s['fraction'])}% | {s['rounds']} | "
        f"{config.method_label(s['method'])} | "
        f"{_pcts(s['attack_free_runs'])} | {worst} | {drop} | {last} | "
        f"{len(s['attacks'])} |")
  lines += levels.by_heterogeneity(summary)
  for cell in cells(rows):
    here = {}
    for r in rows:
      if _cell(r) == cell:
        here.setdefault((r["attack"], r["method"]), []).append(r["accuracy"])
    methods = sorted({m for _, m in here})
    attacks = [a for a in ("none",) + config.ATTACKS + config.STRONG_ATTACKS
               if any((a, m) in here for m in methods)]
    lines += ["", f"{cell[0]}, {cell[1]}, {int(100 * cell[2])}% Byzantine, "
              f"{cell[3]} rounds (every run; - = not run):", "",
              "| attack | "
              + " | ".join(config.method_label(m) for m in methods) + " |",
              "|---|" + "---:|" * len(methods)]
    for a in attacks:
      lines.append(f"| {config.ATTACK_LABELS[a]} | " + " | ".join(
          _pcts(here.get((a, m), [])) for m in methods) + " |")
  sources = sorted({(r["source"], r["rounds"]) for r in rows})
  lines += ["", "Files: " + ", ".join(f"[`{s}`]({s}) ({n} rounds)"
                                      for s, n in sources) + "."]
  return "\n".join(lines) + "\n"


def plot(rows: list, path: str):
  """Methods x attacks, one panel per cell."""
  plt = files.pyplot()
  all_cells = cells(rows)
  attacks = [a for a in ("none",) + config.ATTACKS + config.STRONG_ATTACKS
             if any(r["attack"] == a for r in rows)]
  fig, axes = plt.subplots(len(all_cells), 1, squeeze=False,
                           constrained_layout=True,
                           figsize=(0.7 * len(attacks) + 4,
                                    2.2 * len(all_cells) + 1.2))
  image = None
  for ax, cell in zip(axes[:, 0], all_cells):
    here = {}
    for r in rows:  # Several runs of one cell: the lowest (worst case).
      if _cell(r) == cell:
        key = (r["attack"], r["method"])
        here[key] = min(here.get(key, 1.0), r["accuracy"])
    methods = sorted({m for _, m in here})
    grid = np.array([[100 * here.get((a, m), np.nan) for a in attacks]
                     for m in methods])
    image = figures.accuracy_image(
        ax, grid, [config.method_label(m) for m in methods],
        [config.ATTACK_LABELS[a] for a in attacks])
    ax.set_title(f"{cell[0]}, {cell[1]}, {int(100 * cell[2])}% Byzantine, "
                 f"{cell[3]} rounds (blank: not run)", fontsize=9)
  fig.colorbar(image, ax=axes[:, 0].tolist(), fraction=0.03,
               label="benign mean test accuracy (%)")
  files.save_figure(fig, path)
  plt.close(fig)


def write(results: str, also: tuple = ()):
  """Writes table.md, summary.json, heatmap.png (and
  worst_case_heterogeneity.png) and the README block."""
  rows = load_rows(results, also)
  summary = summarise(rows)
  text = markdown(rows, summary)
  files.write_text(os.path.join(results, "table.md"), text)
  files.write_json(os.path.join(results, "summary.json"),
                   {"summary": summary})
  plot(rows, os.path.join(results, "heatmap.png"))
  levels.plot_heterogeneity(
      summary, os.path.join(results, "worst_case_heterogeneity.png"))
  readme = os.path.join(results, "README.md")
  if os.path.exists(readme):
    with open(readme) as f:
      old = f.read()
    files.write_text(readme, _BLOCK.sub(
        lambda m: m.group(1) + text + m.group(2), old))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("results", help="directory of grid runs (one per "
                      "subdirectory)")
  parser.add_argument("--also", action="append", default=[],
                      help="another directory of grid runs (repeatable)")
  args = parser.parse_args(argv)
  for d in [args.results] + args.also:
    if not os.path.isdir(d):
      parser.error(f"{d} is not a directory.")
  write(args.results, tuple(args.also))


if __name__ == "__main__":
  main()
