"""The layer-rule protocol of the ghost kernel, and the registry of rules.

A layer rule tells the ghost kernel (`prfl_jax.kernels.ghost`) how the
gradient of a parameter that enters one primitive (a dense product, a
convolution) factors over tokens. For one client, the gradient of the
parameter operand `W` of such an equation is

  dL/dW = fold( sum_m a_m^T d_m )      per group g,      (tokens)

with token matrices `a [G, M, p]` built from the equation's other operand `x`
(the layer input) and `d [G, M, q]` built from the cotangent `dy` of its output.
Everything the kernel needs follows from them: the Gram matrix of N clients'
gradients is `sum_g (a a^T) * (d d^T)` summed over the clients' token blocks,
and a combination `sum_j c_j g_j` is `fold(a^T (c d))`, one GEMM.

A rule is a module that calls `register_rule(primitive, match)` at import, with

  match(params, in_avals, weight_index) -> Optional[Layer]

`params` are the equation's params, `in_avals` its operands' abstract values
for ONE client and `weight_index` the operand that is the parameter. It returns
None for anything it does not support (the parameter is then differentiated by
plain autodiff, which is always correct) or a `Layer`. A new rule is one file
(`prfl_jax/kernels/dense.py` is the reference) and one import line in
`prfl_jax/kernels/__init__.py`.

A module may also register a faster implementation of a primitive for the
ghost kernel's interpreter (`register_replacement`): same values and same
gradient, e.g. max-pooling whose gradient avoids XLA:CPU's slow
`select_and_scatter_add` (`kernels/pool.py`).
"""

import dataclasses
from typing import Any, Callable, Optional, Tuple

import jax

# match(params: dict, in_avals: tuple, weight_index: int) -> Optional[Layer]
MatchFn = Callable[[dict, tuple, int], Optional["Layer"]]

RULES = {}  # primitive -> match function.
# primitive -> (matches(params, in_avals) -> bool, impl(params, *args) -> out).
REPLACEMENTS = {}


def register_rule(primitive: Any, match: MatchFn):
  """Makes the ghost kernel use `match` for equations of `primitive`."""
  if not callable(match):
    raise TypeError(f"`match` must be callable, got {type(match)}.")
  RULES[primitive] = match


def register_replacement(primitive: Any, matches: Callable,
                         impl: Callable):
  """Makes the ghost kernel's interpreter run `impl` for `primitive`.

  Args:
    primitive: e.g. `lax.reduce_window_max_p`.
    matches: `matches(params: dict, in_avals: tuple) -> bool`, whether `impl`
      covers an equation with these params and operands (one client).
    impl: `impl(params: dict, *operands)` -> the equation's output (a list of
      outputs if the primitive has multiple results), with the same values
      and the same gradient as the primitive.
  """
  if not callable(matches) or not callable(impl):
    raise TypeError("`matches` and `impl` must be callable.")
  REPLACEMENTS[primitive] = (matches, impl)


@dataclasses.dataclass(frozen=True)
class Layer:
  """One equation's gradient structure, for one client (a rule's `match`).

  Subclasses are frozen dataclasses (hashable, static) holding whatever the
  equation's params say, and implement `tokens` and `fold`.

  Attributes:
    groups: G, independent blocks of the weight (feature groups of a
      convolution, batch dimensions of a dot_general; 1 for a dense layer).
    p: token width on the input side (dense: the contracted size; conv:
      window size x input channels per group).
    q: token width on the output side (output features per group).
    tokens_per_call: M, the tokens of one client in this equation (dense:
      the batch and other free dims of the input; conv: batch x output
      positions).
    feature_dims: axes of the equation's output that hold the (G, q)
      features, in the order in which their row-major flattening is (G, q);
      a bias broadcast over every other axis has gradient `sum_m d[g, m]`.
  """
  groups: int
  p: int
  q: int
  tokens_per_call: int
  feature_dims: Tuple[int, ...]

  def tokens(self, x: jax.Array, dy: jax.Array):
    """Token matrices of one client.

    Args:
      x: the equation's other operand (the layer input), as it enters it.
      dy: the cotangent of the equation's output.

    Returns:
      `(a [G, M, p], d [G, M, q])`; `a` depends only on `x` and `d` only on
      `dy`, both linearly, such that the weight operand's gradient is
      `fold(einsum("gmp,gmq->gpq", a, d))`.
    """
    raise NotImplementedError

  def fold(self, w: jax.Array) -> jax.Array:
    """`w [G, p, q]` -> an array of the weight operand's shape and layout."""
    raise NotImplementedError

  def fold_key(self) -> Any:
    """Two equations of one parameter share tokens iff their keys are equal.

    The default is every field but `tokens_per_call` (the weight's view and
    layout), so the same layer applied to inputs of different lengths still
    concatenates its tokens.
    """
    fields = dataclasses.asdict(self)
    fields.pop("tokens_per_call")
    return (type(self), tuple(sorted(fields.items(), key=lambda kv: kv[0])))
