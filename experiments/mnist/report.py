"""Table 1's outputs: the markdown table beside the paper's, the checks."""

from experiments import registry
from experiments.mnist import config


def row_label(name: str, cfg) -> str:
  """An algorithm's row name (Ditto's with its lambda)."""
  if name == "ditto":
    lam = registry.settings(cfg, "ditto").ditto_lambda
    return f"{registry.label(name)} (lambda={lam:g})"
  return registry.label(name)


def markdown_table(cfg, results: dict, header: dict) -> str:
  """Table 1 in markdown: ours beside the paper's, wall time per run.

  Args:
    cfg: the resolved `config.Config`.
    results: `{task: [run dicts]}` (`experiments.training.train`, with
      `knn_lambda` on kNN-Per's).
    header: notes listed under the table.
  """
  cols = ["Algorithm"]
  for t in cfg.tasks:
    name = t.replace("_", " ")
    cols += [f"{name} acc. % (ours)", "(paper)", f"{name} loss (ours)",
             "(paper)", f"{name} time (s)"]
  lines = ["| " + " | ".join(cols) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|"]
  by_task = {t: {r["algorithm"]: r for r in runs}
             for t, runs in results.items()}
  for name in cfg.algorithms.algorithms:
    cells = [row_label(name, cfg)]
    for t in cfg.tasks:
      run = by_task[t][name]
      paper = config.PAPER[t].get(name)
      label = (f"{100 * run['accuracy']:.1f}" +
               (f" (lambda={run['knn_lambda']:g})" if name == "knn" else ""))
      cells += [label, f"{paper[0]:.1f}" if paper else "-",
                f"{run['loss']:.3f}", f"{paper[1]:.3f}" if paper else "-",
                f"{run['seconds']:.0f}"]
    lines.append("| " + " | ".join(cells) + " |")
  notes = [f"- {k}: {v}" for k, v in header.items()]
  return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def ordering_checks(results: dict) -> dict:
  """Issue 8's targets per task: FC within 2 points of the oracle, and the
  paper's ordering GT >= FC > Local > {Ditto, IFCA, kNN-Per, Global}."""
  out = {}
  for task, runs in results.items():
    acc = {r["algorithm"]: 100 * r["accuracy"] for r in runs}
    checks = {}
    if "fc" in acc and "oracle" in acc:
      checks["oracle_minus_fc_points"] = round(acc["oracle"] - acc["fc"], 2)
      checks["fc_within_2_points"] = acc["oracle"] - acc["fc"] <= 2.0
      checks["oracle_ge_fc"] = acc["oracle"] >= acc["fc"]
    if "fc" in acc and "local" in acc:
      checks["fc_gt_local"] = acc["fc"] > acc["local"]
    others = [a for a in ("ditto", "ifca", "knn", "global") if a in acc]
    if "local" in acc and others:
      checks["local_gt_" + "_".join(others)] = all(
          acc["local"] > acc[a] for a in others)
    out[task] = checks
  return out


def settings_line(cfg) -> str:
  """The shared settings, as the table's header states them."""
  s = registry.settings(cfg)
  return (f"{s.rounds} rounds, batch {s.batch_size}, lr {s.lr}, momentum "
          f"{s.momentum}, FC: {s.groups} groups, radius quantile "
          f"{s.quantile}, {s.num_iters} clustering steps, plan "
          f"{(s.chunk_size, s.kernel)}" + "".join(
              f"; {name}: {entries}" for name, entries in
              cfg.algorithms.per_algorithm.items()))
