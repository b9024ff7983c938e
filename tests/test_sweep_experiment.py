"""experiments/sweep.py: a grid from a file, vmapped where it can be.

Mutations seen to fail these tests: `TRACED` emptied (every grid point its
own program), the grid's last option varying slowest (`points`), a program's
results handed to its grid points in reverse order (`run_programs`; the
smoke table's values were only range-checked before, issue 21), the grid's
keys split per grid point (`run_programs`; a point's numbers then depend on
the grid it is swept in).
"""

import json

import numpy as np
import pytest

from experiments import cli
from experiments import sweep
from tests import tolerances


def _cfg(argv):
  return sweep.resolve(cli.parse(sweep.Config, argv)[0])


def test_grid_points_and_programs(tmp_path):
  grid = tmp_path / "grid.toml"
  grid.write_text("algorithms = ['fc']\n[grid]\nlr = [0.05, 0.1]\n"
                  "quantile = [0.1, 0.2]\nbatch_size = [8, 16]\n")
  cfg = _cfg(["--config", str(grid)])
  pts = sweep.points(cfg)
  assert len(pts) == 8
  assert pts[:3] == [{"lr": 0.05, "quantile": 0.1, "batch_size": 8},
                     {"lr": 0.05, "quantile": 0.1, "batch_size": 16},
                     {"lr": 0.05, "quantile": 0.2, "batch_size": 8}]
  assert sweep.settings(cfg, "fc", pts[1]).batch_size == 16
  # The command line adds to (or replaces) the file's grid.
  cfg = _cfg(["--config", str(grid), "--grid", "lr=0.2,0.3"])
  assert cfg.grid["lr"] == [0.2, 0.3] and len(sweep.points(cfg)) == 8


@pytest.mark.parametrize("argv, message", [
    ([], "nothing to sweep"),
    (["--grid", "lr=0.1,-1"], "--grid lr"),
    (["--grid", "lr=0.1,0.1"], "repeats"),
    (["--grid", "hidden=8,16"], "not a setting to sweep"),
    (["--grid", "lr"], "--grid"),
    (["--grid", "lr=0.1", "--algorithms", "knn"], "kNN-Per"),
    (["--grid", "batch_size=32,64"], "--batch-size 64"),
])
def test_bad_grids_name_the_option(argv, message, capsys):
  with pytest.raises(SystemExit):
    sweep.main(argv + ["--out", "/nonexistent/never/written"])
  assert message in capsys.readouterr().err


def test_smoke_grid_is_one_program_per_task_and_one_table(tmp_path):
  out = tmp_path / "s"
  results = sweep.main(["--smoke", "--out", str(out), "--progress", "lines"])
  rows = results["rotation"]["fc"]
  assert [r["program_points"] for r in rows] == [4] * 4
  assert [r["point"] for r in rows] == [
      {"lr": lr, "quantile": q} for lr in (0.05, 0.1) for q in (0.1, 0.2)]
  assert all(0 <= r["accuracy"] <= 1 and np.isfinite(r["loss"])
             for r in rows)
  # Different learning rates give different models.
  assert len({round(r["loss"], 6) for r in rows}) == 4
  # FC's diagnostics per grid point, one value per round (3 rounds).
  assert rows[0]["train_round"] == [1, 2, 3]
  assert len(rows[0]["train_curves"]["effective_count"]) == 3
  table = (out / "table.md").read_text()
  assert table.startswith("| lr | quantile | rotation FC (ours) acc. % |")
  assert len([l for l in table.splitlines() if l.startswith("| 0.")]) == 4
  saved = json.loads((out / "results.json").read_text())
  assert saved["config"]["grid"] == {"lr": [0.05, 0.1],
                                     "quantile": [0.1, 0.2]}
  assert len(list((out / "tensorboard" / "rotation" / "fc").iterdir())) == 4
  # A grid point's numbers are those of the same point swept alone (the
  # keys do not depend on the grid): the same accuracy, the same loss to
  # float32 rounding. Bit for bit at XLA:CPU's default optimisation level;
  # at level 0 (the suite's, conftest.py) the 1-point and the 4-point
  # programs rounded the loss 1 ulp apart. The other grid points' losses
  # are >= 3e-3 away, so a point given another point's keys or results
  # fails by far.
  alone = sweep.main(["--smoke", "--grid", "lr=0.1", "--grid",
                      "quantile=0.2", "--out", str(tmp_path / "one"),
                      "--progress", "off", "--no-tensorboard"])
  (one,) = alone["rotation"]["fc"]
  assert one["point"] == rows[3]["point"] == {"lr": 0.1, "quantile": 0.2}
  # Accuracies are counts over the same examples: equal up to the float
  # division's rounding (an H200 read 0.09166668 against 0.09166667); one
  # example more or fewer is 8e-3 away.
  np.testing.assert_allclose(one["accuracy"], rows[3]["accuracy"], rtol=1e-6)
  np.testing.assert_allclose(one["loss"], rows[3]["loss"],
                             **tolerances.model(rtol=1e-6))
