"""Learning-curve figures shared by the classification experiments."""

import textwrap

import numpy as np

from experiments import files
from experiments import registry

# 13+ distinguishable styles: colour x line style x marker; FC gets its own.
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown",
           "tab:pink", "tab:gray", "tab:olive", "tab:cyan", "gold", "navy",
           "teal", "maroon")
_DASHES = ("--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p", "d")
FC_STYLE = {"color": "red", "linestyle": "-", "linewidth": 2.8, "marker": None,
            "zorder": 10}
ORACLE_STYLE = {"color": "black", "linestyle": "-", "linewidth": 1.6,
                "marker": None, "zorder": 9}


def series_style(index: int, name: str) -> dict:
  """Line style of series `index`; FC and the oracle have fixed styles."""
  if name == "fc":
    return FC_STYLE
  if name == "oracle":
    return ORACLE_STYLE
  return {"color": _COLORS[index % len(_COLORS)],
          "linestyle": _DASHES[index % len(_DASHES)],
          "marker": _MARKERS[index % len(_MARKERS)], "markersize": 4,
          "linewidth": 1.2, "zorder": 2}


def plot_curves(results: dict, path: str, title: str,
                metric: str = "accuracy"):
  """Learning curves, one panel per task, the legend outside on the right.

  Args:
    results: `{task: [run dicts of experiments.training.train]}`.
    path: PNG path.
    title: figure title.
    metric: "accuracy" (plotted in %) or "loss".
  """
  plt = files.pyplot()
  tasks = list(results)
  fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.2),
                           squeeze=False, sharey=True)
  handles = {}
  for ax, task in zip(axes[0], tasks):
    for i, run in enumerate(results[task]):
      y = np.asarray(run[f"curve_{metric}"], np.float64)
      y = 100 * y if metric == "accuracy" else y
      label = registry.label(run["algorithm"])
      (line,) = ax.plot(run["eval_round"], y, label=label,
                        **series_style(i, run["algorithm"]))
      handles.setdefault(label, line)
    ax.set_title(task.replace("_", " "))
    ax.set_xlabel("round (one batch per client)")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("test accuracy over benign clients (%)"
                        if metric == "accuracy" else
                        "test cross-entropy over benign clients (nats)")
  _finish(plt, fig, handles, title, path)


def _finish(plt, fig, handles: dict, title: str, path: str):
  """The legend (`{label: line}`) outside on the right, the title, saved."""
  fig.legend(list(handles.values()), list(handles), loc="center left",
             bbox_to_anchor=(1.0, 0.5), frameon=False)
  fig.suptitle(title)
  fig.tight_layout()
  files.save_figure(fig, path)
  plt.close(fig)


def plot_panels(panels: list, path: str, title: str):
  """One accuracy-vs-round panel per `(title, [run, ...], prominent_label)`;
  a run is a dict with `label`, `eval_round` and `curve_accuracy`."""
  plt = files.pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4),
                           squeeze=False)
  styles = ["-", "--", "-.", ":"]
  for ax, (panel_title, runs, prominent) in zip(axes[0], panels):
    for i, r in enumerate(runs):
      main = r["label"] == prominent
      ax.plot(r["eval_round"], 100 * np.asarray(r["curve_accuracy"]),
              ls="-" if main else styles[(i + 1) % len(styles)],
              lw=2.8 if main else 1.3, color="C3" if main else f"C{i % 10}"
              if i % 10 != 3 else "C9", zorder=3 if main else 2,
              marker="o" if main else None, ms=3, label=r["label"])
    ax.set_title(panel_title)
    ax.set_xlabel("round")
    ax.set_ylabel("personalized test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.16),
              ncol=2, frameon=False)
  lines = [textwrap.fill(line, width=60 * len(panels))
           for line in title.splitlines()]
  fig.suptitle("\n".join(lines), fontsize=8, y=1.0 + 0.045 * len(
      "\n".join(lines).splitlines()))
  files.save_figure(fig, path)
  plt.close(fig)


DIAGNOSTICS = (("purity", "purity: weight from the owner's cluster", False),
               ("effective_count", "effective number of averaged updates",
                True))


def has_diagnostics(results: dict) -> bool:
  """Whether any run logged a clustering diagnostic (`DIAGNOSTICS`)."""
  return any(name in run.get("train_curves", {}) for runs in results.values()
             for run in runs for name, _, _ in DIAGNOSTICS)


def plot_diagnostics(results: dict, path: str, title: str):
  """The clustering diagnostics over the rounds: a row per diagnostic
  (`DIAGNOSTICS`), a column per task, a line per algorithm that logs it
  (`experiments.training.interval_means`; the effective count on a log
  scale: FC's few gradients beside the ground truth's whole cluster).

  Args:
    results: `{task: [run dicts of experiments.training.train]}`.
    path: PNG path.
    title: figure title.
  """
  plt = files.pyplot()
  tasks = list(results)
  fig, axes = plt.subplots(len(DIAGNOSTICS), len(tasks),
                           figsize=(5.5 * len(tasks), 3.6 * len(DIAGNOSTICS)),
                           squeeze=False, sharex="col")
  handles = {}
  for col, task in enumerate(tasks):
    for row, (name, ylabel, log) in enumerate(DIAGNOSTICS):
      ax = axes[row][col]
      for i, run in enumerate(results[task]):
        curve = run.get("train_curves", {}).get(name)
        if curve is None:
          continue
        label = registry.label(run["algorithm"])
        (line,) = ax.plot(run["eval_round"][1:], curve, label=label,
                          **series_style(i, run["algorithm"]))
        handles.setdefault(label, line)
      if log:
        ax.set_yscale("log")
      ax.set_ylabel(ylabel, fontsize=8)
      ax.grid(alpha=0.3)
    axes[0][col].set_title(task.replace("_", " "))
    axes[-1][col].set_xlabel("round (mean over each evaluation interval)")
  _finish(plt, fig, handles, title, path)
