"""Mutation testing of prfl_jax with only the tests that guard each line.

Every mutant is one small change to one line of a library module (an operator,
a comparison, a constant, a swapped `jnp.where` branch, ...) or one *edit*
named in a preset (a text replacement reproducing a defect someone found,
e.g. Ditto's global part stepping with the personal optimizer). A mutant is
*killed* when one of its tests fails (or errors, or times out) and *survives*
when they all pass. A surviving mutant is either a missing test or an
equivalent change, and must be explained (tools/README.md).

How mutants run (`--isolation`):
* `inprocess` (default): a few long-lived worker processes import JAX, the
  library and the tests once; for each mutant the `__code__` (and default
  values) of the top-level function holding the mutated line is swapped for
  the mutated one (so every reference to the function runs the mutant), or a
  module-level constant is rebound; JAX's caches are cleared, pytest runs in
  the worker (`-x`, the tests that name the mutated function first, then
  those naming its module's other functions: only the order changes, every
  test still runs before a survivor is called), and the original is
  restored. A mutant that crashes its worker counts as killed and the
  worker is restarted.
* `process`: a fresh `pytest -x` process per mutant on a scratch copy of the
  repository with the mutated module written in; slower by the ~45 s of
  importing JAX and collecting the tests on a loaded 2-core machine, but
  applicable to any line.

Why not mutmut: mutmut 3.8 runs JAX tests here (with `process_isolation =
forkserver` and `forkserver_warmup = none`; its default fork after importing
JAX risks XLA's fork deadlock), but it generated 800 mutants for
`clustering.py` alone, took ~20 s per mutant on a tiny test selection, and
selects code only by whole functions or `# pragma: no mutate` comments in
the source. This tool mutates only the lines it is given, with a smaller
operator set.

Targets are `PATH`, `PATH:FUNC[,FUNC...]` (dotted names reach nested
functions: `federated_clustering.step`) or `PATH:FIRST-LAST` (line numbers),
optionally followed by `=TEST[,TEST...]`: the tests run against that target's
mutants (default: `--tests`). A function target covers its body without its
docstring. Never mutated: `raise`/`assert` statements, f-strings, and shape
plumbing (arguments of `reshape`/`astype`/..., `axis=`/`dtype=`-like keywords,
`x.shape[...]`, constant indices such as `x[0]`), where a change only crashes
at trace time or is clamped away by JAX's indexing.

  python -m tools.mutation --preset core --list         # the mutants
  python -m tools.mutation --preset core --workers 2 --out mutation.json
  python -m tools.mutation --preset core --only 12,40   # rerun two mutants
  python -m tools.mutation --preset train --sample 40 --seed 0  # a sample
  python -m tools.mutation --target \
      "prfl_jax/clustering/radius.py:masked_quantile=tests/test_clustering.py"

(`python tools/mutation ...` runs the same.) The module paths are arguments,
so the tool keeps working when modules move; a preset looks for each module
at its known locations.

Modules: `operators` (which nodes change and how, the mutated source),
`presets` (the named sets of targets and edits), `workers` (running a
mutant's tests in-process or in a fresh process), `ordering` (the order of
a mutant's tests), `cli` (the command line).
"""

from tools.mutation.cli import excluded
from tools.mutation.cli import exclusion_key
from tools.mutation.cli import main
from tools.mutation.cli import select
from tools.mutation.operators import Mutant
from tools.mutation.operators import edit_mutant
from tools.mutation.operators import generate
from tools.mutation.operators import mutated_source
from tools.mutation.operators import unparsed_source
from tools.mutation.presets import PRESETS
from tools.mutation.presets import Target
from tools.mutation.presets import resolve_preset
from tools.mutation.workers import inprocess_site
from tools.mutation.workers import site_fingerprint
