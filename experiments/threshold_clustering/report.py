"""The Threshold-Clustering experiment's summary (markdown)."""

from experiments.threshold_clustering.figure7 import figure7_verdict
from experiments.threshold_clustering.theorem import theorem_verdict


def summary_markdown(cfg, fig7: dict, theorem, command: str) -> str:
  lines = [
      "# Threshold-Clustering: Figure 7 and Theorem 1 (Werner et al., 2023)",
      "", f"Command: `{command}`", "",
      f"## Figure 7 ({cfg.repeats} repeats, {cfg.blob_points} points, "
      f"{cfg.blob_clusters} clusters, d={cfg.blob_dim}, radius at the "
      f"{cfg.fig7_quantile:.0%} quantile; {fig7['seconds']:.1f}s)", "",
      "f(l): mean distance from each point's centre (started at the point) to "
      "its true centre. Elbow: the first l at which at most "
      f"{cfg.elbow_tol:.0%} of the gap f(0) - min f is left, i.e. the product "
      "of (1 + the paper's ratio (f(l) - f(l-1)) / (f(l-1) - min f)). The "
      "paper shows Figure 7 without numbers and says the elbow follows "
      "l >~ log(sigma).", "",
      "| sigma (per coord.) | sigma (total) | f(0) | elbow l (mean curve) | "
      "elbow per repeat | f(elbow) | min f (at l) | f(T) | Theorem 1's l |",
      "|---|---|---|---|---|---|---|---|---|"]
  for r in fig7["rows"]:
    lines.append(
        f"| {r['sigma']:g} | {r['sigma_total']:.2f} | {r['f0']:.3f} | "
        f"{r['elbow']} | {r['elbow_per_repeat_mean']:.1f} +- "
        f"{r['elbow_per_repeat_std']:.1f} | {r['f_elbow']:.3f} | "
        f"{r['f_min']:.3f} ({r['argmin']}) | {r['f_last']:.3f} | "
        f"{r['theorem_iters']:.0f} |")
  lines += ["", "Min. separation of the make_blobs centres per repeat: "
            + ", ".join(f"{d:.1f}" for d in fig7["min_separation"]) + ".", "",
            "**Does the elbow move with sigma?** " + figure7_verdict(fig7, cfg),
            ""]
  if theorem is None:
    return "\n".join(lines)
  lines += [
      f"## Theorem 1 ({cfg.repeats} repeats, {cfg.theorem_iters} steps, "
      f"{theorem['seconds']:.1f}s)", "",
      "Bound: E||v - E z||^2 <~ sigma^2/n_i + sigma^3/Delta + beta sigma "
      f"Delta (sigma: total std). Base point n_i={cfg.base_n}, "
      f"Delta={cfg.base_delta:g}, sigma={cfg.base_sigma:g}, "
      f"K={cfg.blob_clusters}, d={cfg.blob_dim}; one sweep per variable; the "
      "Delta "
      f"and sigma sweeps also run with beta={cfg.attack_beta:g} (edge "
      "attack). 'within': only conditions that meet the theorem's "
      "assumptions Delta >= sigma/delta_i and beta <= delta_i (constant 1). "
      "Fit: non-negative a, b, c minimising the relative misfit. C: largest "
      "measured / bound with unit constants (C <= 1: bound holds as written).",
      "", "| radius, conditions | a (sigma^2/n_i) | b (sigma^3/Delta) | "
      "c (beta sigma Delta) | RMS log10 misfit | max log10 misfit | C |",
      "|---|---|---|---|---|---|---|"]
  for name, f in theorem["fits"].items():
    lines.append(f"| {name} ({f['conditions']}) | {f['coefs'][0]:.3g} | "
                 f"{f['coefs'][1]:.3g} | {f['coefs'][2]:.3g} | "
                 f"{f['rms_log10']:.2f} | {f['max_abs_log10']:.2f} | "
                 f"{f['c_max']:.3g} |")
  lines += ["", "Log-log slopes of the error along each sweep, over the "
            "conditions within the assumptions (measured vs the bound with "
            "unit constants):", "",
            "| sweep | radius | variant | points | measured slope | "
            "bound's slope |", "|---|---|---|---|---|---|"]
  for s in theorem["slopes"]:
    lines.append(f"| {s['axis']} | {s['radius']} | {s['variant']} | "
                 f"{s['points']} | {s['measured']:.2f} | {s['bound']:.2f} |")
  lines += ["", "**Does the bound hold?** " + theorem_verdict(theorem), ""]
  return "\n".join(lines)
