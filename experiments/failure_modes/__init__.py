"""The paper's failure-mode examples (Werner et al., 2023, Section 2, Fig. 1).

Runs the three constructed examples of Section 2 and how Federated-Clustering
handles them (Section 3.1.3):

* Example 1 (N=3, K=2, f1, f2, f3 with the learning rate eta in the losses,
  every model starts at x=1.5): Myopic-Clustering clusters {1,2},{3} at the
  first step, then {1},{2,3}; client 2 stays at the saddle point x=1 and, once
  every gradient is within the clustering radius, all clients share one
  cluster. Federated-Clustering reaches the optima (0, 0, 2).
* Example 2 (f1=(x+0.5)^2, f2=(x-0.5)^2, cluster models at -1.5 and 0): IFCA
  (Options I and II) and HypCluster put both clients in cluster 2 at x=0 for
  ever; Federated-Clustering reaches (-0.5, 0.5).
* Example 3 (gradients g1=x, g2=x-1/2, g3=x or x-1 with probability 1/2 each):
  Clustered FL separates clients 2 and 3 with probability about 1/2 and never
  re-merges them (measured over many seeds with one vmap); Federated-
  Clustering re-checks all clients every round.

Every client's data is its own index (Examples 1 and 2) or its random target
(Example 3), so `loss_fn(params, batch)` is an ordinary one-client loss.

  python -m experiments.failure_modes [--out results/failure_modes]
  python -m experiments.failure_modes --smoke      # seconds

Writes `config.json` (first), `failure_modes.json` and `example{1,2,3}.png`.
"""

import os

from experiments import cli
from experiments import files
from experiments import options
from experiments.failure_modes import config
from experiments.failure_modes import examples
from experiments.failure_modes import report


def run(cfg, prepared, tracker, command: str = "") -> dict:
  """The three examples; writes failure_modes.json and the figures."""
  del prepared, command  # Nothing to load; the command is in config.json.
  results = {"config": options.to_dict(cfg),
             "example1": examples.example1(cfg),
             "example2": examples.example2(cfg),
             "example3": examples.example3(cfg)}
  files.write_json(os.path.join(cfg.run.out, "failure_modes.json"), results)
  if cfg.run.plots:
    report.plot(results, cfg.run.out)
  tracker.log(report.summary(results))
  tracker.log(f"Wrote failure_modes.json"
              + (" and example{1,2,3}.png" if cfg.run.plots else "")
              + f" to {cfg.run.out}")
  return results


EXPERIMENT = cli.Experiment("failure_modes", __doc__, config.Config,
                            config.resolve, lambda cfg: None, run)

main = EXPERIMENT.main
