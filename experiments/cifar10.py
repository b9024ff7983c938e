"""Figure 4 of Werner et al. (2023): CIFAR-10 with private labels (§5.3.1).

4 clusters x 5 clients; cluster k relabels y -> (y + k) mod 10, so the same
image has different labels in different clusters. VGG-16, batch 32, SGD with
learning rate 0.1 and momentum 0.9. Three panels of personalized test accuracy
against rounds: (left) FC against Local, Global (FedAvg), Ditto, IFCA and the
ground-truth clusters; (middle) FC's radius as a percentile of the distances
to the centre; (right) FC with local steps between clustering rounds.

  python -m experiments.cifar10 --data-dir ~/data/cifar10   # the paper's setup
  python -m experiments.cifar10 --config experiments/configs/cifar10/fashion_mlp.toml
  python -m experiments.cifar10 --smoke                      # seconds

Writes `config.json` (first), `results.json`, `summary.csv`, `results.md`,
`figure4.png` and `tensorboard/` to `--out` (default `results/cifar10`).
"""

import dataclasses

from experiments import cifar
from experiments import cli
from experiments import groups
from experiments import registry
from experiments.options import group, option

ALGORITHMS = ("fc", "local", "global", "ditto", "ifca", "oracle")
# Figure 4 shows curves only; the text says what they show.
PAPER = {"fc": "above Local, close to ground truth",
         "local": "well above Ditto/IFCA/Global",
         "global": "poor (conflicting labels)",
         "ditto": "poor", "ifca": "poor", "oracle": "best (oracle)"}


@dataclasses.dataclass(frozen=True)
class Config(cifar.Config):
  """Every option of Figure 4 (defaults: the paper's §5.3.1)."""
  algorithms: registry.Algorithms = group(registry.Algorithms,
                                          algorithms=ALGORITHMS)
  baselines: groups.Baselines = group(groups.Baselines)
  panel_quantiles: tuple[float, ...] = option(
      (0.1, 0.2, 0.5), "FC radius percentiles of the middle panel", low=0,
      high=1, low_open=True)
  panel_local_steps: tuple[int, ...] = option(
      (0, 1, 4), "FC local steps between clustering rounds (right panel)",
      low=0)
  sweeps: bool = option(True, "the middle and right panels (else only the "
                        "left one)")


def resolve(cfg: Config) -> Config:
  return cifar.resolve(cfg, experiment="cifar10", task="private_label",
                       allowed=ALGORITHMS)


def prepare(cfg: Config) -> cifar.Prepared:
  return cifar.prepare(cfg, experiment="cifar10", task="private_label")


def jobs(cfg: Config) -> list:
  """(key, registry name, label, settings) of every run; FC at (--quantile,
  0 local steps) runs once, shared by the three panels."""
  q, names = cfg.clustering.quantile, cfg.algorithms.algorithms
  out = [(a, a, registry.label(a) + (
      f" (lambda={cfg.baselines.ditto_lambda:g})" if a == "ditto" else ""),
          registry.settings(cfg, a)) for a in names]
  if cfg.sweeps:
    fc = registry.settings(cfg, "fc")
    out += [(f"fc_q{v:g}", "fc", f"FC, {100 * v:g}th percentile",
             registry.Settings({**fc, "quantile": v}))
            for v in cfg.panel_quantiles if not (v == q and "fc" in names)]
    out += [(f"fc_local{t}", "fc", f"FC, {t} local steps",
             registry.Settings({**fc, "fc_local_steps": t}))
            for t in cfg.panel_local_steps if not (t == 0 and "fc" in names)]
  return out


def panel(key: str) -> str:
  if key.startswith("fc_q"):
    return "radius"
  return "local_steps" if key.startswith("fc_local") else "algorithms"


def panels(cfg: Config, runs: dict) -> list:
  out = [("Algorithms (private labels)",
          [runs[a] for a in cfg.algorithms.algorithms], registry.label("fc"))]
  if cfg.sweeps:
    fc, q = runs.get("fc"), cfg.clustering.quantile
    radius = [runs.get(f"fc_q{v:g}") or {
        **fc, "label": f"FC, {100 * v:g}th percentile"}
              for v in cfg.panel_quantiles]
    steps = [runs.get(f"fc_local{t}") or {**fc, "label": "FC, 0 local steps"}
             for t in cfg.panel_local_steps]
    out += [("FC: radius percentile", radius,
             f"FC, {100 * q:g}th percentile"),
            ("FC: local steps between clustering rounds", steps,
             "FC, 0 local steps")]
  return out


def run(cfg: Config, prepared: cifar.Prepared, tracker, command: str = ""):
  del command  # Recorded in config.json.
  tracker.log("CIFAR-10 private label:")
  runs = cifar.run_jobs(cfg, prepared, jobs(cfg), tracker)
  header = ["panel", "run"] + cifar.RESULT_COLUMNS + ["paper (Fig. 4)"]
  rows = [[panel(key), r["label"]] + cifar.result_cells(r)
          + [PAPER.get(key, "curves only")] for key, r in runs.items()]
  cifar.finish(cfg, prepared, runs, header, rows, tracker, title=(
      "Figure 4 (CIFAR-10, private labels): personalized test accuracy after "
      f"{cfg.schedule.rounds} rounds"), figure="figure4.png",
               panels=panels(cfg, runs))
  return runs


EXPERIMENT = cli.Experiment("cifar10", __doc__, Config, resolve, prepare, run)

main = EXPERIMENT.main


if __name__ == "__main__":
  main()
