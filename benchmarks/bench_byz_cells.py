"""The Byzantine protocol's runner side by side: one run per cell, or cells.

Trains the same grid cells (one algorithm and attack at several Byzantine
fractions, `experiments/configs/byzantine/protocol_digits.toml`'s
federation) once with the serial runner (`run_one` per fraction, as
`python -m experiments.byzantine` without `--cells`) and once as one
vmapped program (`run_cells`), each mode in its own process with a fresh
persistent compilation cache (the serial runs may share compiled programs
through it, as the experiment does), and writes the wall and CPU seconds,
the compile seconds and every cell's accuracy:

  python -m benchmarks.bench_byz_cells --method fc_ball_cap \\
      --attack alie_jitter --fractions 0.1,0.2,0.3 --rounds 20 \\
      --out benchmarks/results/byz_cells.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PRESET = "experiments/configs/byzantine/protocol_digits.toml"
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


def measure(mode: str, method: str, attack: str, fractions: list,
            rounds: int) -> dict:
  """One mode in this process: seconds and accuracies."""
  from jax import monitoring  # pylint: disable=import-outside-toplevel
  from experiments import cli  # pylint: disable=import-outside-toplevel
  from experiments import tracking  # pylint: disable=import-outside-toplevel
  from experiments.byzantine import config  # pylint: disable=import-outside-toplevel
  from experiments.byzantine import run as run_lib  # pylint: disable=import-outside-toplevel

  compile_s = {e: 0.0 for e in COMPILE_EVENTS}
  monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: compile_s.__setitem__(
          event, compile_s[event] + secs) if event in compile_s else None)
  cfg, _ = cli.parse(config.Config, [
      "--config", PRESET, "--fractions", ",".join(map(str, fractions)),
      "--rounds", str(rounds), "--eval-every", str(rounds // 2)])
  cfg = config.resolve(cfg)
  prepared = run_lib.prepare(cfg)
  cli.enable_compile_cache()
  with tempfile.TemporaryDirectory() as out:
    tracker = tracking.Tracker(out, progress="off")
    wall, cpu = time.perf_counter(), time.process_time()
    if mode == "cells":
      rows = run_lib.run_cells(cfg, method, attack, fractions, prepared,
                               tracker)
    else:
      rows = [run_lib.run_one(cfg, method, attack, prepared.grid[f], "grid",
                              prepared, tracker, tag=str(f))
              for f in fractions]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  return {"mode": mode, "wall_s": wall, "cpu_s": cpu,
          "compile_s": {e.rsplit("/", 1)[1]: s for e, s in compile_s.items()},
          "accuracy": [r["accuracy"] for r in rows],
          "load_after": os.getloadavg()}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--method", default="fc_ball_cap")
  p.add_argument("--attack", default="alie_jitter")
  p.add_argument("--fractions", default="0.1,0.2,0.3")
  p.add_argument("--rounds", type=int, default=20)
  p.add_argument("--out", required=True)
  p.add_argument("--mode", choices=("serial", "cells"),
                 help="measure one mode in this process (internal)")
  a = p.parse_args(argv)
  fractions = [float(f) for f in a.fractions.split(",")]
  if a.mode:
    print(json.dumps(measure(a.mode, a.method, a.attack, fractions,
                             a.rounds)))
    return
  result = {"method": a.method, "attack": a.attack, "fractions": fractions,
            "rounds": a.rounds, "load_before": os.getloadavg(), "modes": []}
  for mode in ("serial", "cells"):
    with tempfile.TemporaryDirectory() as cache:
      env = {**os.environ, "PRFL_JAX_COMPILE_CACHE": cache}
      args = [sys.executable, "-m", "benchmarks.bench_byz_cells", "--mode",
              mode, "--method", a.method, "--attack", a.attack,
              "--fractions", a.fractions, "--rounds", str(a.rounds),
              "--out", a.out]
      line = subprocess.run(args, env=env, check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    result["modes"].append(json.loads(line))
    print(result["modes"][-1], flush=True)
  serial, cells = result["modes"]
  result["speedup_wall"] = serial["wall_s"] / cells["wall_s"]
  result["speedup_cpu"] = serial["cpu_s"] / cells["cpu_s"]
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  with open(a.out, "w") as f:
    json.dump(result, f, indent=1)
  print(f"speed-up: {result['speedup_wall']:.2f}x wall, "
        f"{result['speedup_cpu']:.2f}x CPU")


if __name__ == "__main__":
  main()
