"""Byzantine robustness on real images: Figure 6 of Werner et al. (2023) and a grid.

Both parts use the private-label task (cluster k maps y -> (y + k) mod 10),
the paper's MLP (one hidden layer of 200 ReLU units), batch 32, lr 0.1 and
momentum 0.9, and FC with the radius at the 20th percentile in N/18.75 random
subgroups (the paper's 16 at N=300), as in Table 1 (`experiments.mnist`).
Accuracy is each benign client's model on its own test data, averaged over
benign clients.

* Figure 6 (§5.4): 4 clusters, each with as many Byzantine as benign clients
  (the paper: 50 + 50 per cluster on MNIST), under the large-gradient and
  bit-flip attacks; FC against Global (FedAvg), learning curves.
* The grid: every attack of `prfl.attacks` (label flipping as a data
  transform, large, bit flip, Gaussian, ALIE, IPM, mimic, NaN, Inf and the
  paper's worst case for Threshold-Clustering, `threshold_edge`) x the
  Byzantine fraction of every cluster x {FC, Global, Global + each robust
  aggregator, IFCA + median}; attack-free runs of the ground-truth oracle and
  Local as references.

  python -m experiments.byzantine                       # digits, ~1 hour
  python -m experiments.byzantine --dataset fashion_mnist
  python -m experiments.byzantine --part grid --attacks alie,edge --fractions 0,0.2
  python -m experiments.byzantine --smoke --out /tmp/b  # a minute

Writes to `--out` (default `results/byzantine/<dataset>`): `config.json`
(first), `grid.md`, `grid.json`, `grid.csv`, `heatmap.png`, `figure6.md`,
`figure6.json`, `figure6.png` and `tensorboard/`.
"""

from experiments import cli
from experiments.byzantine import config
from experiments.byzantine import run as run_lib

EXPERIMENT = cli.Experiment("byzantine", __doc__, config.Config,
                            config.resolve, run_lib.prepare, run_lib.run)

main = EXPERIMENT.main
