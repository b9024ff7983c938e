"""The tapped interpreter: a loss's jaxpr run again with taps on its layers.

`evaluate` runs the jaxpr of `trace.analyse` as an interpreter that adds a
tap (zeros, whose gradient is the output cotangent `dy`) to each active
layer equation's output and records its other operand `x`; `jax.grad` with
respect to the taps then gives every layer's `dy` without any weight
gradient. Calls that contain an active equation are inlined (their custom
derivative rules, if any, are then replaced by autodiff of their body);
every other equation is bound as is, or run by its registered replacement
(`rules.register_replacement`).
"""

from typing import Dict, Optional

from jax.extend import core as jcore

from prfl_jax.kernels import rules
from prfl_jax.kernels.trace import Analysis
from prfl_jax.kernels.trace import bind
from prfl_jax.kernels.trace import Path
from prfl_jax.kernels.trace import Site


def inline_paths(analysis: Analysis, active: Dict[Path, Site]) -> frozenset:
  """Call paths that contain an active site (interpreted, not bound)."""
  return frozenset(p for p in analysis.calls
                   if any(s[:len(p)] == p and len(s) > len(p) for s in active))


def evaluate(analysis: Analysis, leaves: list, taps: Optional[dict],
             active: Dict[Path, Site], inline: frozenset):
  """Runs the loss on flat `(params, batch)` leaves with taps (module doc).

  Args:
    analysis: from `analyse`.
    leaves: flat leaves of `(params, batch)` for one client.
    taps: `{path: zeros of the site's output}` or None (no taps).
    active: the sites whose input is recorded (and tapped).
    inline: from `inline_paths`.

  Returns:
    `(loss, {path: the site's other operand x})`.
  """
  records = {}

  def run(jaxpr, consts, args, prefix):
    env = {}

    def read(v):
      return v.val if isinstance(v, jcore.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
      env[v] = x
    for v, x in zip(jaxpr.invars, args):
      env[v] = x
    for i, eqn in enumerate(jaxpr.eqns):
      path = prefix + (i,)
      invals = [read(v) for v in eqn.invars]
      if path in inline:
        sub, sub_consts = analysis.calls[path]
        outs = run(sub, sub_consts, invals, path)
      else:
        with eqn.ctx.manager:
          replacement = rules.REPLACEMENTS.get(eqn.primitive)
          if replacement is not None and replacement[0](
              eqn.params, tuple(v.aval for v in eqn.invars)):
            outs = replacement[1](eqn.params, *invals)
            if not eqn.primitive.multiple_results:
              outs = [outs]
          else:
            outs = bind(eqn.primitive, eqn.params, invals)
        site = active.get(path)
        if site is not None:
          records[path] = invals[1 - site.weight_index]
          if taps is not None:
            outs = [outs[0] + taps[path].astype(outs[0].dtype)]
      for v, x in zip(eqn.outvars, outs):
        if not isinstance(v, jcore.DropVar):
          env[v] = x
    return [read(v) for v in jaxpr.outvars]

  closed = analysis.closed
  (loss,) = run(closed.jaxpr, closed.consts, leaves, ())
  return loss, records
