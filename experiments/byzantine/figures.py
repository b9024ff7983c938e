"""The Byzantine experiment's figures: the grid's heatmap and Figure 6."""

import numpy as np

from experiments import files
from experiments import plots
from experiments import registry
from experiments.byzantine import config
from experiments.byzantine.report import accuracy_cell


def accuracy_image(ax, grid, rows: list, cols: list, prefix=None,
                   size: int = 7, rotation: int = 40):
  """Draws `grid` `[rows, cols]` (accuracy in %, NaN: blank) on `ax` with
  each measured value, after its `prefix` `[rows, cols]` if given (text
  and column labels in `size` points), and returns the image."""
  image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
  for i, j in zip(*np.nonzero(~np.isnan(grid))):
    text = ("" if prefix is None else prefix[i][j]) + f"{grid[i, j]:.0f}"
    ax.text(j, i, text, ha="center", va="center", fontsize=size,
            color="white" if grid[i, j] < 50 else "black")
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels(rows, fontsize=7)
  ax.set_xticks(range(len(cols)))
  ax.set_xticklabels(cols, rotation=rotation, ha="right", fontsize=size)
  return image


def plot_heatmap(cfg, rows: list, path: str):
  """Methods x attacks, one panel per Byzantine fraction, accuracy in %."""
  plt = files.pyplot()
  by = {(r["fraction"], r["attack"], r["method"]): r for r in rows}
  methods = list(cfg.algorithms.algorithms)
  fractions = [f for f in sorted(cfg.fractions) if f > 0] or [0.0]
  cols = ["none"] + list(cfg.attacks)
  fig, axes = plt.subplots(
      len(fractions), 1, squeeze=False, sharex=True, constrained_layout=True,
      figsize=(0.8 * len(cols) + 4, (0.4 * len(methods) + 0.9) *
               len(fractions) + 1.6))
  image = None
  for ax, f in zip(axes[:, 0], fractions):
    grid = np.full((len(methods), len(cols)), np.nan)
    for i, m in enumerate(methods):
      for j, a in enumerate(cols):
        r = by.get((f, a, m))
        if r is not None:
          grid[i, j] = 100 * r["accuracy"]
          ax.text(j, i, accuracy_cell(r), ha="center", va="center", fontsize=7,
                  color="white" if grid[i, j] < 50 else "black")
    image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
    ax.set_yticks(range(len(methods)))
    ax.set_yticklabels([registry.label(m) for m in methods], fontsize=8)
    for lbl in ax.get_yticklabels():
      if lbl.get_text() == registry.label("fc"):
        lbl.set_fontweight("bold")
    ax.set_title(f"{int(100 * f)}% Byzantine clients per cluster "
                 "(first column: they behave honestly)", fontsize=9)
  bottom = axes[-1, 0]
  bottom.set_xticks(range(len(cols)))
  bottom.set_xticklabels([config.ATTACK_LABELS[a] for a in cols], rotation=40,
                         ha="right", fontsize=8)
  bottom.set_xlabel("attack")
  fig.colorbar(image, ax=axes[:, 0].tolist(), fraction=0.03,
               label="benign mean test accuracy (%)")
  fig.suptitle(f"Byzantine grid: {cfg.data.dataset}, {cfg.heterogeneity}, "
               f"{cfg.schedule.rounds} rounds († = NaN/Inf in a benign "
               "model)")
  files.save_figure(fig, path)
  plt.close(fig)


def plot_worst_case(cfg, worst: list, path: str):
  """Methods x Byzantine fraction: worst-case accuracy over the attacks."""
  plt = files.pyplot()
  fractions = sorted(cfg.fractions)
  methods = list(cfg.algorithms.algorithms)
  by = {(w["fraction"], w["method"]): w for w in worst}
  grid = np.array([[100 * by[(f, m)]["worst"] for f in fractions]
                   for m in methods])
  fig, ax = plt.subplots(figsize=(1.1 * len(fractions) + 4,
                                  0.4 * len(methods) + 1.6),
                         constrained_layout=True)
  image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
  for i in range(len(methods)):
    for j in range(len(fractions)):
      ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center",
              fontsize=8, color="white" if grid[i, j] < 50 else "black")
  ax.set_xticks(range(len(fractions)))
  ax.set_xticklabels([f"{int(100 * f)}%" for f in fractions])
  ax.set_xlabel("Byzantine clients")
  ax.set_yticks(range(len(methods)))
  ax.set_yticklabels([registry.label(m) for m in methods], fontsize=8)
  fig.colorbar(image, ax=ax, label="worst-case benign accuracy (%)")
  ax.set_title(f"{cfg.data.dataset}, {cfg.heterogeneity}: worst case over "
               f"{len(cfg.attacks)} attacks", fontsize=9)
  files.save_figure(fig, path)
  plt.close(fig)


def plot_figure6(cfg, runs: list, path: str):
  """Learning curves of FC and Global under each attack (Figure 6)."""
  plt = files.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
  styles = {"fc": plots.FC_STYLE,
            "global": {"color": "tab:blue", "linestyle": "--",
                       "linewidth": 1.5, "marker": "o", "markersize": 3}}
  for ax, attack in zip(axes, ("large", "bit_flip")):
    for r in runs:
      if r["attack"] not in (attack, "none"):
        continue
      style = dict(styles[r["method"]])
      label = registry.label(r["method"]) + (
          ", no attack (Byzantine clients honest)" if r["attack"] == "none"
          else ", under the panel's attack")
      if r["attack"] == "none":
        style.update(linewidth=1.0, alpha=0.45, marker=None, zorder=1)
      ax.plot(r["eval_round"], 100 * np.asarray(r["curve_accuracy"]),
              label=label, **style)
    ax.set_title(f"{config.ATTACK_LABELS[attack]} attack")
    ax.set_xlabel("round (one batch of 32 per client)")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("test accuracy over benign clients (%)")
  handles, labels = [], []
  for ax in axes:
    for h, l in zip(*ax.get_legend_handles_labels()):
      if l not in labels:
        handles.append(h)
        labels.append(l)
  fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
             frameon=False)
  n = cfg.fig6_clients_per_cluster
  byz = int(np.floor(cfg.fig6_byzantine_fraction * n))
  fig.suptitle(f"Figure 6 of Werner et al. (2023) on {cfg.data.dataset}: "
               f"{cfg.federation.clusters} clusters x ({n - byz} benign + "
               f"{byz} "
               "Byzantine clients), private label")
  fig.tight_layout()
  files.save_figure(fig, path)
  plt.close(fig)
