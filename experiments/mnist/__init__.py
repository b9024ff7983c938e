"""Table 1 of Werner et al. (2023): personalization on MNIST-like data (§5.2).

K clusters of clients; the rotation task rotates cluster k's images by k*90
degrees, the private-label task maps cluster k's labels y -> (y + k) mod 10.
Every client trains the paper's MLP (one hidden layer of 200 ReLU units) with
batch 32, lr 0.1 and momentum 0.9; FC clusters gradients in N / 18.75 random
subgroups (the paper's 16 at N = 300) with the radius at the 20th percentile
of the distances. Reported: test accuracy and loss of each client's own model
on its own test data, over benign clients, beside the paper's numbers.

  python -m experiments.mnist                          # bundled 8x8 digits
  python -m experiments.mnist --config experiments/configs/mnist/paper.toml
  python -m experiments.mnist --dataset mnist --data-dir ~/mnist  # IDX files
  python -m experiments.mnist --per-algorithm fc.groups=4 --tasks rotation
  python -m experiments.mnist --smoke --out /tmp/t1    # seconds

Writes `config.json` (first), `table.md`, `results.json`, `summary.csv`,
`curves.png` (accuracy), `curves_loss.png` and `tensorboard/` to `--out`
(default `results/mnist/<dataset>`).
"""

from experiments import cli
from experiments.mnist import config
from experiments.mnist import run as run_lib

EXPERIMENT = cli.Experiment("mnist", __doc__, config.Config, config.resolve,
                            run_lib.prepare, run_lib.run)

main = EXPERIMENT.main
