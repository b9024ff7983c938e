"""The figures of Figure 7 and of the Theorem 1 check."""

import matplotlib
import numpy as np

from experiments import files
from experiments.threshold_clustering.figure7 import elbow_ratio
from experiments.threshold_clustering.figure7 import remaining_gap
from experiments.threshold_clustering.theorem import AXES
from experiments.threshold_clustering.theorem import Condition
from experiments.threshold_clustering.theorem import _series
from experiments.threshold_clustering.theorem import _variable


def plot_figure7(fig7: dict, cfg, path: str):
  """Mean distance, elbow ratio and remaining gap against l, per sigma."""
  plt = files.pyplot()
  f = fig7["distance"]  # [R, S, T + 1]
  ls = np.arange(f.shape[-1])
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.4))
  fig.subplots_adjust(wspace=0.35)
  for j, (s, row) in enumerate(zip(cfg.fig7_sigmas, fig7["rows"])):
    color = f"C{j}"
    mean, std = f[:, j].mean(0), f[:, j].std(0)
    label = rf"$\sigma$ = {s:g} (elbow l = {row['elbow']})"
    axes[0].plot(ls, mean, color=color, lw=2, label=label)
    axes[0].fill_between(ls, mean - std, mean + std, color=color, alpha=0.2)
    axes[0].plot(row["elbow"], mean[row["elbow"]], "o", color=color, ms=8,
                 mec="k")
    axes[1].plot(ls[1:], elbow_ratio(mean), color=color, lw=1.5)
    axes[1].axvline(row["elbow"], color=color, ls=":", lw=1)
    axes[2].semilogy(ls, np.maximum(remaining_gap(mean), 1e-8), color=color,
                     lw=1.5)
    axes[2].axvline(row["elbow"], color=color, ls=":", lw=1)
  axes[0].set_ylabel("mean distance to the true cluster centre\n"
                     "(data units; band: +-1 sd over repeats)")
  axes[0].set_title("Mean distance vs clipping iterations")
  axes[1].set_ylabel("(f(l) - f(l-1)) / (f(l-1) - min f)\n(noisy once f "
                     "reaches float precision)")
  axes[1].set_ylim(-1.05, 0.3)
  axes[1].set_title("The paper's elbow ratio")
  axes[2].axhline(cfg.elbow_tol, color="k", ls="--", lw=1,
                  label=f"elbow: {cfg.elbow_tol:.0%} of the gap left")
  axes[2].set_ylabel("remaining gap (f(l) - min f) / (f(0) - min f) (log)")
  axes[2].set_title("Remaining gap = product of (1 + ratio): elbow rule")
  axes[2].legend(loc="upper right", fontsize=8)
  for ax in axes:
    ax.set_xlabel("clipping iterations l")
    ax.grid(alpha=0.3)
  axes[0].legend(loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2,
                 fontsize=8)
  fig.suptitle(
      f"Threshold-Clustering on make_blobs ({cfg.blob_points} points, "
      f"{cfg.blob_clusters} clusters, d={cfg.blob_dim}, radius = "
      f"{cfg.fig7_quantile:.0%} quantile, {cfg.repeats} repeats) — Werner "
      "et al. "
      "2023, Fig. 7", y=1.02)
  files.save_figure(fig, path)
  plt.close(fig)


