"""The per-preset table of sampled runs, with reruns applied.

  python -m tools.mutation.tally SAMPLE.json [SAMPLE.json ...] \
      [--rerun RERUN.json ...]

Each SAMPLE (a `--preset P --sample K` run, possibly stopped by `--budget`)
gives one row over the operator mutants it finished; samples of the same
presets (a sample continued with `--only` the mutants it had not run) are
merged into one row. A RERUN (`--only` after a
test was added) replaces the result of the same mutant, matched by path,
function, line and change, so a survivor a new test kills counts as killed
after the fix. The killed share counts timeouts (a mutant's tests used up
their CPU seconds) as killed (as the tool does; they are also shown apart),
leaves errors and starved mutants (undecided: the wall-clock guard ran out
first, every retry) out, and has a 95% Wilson interval;
the projection multiplies it by the preset's number of operator mutants.
"""

import argparse
import json
import math
from typing import Dict, List, Sequence, Tuple

KILLED = ("killed", "timeout")


def wilson(k: int, n: int, z: float = 1.96) -> Tuple[float, float]:
  """95% Wilson score interval of a proportion k / n (n > 0)."""
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  return max(0.0, centre - half), min(1.0, centre + half)


def key(m: dict) -> tuple:
  return m["path"], m.get("function"), m["line"], m["before"], m["after"]


def merge(samples: Sequence[dict]) -> List[dict]:
  """One sample per set of presets: their finished mutants together."""
  out: Dict[str, dict] = {}
  for sample in samples:
    name = "+".join(sample["presets"])
    first = out.setdefault(name, dict(sample, mutants={}))
    for m in sample["mutants"]:
      if m["status"] != "pending" or key(m) not in first["mutants"]:
        first["mutants"][key(m)] = m
  return [dict(s, mutants=list(s["mutants"].values())) for s in out.values()]


def row(sample: dict, reruns: Dict[tuple, dict]) -> dict:
  """Counts of one sample's finished operator mutants, before and after the
  reruns."""
  done = [m for m in sample["mutants"]
          if m["kind"] != "edit" and m["status"] != "pending"]
  count = lambda ms, *s: sum(m["status"] in s for m in ms)
  after = [reruns.get(key(m), m) for m in done]
  survived = [m for m in done if m["status"] == "survived"]
  undecided = count(done, "error", "starved")
  n = len(done) - undecided
  killed = count(after, *KILLED)
  lo, hi = wilson(killed, n) if n else (math.nan, math.nan)
  total = sample["operator_mutants"]
  return dict(
      preset="+".join(sample["presets"]), total=total, run=len(done),
      killed=count(done, "killed"), timeouts=count(done, "timeout"),
      survived=len(survived), errors=undecided,
      fixed=sum(reruns.get(key(m), m)["status"] in KILLED for m in survived),
      still=[m["index"] for m in survived
             if reruns.get(key(m), m)["status"] == "survived"],
      killed_after=killed, share=killed / n if n else math.nan, lo=lo, hi=hi,
      projected=(round(lo * total), round(hi * total)))


def markdown(rows: Sequence[dict]) -> str:
  lines = ["| preset | operator mutants | sampled (run) | killed by a test | "
           "timeouts | survived | of them killed by a new test | still "
           "surviving | errors or starved | killed share after | 95% Wilson "
           "| projected killed of the preset |",
           "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
  for r in rows:
    still = ", ".join(f"#{i}" for i in r["still"]) or "0"
    lines.append(
        f"| `{r['preset']}` | {r['total']} | {r['run']} | {r['killed']} | "
        f"{r['timeouts']} | {r['survived']} | {r['fixed']} | {still} | "
        f"{r['errors']} | {r['killed_after']}/{r['run'] - r['errors']} = "
        f"{100 * r['share']:.1f}% | {100 * r['lo']:.1f}-{100 * r['hi']:.1f}% | "
        f"{r['projected'][0]}-{r['projected'][1]} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("samples", nargs="+", help="JSON of --sample runs")
  p.add_argument("--rerun", nargs="*", default=[],
                 help="JSON of --only reruns (later files win)")
  args = p.parse_args(argv)
  load = lambda path: json.load(open(path, encoding="utf-8"))
  reruns: Dict[tuple, dict] = {}
  for path in args.rerun:
    reruns.update({key(m): m for m in load(path)["mutants"]
                   if m["status"] != "pending"})
  rows = [row(s, reruns) for s in merge([load(p) for p in args.samples])]
  print(markdown(rows))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
