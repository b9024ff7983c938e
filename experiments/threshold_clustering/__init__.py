"""Figure 7 and Theorem 1 of Werner et al. (2023): Threshold-Clustering alone.

Figure 7 ("Empirical study on clipping iterations"): 90 ten-dimensional points
in 10 clusters from scikit-learn's `make_blobs`, the same centres for every
`sigma` in {0.5, 1, 2, 4} (`cluster_std`, per coordinate), radius at the 10th
percentile of the distances to the current centre (`prfl.quantile_radius`),
10 repeats. Every point starts a centre at its own position (as
Federated-Clustering starts each model's centre at its own gradient; the proof
of Theorem 1 likewise assumes a start within sigma of the mean), and the plot
is the mean distance f(l) from each point's centre to its true cluster centre
after l = 0..T clipping iterations, with the paper's elbow ratio
g(l) = (f(l) - f(l-1)) / (f(l-1) - min_l f(l)). Since 1 + g(l) is the factor by
which step l shrinks the gap to the minimum, the remaining gap after l steps
is prod_{j <= l} (1 + g(j)); the elbow is the first l where it is at most
`--elbow-tol` (5%) of the initial gap.

Theorem 1: the squared error ||v_k - E z||^2 of Threshold-Clustering after
`--theorem-iters` steps against the bound sigma^2/n_i + sigma^3/Delta +
beta*sigma*Delta (sigma^2 = E||z - E z||^2, the total variance), sweeping
n_i, Delta, sigma and the Byzantine fraction beta around a base point. K
centres at pairwise distance exactly Delta, one centre per cluster started at
a random point of it; Byzantine points are placed against each centre either
just inside its ball, all in one direction, re-placed at every step ("edge",
the paper's threat model) or far away ("far"). Radius rules: the quantiles
in `--theorem-quantiles` (10% and 5%) and the theorem's
tau = sqrt(2 sigma^2 + delta_i sigma Delta).

  python -m experiments.threshold_clustering            # about a minute
  python -m experiments.threshold_clustering --smoke    # seconds

Writes `config.json` (first), `results.json`, `figure7.png`, `theorem1.png`
and `summary.md` to `--out` (default `results/threshold_clustering/`).
"""

import os
import time

from experiments import cli
from experiments import files
from experiments import options
from experiments.threshold_clustering import config
from experiments.threshold_clustering import figure7
from experiments.threshold_clustering import plots
from experiments.threshold_clustering import report
from experiments.threshold_clustering import theorem as theorem_lib


def run(cfg, prepared, tracker, command: str = ""):
  """Figure 7, then (unless --no-theorem) the Theorem 1 sweeps; writes
  results.json, summary.md and the figures."""
  del prepared  # Nothing to load.
  out, log = cfg.run.out, tracker.log
  start = time.perf_counter()
  log(f"Threshold-Clustering experiments: sigmas {cfg.fig7_sigmas}, "
      f"{cfg.repeats} repeats, l = 0..{cfg.fig7_iters}"
      + ("" if not cfg.theorem else
         f"; Theorem 1 sweeps with {cfg.theorem_iters} steps"))
  fig7 = figure7.run_figure7(cfg, log)
  theorem = theorem_lib.run_theorem(cfg, log) if cfg.theorem else None
  seconds = time.perf_counter() - start
  files.write_json(os.path.join(out, "results.json"), {
      "config": options.to_dict(cfg), "versions": files.versions(),
      "command": command, "seconds": seconds,
      "figure7": {"rows": fig7["rows"], "distance": fig7["distance"],
                  "min_separation": fig7["min_separation"],
                  "verdict": figure7.figure7_verdict(fig7, cfg)},
      "theorem1": None if theorem is None else {
          "records": theorem["records"], "slopes": theorem["slopes"],
          "verdict": theorem_lib.theorem_verdict(theorem),
          "fits": {k: {"a": v["coefs"][0], "b": v["coefs"][1],
                       "c": v["coefs"][2], "rms_log10": v["rms_log10"],
                       "max_abs_log10": v["max_abs_log10"],
                       "c_max": v["c_max"], "conditions": v["conditions"]}
                   for k, v in theorem["fits"].items()}}})
  text = report.summary_markdown(cfg, fig7, theorem, command)
  files.write_text(os.path.join(out, "summary.md"), text)
  written = ["results.json", "summary.md"]
  if cfg.run.plots:
    plots.plot_figure7(fig7, cfg, os.path.join(out, "figure7.png"))
    written.append("figure7.png")
    if theorem is not None:
      plots.plot_theorem(theorem, cfg, os.path.join(out, "theorem1.png"))
      written.append("theorem1.png")
  log(f"\n{text}")
  log(f"Done in {seconds:.1f}s; wrote {', '.join(written)} to {out}")
  return fig7, theorem


EXPERIMENT = cli.Experiment("threshold_clustering", __doc__, config.Config,
                            config.resolve, lambda cfg: None, run)

main = EXPERIMENT.main