def plot_theorem(theorem: dict, cfg, path: str):
  """Error against each swept variable, and against the bound."""
  plt = files.pyplot()
  records = theorem["records"]
  conds = [Condition(**{f: r[f] for f in Condition._fields}) for r in records]
  labels = list(dict.fromkeys(c.label() for c in conds))
  colors = dict(zip(labels, ["C0", "C2", "C4", "C5", "C6"][:len(labels) - 1]
                    + ["C3"]))
  styles = {"clean": "-", "attacked": "--", "edge": "--", "far": "-."}
  fig, axes = plt.subplots(2, 3, figsize=(17, 10))
  xlabels = {"n_i": "points per cluster $n_i$ (log)",
             "Delta": r"separation $\Delta$ (data units, log)",
             "sigma": r"total std $\sigma$ (data units, log)",
             "beta": r"Byzantine fraction $\beta$ (log; $\beta$=0 not shown)"}
  others = {"n_i": f"Delta={cfg.base_delta:g}, sigma={cfg.base_sigma:g}",
            "Delta": f"n_i={cfg.base_n}, sigma={cfg.base_sigma:g}",
            "sigma": f"n_i={cfg.base_n}, Delta={cfg.base_delta:g}",
            "beta": f"n_i={cfg.base_n}, Delta={cfg.base_delta:g}, "
                    f"sigma={cfg.base_sigma:g}"}
  handles = {}
  for axis, ax in zip(AXES, axes.flat):
    series = {}
    for c, r in zip(conds, records):
      if c.axis == axis:
        series.setdefault(_series(c, axis), []).append((c, r))
    for (label, variant), items in series.items():
      x = np.array([_variable(c, axis, cfg.blob_clusters) for c, _ in items])
      e = np.array([r["error"] for _, r in items])
      sd = np.array([r["error_std"] for _, r in items])
      inside = np.array([r["within_assumptions"] for _, r in items])
      keep = x > 0
      theory = label == "theory tau"
      h = ax.errorbar(x[keep], e[keep],
                      yerr=np.minimum(sd[keep], 0.999 * e[keep]),
                      color=colors[label], ls=styles[variant],
                      lw=1.5 if theory else 2.5, capsize=2)
      for mask, face in ((inside, colors[label]), (~inside, "white")):
        ax.plot(x[keep & mask], e[keep & mask], "o", color=colors[label],
                mfc=face, ms=6)
      handles.setdefault(f"{label}, {variant}", h)
      bound = np.array([r["bound"] for _, r in items])
      attacked = variant != "clean" and axis != "n_i"
      name = f"bound (unit constants), beta {'>' if attacked else '='} 0"
      h = ax.plot(x[keep], bound[keep], ls=":", color="0.55" if attacked
                  else "k", lw=2.5 if attacked else 1.2, zorder=0)[0]
      handles.setdefault(name, h)
      ticks = sorted(set(x[keep]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.3g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(xlabels[axis])
    ax.set_ylabel(r"squared error $\|v_k - E z\|^2$ (log)")
    ax.set_title(f"vary {axis} ({others[axis]})", fontsize=10)
    ax.grid(alpha=0.3, which="both")
  ax = axes.flat[4]
  for label in labels:
    for inside, face in ((True, colors[label]), (False, "white")):
      rs = [r for c, r in zip(conds, records) if c.label() == label and
            r["within_assumptions"] == inside]
      ax.loglog([r["bound"] for r in rs], [r["error"] for r in rs], "o",
                color=colors[label], mfc=face, alpha=0.8)
  lo = min(min(r["error"], r["bound"]) for r in records)
  hi = max(max(r["error"], r["bound"]) for r in records)
  ax.plot([lo, hi], [lo, hi], "k--", lw=1)
  ax.set_xlabel(r"bound $\sigma^2/n_i + \sigma^3/\Delta + \beta\sigma\Delta$"
                " (unit constants, log)")
  ax.set_ylabel("measured squared error (log)")
  ax.set_title("every condition; above the dashed line: bound exceeded",
               fontsize=10)
  ax.grid(alpha=0.3, which="both")
  legend_ax = axes.flat[5]
  legend_ax.axis("off")
  legend_ax.legend(
      list(handles.values()), list(handles), loc="upper left", fontsize=8,
      title="mean +- sd over repeats; hollow: outside the theorem's\n"
      r"assumptions ($\Delta \geq \sigma/\delta_i$, $\beta \leq \delta_i$); "
      f"attacked: beta={cfg.attack_beta:g}, edge attack")
  fig.suptitle("Theorem 1 of Werner et al. 2023: error of Threshold-Clustering"
               r" vs $\sigma^2/n_i + \sigma^3/\Delta + \beta\sigma\Delta$",
               y=1.0)
  fig.tight_layout()
  files.save_figure(fig, path)
  plt.close(fig)
