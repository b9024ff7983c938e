"""Issue 20's worst cases side by side across heterogeneity levels.

`experiments.byzantine.protocol` summarises every (data set, heterogeneity,
Byzantine fraction, rounds) cell into each method's worst case over the
attacks; where one data set, fraction and length were measured at several
heterogeneity levels (the paper's private labels, Dirichlet alpha 0.1 / 1 /
10), this module lays those worst cases out as methods x levels: a markdown
table per panel (`by_heterogeneity`) and `worst_case_heterogeneity.png`
(`plot_heterogeneity`), so "ahead at every heterogeneity level" reads off
one row.
"""

import numpy as np

from experiments import files
from experiments.byzantine import config
from experiments.byzantine import figures


def _levels(summary: list) -> list:
  """Heterogeneity levels present, in config.HETEROGENEITY's order."""
  return [h for h in config.HETEROGENEITY
          if any(s["heterogeneity"] == h for s in summary)]


def _panels(summary: list) -> list:
  """(dataset, fraction, rounds) of the summary with more than one
  heterogeneity level: the panels of the by-heterogeneity view."""
  keys = sorted({(s["dataset"], s["fraction"], s["rounds"]) for s in summary})
  return [k for k in keys if len({s["heterogeneity"] for s in summary
                                  if (s["dataset"], s["fraction"],
                                      s["rounds"]) == k}) > 1]


def _panel(summary: list, key: tuple) -> tuple:
  """(levels, methods, worst-case accuracies [methods, levels] with NaN
  where not measured, upper-bound mask) of one panel."""
  here = [s for s in summary
          if (s["dataset"], s["fraction"], s["rounds"]) == key]
  levels = _levels(here)
  methods = sorted({s["method"] for s in here})
  worst = np.full((len(methods), len(levels)), np.nan)
  bound = np.zeros(worst.shape, bool)
  for s in here:
    i, j = methods.index(s["method"]), levels.index(s["heterogeneity"])
    worst[i, j] = 100 * s["worst"]
    bound[i, j] = not s["attacks"]
  return levels, methods, worst, bound


def by_heterogeneity(summary: list) -> list:
  """Markdown lines: per data set, fraction and length measured at several
  heterogeneity levels, every method's worst case at each level (<=: no
  attack run, the attack-free accuracy bounds it)."""
  lines = []
  for key in _panels(summary):
    levels, methods, worst, bound = _panel(summary, key)
    lines += ["", f"Worst case by heterogeneity: {key[0]}, "
              f"{int(100 * key[1])}% Byzantine, {key[2]} rounds (%):", "",
              "| method | " + " | ".join(levels) + " |",
              "|---|" + "---:|" * len(levels)]
    for i, m in enumerate(methods):
      cells_ = ["-" if np.isnan(w) else ("<= " if b else "") + f"{w:.1f}"
                for w, b in zip(worst[i], bound[i])]
      lines.append(f"| {config.method_label(m)} | " + " | ".join(cells_) + " |")
  return lines


def plot_heterogeneity(summary: list, path: str) -> bool:
  """Methods x heterogeneity levels (worst case), one panel per data set,
  fraction and length measured at several levels; False (nothing written)
  when there is no such panel."""
  keys = _panels(summary)
  if not keys:
    return False
  plt = files.pyplot()
  panels = [_panel(summary, k) for k in keys]
  fig, axes = plt.subplots(1, len(keys), squeeze=False,
                           constrained_layout=True,
                           figsize=(2.2 * sum(len(p[0]) for p in panels) + 3,
                                    0.35 * max(len(p[1]) for p in panels)
                                    + 2))
  image = None
  for ax, key, (levels, methods, worst, bound) in zip(axes[0], keys, panels):
    image = figures.accuracy_image(
        ax, worst, [config.method_label(m) for m in methods], levels,
        prefix=np.where(bound, "<=", ""), size=8, rotation=20)
    ax.set_title(f"{key[0]}, {int(100 * key[1])}% Byzantine, {key[2]} "
                 "rounds: worst case\nover attacks (<=: attack-free only)",
                 fontsize=9)
  fig.colorbar(image, ax=axes[0].tolist(), fraction=0.03,
               label="worst-case benign accuracy (%)")
  files.save_figure(fig, path)
  plt.close(fig)
  return True
