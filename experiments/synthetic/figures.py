"""The synthetic experiment's figures (Werner et al. 2023, Figures 2, 3)."""

import numpy as np

from experiments import files
from experiments import registry


def plot_figure3(best: dict, cfg, path: str):
  """Figure 3: the best grid point's error curve per algorithm and setting."""
  plt = files.pyplot()
  settings = list(cfg.settings)
  fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4),
                           squeeze=False)
  for ax, s in zip(axes[0], settings):
    for name in cfg.algorithms.algorithms:
      r = best.get((s, name))
      if r is None:
        continue
      q = f", q={r['quantile']}" if r["quantile"] is not None else ""
      ax.semilogy(r["eval_round"], np.maximum(r["error"], 1e-8),
                  label=f"{registry.label(name)} (lr={r['lr']}{q})")
    k, n = s.split("x")
    ax.set_title(f"K={k}, n_i={n}")
    ax.set_xlabel("round")
    ax.set_ylabel(r"mean $\|x_i - x^\star\|$ (benign clients)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("Synthetic linear regression (Werner et al. 2023, Fig. 3)")
  files.save_figure(fig, path)
  plt.close(fig)


def plot_figure2(consts: dict, clusters: np.ndarray, path: str):
  """Figure 2: the constants of Assumptions 4 and 5 along an oracle run."""
  plt = files.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  titles = {"intra_ratio": (r"intra-cluster ratio (bounded by $A^2$)" "\n"
                            r"(blank once $\|\nabla\bar f_i\|$ is at float "
                            "precision)", max),
            "inter_sq_dist": (r"inter-cluster $\|\nabla f_i - \nabla f_j\|^2$"
                              r" (bounded below by $\Delta^2$)", min)}
  for ax, (name, (title, bound)) in zip(axes, titles.items()):
    v = consts[name]  # [T, N]
    rounds = np.arange(v.shape[0])
    ax.semilogy(rounds, v, color="0.8", lw=0.5)
    for k in np.unique(clusters):
      ax.semilogy(rounds, v[:, clusters == k].mean(1), color="k", lw=1)
    b = np.nanmax(v) if bound is max else np.nanmin(v)
    ax.axhline(max(b, 1e-12), color="r", ls="--",
               label=f"empirical bound {b:.3g}")
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.legend()
  fig.suptitle("Assumptions 4 and 5 along a ground-truth run "
               "(Werner et al. 2023, Fig. 2)", y=1.06)
  files.save_figure(fig, path)
  plt.close(fig)
