"""prfl's aggregators and pre-aggregators against ByzFL's implementations.

On random inputs (N rows of dimension P, a few of them moved far away so
that the selection rules have something to select), every rule that ByzFL
ships is run in both libraries and the largest absolute difference is
logged. Runs in a separate environment with ByzFL and torch (never CI):

  python -m venv --system-site-packages /work/venv-byzfl
  /work/venv-byzfl/bin/pip install torch==2.13.0 byzfl     # or: .[byzfl]
  /work/venv-byzfl/bin/python -m benchmarks.check_byzfl

Writes `benchmarks/results/check_byzfl.log` (and prints it). Both sides run
in float64 (`jax_enable_x64`), so a difference above ~1e-12 is a
difference of definition, which the log names:

* ByzFL's Krum scores a row over its n - f - 1 nearest neighbours, the
  original (and prfl) over n - f - 2: ByzFL's `Krum(f)` is prfl's
  `krum(f - 1)`, its `MultiKrum(f)` is `krum(f - 1, num_selected=n - f)`.
* ByzFL's `GeometricMedian` starts its Weiszfeld iterations at 0, prfl at
  the mean: they are compared after enough iterations to converge.
* ByzFL's `CenteredClipping` starts at 0 (`m=None`): prfl gets `center=0`.
* ByzFL's `CAF` and `SMEA` estimate the top eigenvalue by ONE power-method
  step from a random vector; prfl computes it exactly. They are compared
  with ByzFL's own code with the step count raised (its `max_iters=1`
  replaced in the source, nothing else changed: 20,000 steps for CAF,
  whose top two eigenvalues can be close, 500 for SMEA), and the log also
  gives how often unpatched ByzFL picks the same output.
* The optimised attacks: ByzFL's `Optimal_ALittleIsEnough` and
  `Optimal_InnerProductManipulation` against its `Median` (no
  pre-aggregator) give the Byzantine vector prfl's `optimised_alie` /
  `optimised_ipm` with `aggregator_objective(median())` send.
* Bucketing draws a permutation: ByzFL's (NumPy's, under a seed) is handed
  to prfl's `bucket_means`.

prfl's Bulyan, DnC and SignGuard have no ByzFL counterpart (they are
checked against NumPy references in `tests/test_aggregators_new.py`).
"""

import copy
import importlib.util
import inspect
import os
import sys
import time
import types

import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from prfl_jax import aggregators as agg  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "results", "check_byzfl.log")
TRIALS = 20


def import_byzfl():
  """ByzFL's aggregators, without `byzfl/__init__` (which imports its
  benchmark and torchvision, unneeded here)."""
  spec = importlib.util.find_spec("byzfl")
  if spec is None:
    sys.exit("byzfl is not installed here: see this script's docstring.")
  pkg = types.ModuleType("byzfl")
  pkg.__path__ = list(spec.submodule_search_locations)
  sys.modules["byzfl"] = pkg
  import byzfl.aggregators as byz  # pylint: disable=g-import-not-at-top
  return byz


def converged(byz, name: str, steps: int):
  """ByzFL's class `name` with its power method run `steps` steps, not 1."""
  module = byz.aggregators
  source = inspect.getsource(getattr(module, name))
  assert source.count("max_iters=1)") == 1, name
  namespace = dict(vars(module))
  exec(source.replace("max_iters=1)", f"max_iters={steps})"), namespace)  # pylint: disable=exec-used
  return namespace[name]


def inputs(rng, n: int, p: int, outliers: int) -> np.ndarray:
  x = rng.normal(size=(n, p))
  x[:outliers] = 4.0 + 3.0 * rng.normal(size=(outliers, p))
  return x[rng.permutation(n)]


def cases(byz):
  """(name, ByzFL callable, prfl callable, N, P, outliers)."""
  z = lambda p: jnp.zeros((p,))
  return [
      ("Average", byz.Average(), agg.mean(), 10, 5, 2),
      ("Median", byz.Median(), agg.median(), 10, 5, 2),
      ("TrMean(f=2)", byz.TrMean(f=2), agg.trimmed_mean(2.5 / 10), 10, 5, 2),
      ("GeometricMedian(nu=1e-8, T=2000)",
       byz.GeometricMedian(nu=1e-8, T=2000),
       agg.geometric_median(2000, eps=1e-8), 10, 5, 2),
      ("Krum(f=2) vs krum(1)", byz.Krum(f=2), agg.krum(1), 10, 5, 2),
      ("MultiKrum(f=2) vs krum(1, num_selected=8)", byz.MultiKrum(f=2),
       agg.krum(1, num_selected=8), 10, 5, 2),
      ("CenteredClipping(m=0, L=3, tau=1.5)",
       byz.CenteredClipping(L=3, tau=1.5),
       agg.centered_clipping(1.5, 3, center=z(5)), 10, 5, 2),
      ("MDA(f=2)", byz.MDA(f=2), agg.mda(2), 9, 5, 2),
      ("MoNNA(f=2, idx=3)", byz.MoNNA(f=2, idx=3), agg.monna(2, index=3),
       10, 5, 2),
      ("Meamed(f=3)", byz.Meamed(f=3), agg.meamed(3), 10, 5, 2),
      ("CAF(f=2), power method 20000 steps",
       converged(byz, "CAF", 20000)(f=2), agg.caf(2), 10, 5, 2),
      ("SMEA(f=2), power method 500 steps",
       converged(byz, "SMEA", 500)(f=2), agg.smea(2), 9, 5, 2),
  ]


