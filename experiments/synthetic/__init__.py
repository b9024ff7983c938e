"""Figures 2 and 3 of Werner et al. (2023) on the synthetic federation (§5.1).

Figure 3: the error `||x_i - x*||` over rounds of every algorithm, each at the
best learning rate of its own grid, for (K, n_i) in {(4, 4), (4, 16), (16, 4)}.
Figure 2: the empirical constants of Assumptions 4 and 5 (`A^2`, `Delta^2`)
along a run with perfect clustering assignments (the ground-truth oracle).
Each (setting, algorithm) grid over learning rates and radius quantiles is
one XLA program (`prfl.sweep`).

  python -m experiments.synthetic                 # defaults, a few minutes
  python -m experiments.synthetic --settings 4x4 --rounds 500 --out /tmp/s
  python -m experiments.synthetic --smoke         # seconds

Writes `config.json` (first, with versions and backend), `results.json`,
`summary.csv`, `figure3.png` and `figure2.png` to `--out` (default
`results/synthetic`) and prints a summary table.
"""

from experiments import cli
from experiments.synthetic import config
from experiments.synthetic import run as run_lib

EXPERIMENT = cli.Experiment("synthetic", __doc__, config.Config,
                            config.resolve, lambda cfg: None, run_lib.run)

main = EXPERIMENT.main