def pre_cases(byz):
  """(name, ByzFL pre-aggregator, prfl pre-aggregator, N, P, outliers)."""
  return [
      ("NNM(f=3)", byz.NNM(f=3), agg.nnm(3), 10, 5, 2),
      ("Clipping(c=2)", byz.Clipping(c=2.0), agg.clipping(2.0), 10, 5, 2),
      ("ARC(f=2)", byz.ARC(f=2), agg.arc(2), 10, 5, 2),
      ("ARC(f=3)", byz.ARC(f=3), agg.arc(3), 9, 5, 2),
  ]


def main():
  byz = import_byzfl()
  rng = np.random.default_rng(0)
  lines = [f"prfl vs ByzFL {byz.aggregators.__file__.split('site-packages/')[-1]}"
           f" ({TRIALS} random inputs each, float64; max |difference|)", ""]
  start = time.perf_counter()

  def row(name, diffs):
    lines.append(f"{name:48s} {max(diffs):.2e}")
    print(lines[-1], flush=True)

  for name, theirs, ours, n, p, out in cases(byz):
    fn = jax.jit(ours)
    diffs = []
    for _ in range(TRIALS):
      x = inputs(rng, n, p, out)
      fresh = copy.deepcopy(theirs)  # CenteredClipping keeps its last output.
      diffs.append(np.max(np.abs(np.asarray(fn(jnp.asarray(x))) -
                                 np.asarray(fresh(x.copy())))))
    row(name, diffs)
  for name, theirs, ours, n, p, out in pre_cases(byz):
    fn = jax.jit(lambda x, ours=ours: ours(x)[0])
    diffs = []
    for _ in range(TRIALS):
      x = inputs(rng, n, p, out)
      diffs.append(np.max(np.abs(np.asarray(fn(jnp.asarray(x))) -
                                 np.asarray(theirs(x.copy())))))
    row(name, diffs)
  diffs = []
  for trial in range(TRIALS):
    x = inputs(rng, 11, 5, 2)
    np.random.seed(trial)
    order = np.random.permutation(11)
    np.random.seed(trial)
    theirs = byz.Bucketing(s=3)(x.copy())
    ours = agg.bucket_means(jnp.asarray(x), jnp.asarray(order), 3)[0]
    diffs.append(np.max(np.abs(np.asarray(ours) - theirs)))
  row("Bucketing(s=3), ByzFL's permutation", diffs)

  import byzfl.attacks as byz_attacks  # pylint: disable=g-import-not-at-top
  from prfl_jax import attacks  # pylint: disable=g-import-not-at-top
  objective = attacks.aggregator_objective(agg.median())
  for name, theirs_cls, ours in (
      ("Optimal_ALittleIsEnough vs optimised_alie",
       byz_attacks.Optimal_ALittleIsEnough, attacks.optimised_alie(objective)),
      ("Optimal_InnerProductManipulation vs optimised_ipm",
       byz_attacks.Optimal_InnerProductManipulation,
       attacks.optimised_ipm(objective))):
    diffs = []
    fn = jax.jit(ours)
    byzantine = jnp.asarray(np.arange(12) >= 9)
    for _ in range(TRIALS):
      x = inputs(rng, 12, 5, 0)
      theirs = theirs_cls(agg=byz.Median(), pre_agg_list=[], f=3)(x[:9].copy())
      out = np.asarray(fn(jnp.asarray(x), byzantine, jax.random.key(0)))
      diffs.append(np.max(np.abs(out[9:] - theirs[None])))
    row(name + " (Median)", diffs)

  lines.append("")
  for name, f, ours, n in (("CAF", 2, agg.caf(2), 10),
                           ("SMEA", 2, agg.smea(2), 9)):
    theirs = getattr(byz, name)(f=f)
    same = 0
    np.random.seed(1)
    for _ in range(TRIALS):
      x = inputs(rng, n, 5, 2)
      same += np.allclose(np.asarray(jax.jit(ours)(jnp.asarray(x))),
                          theirs(x.copy()), atol=1e-9)
    lines.append(f"unpatched ByzFL {name} (one power step) gives prfl's "
                 f"output on {same}/{TRIALS} inputs")
    print(lines[-1], flush=True)
  lines += ["", f"{time.perf_counter() - start:.0f} s; load average "
            f"{' '.join(f'{v:.1f}' for v in os.getloadavg())} "
            f"({os.cpu_count()} CPUs)"]
  os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
  with open(RESULTS, "w") as fh:
    fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
