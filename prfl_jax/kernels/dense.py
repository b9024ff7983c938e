"""Layer rule for dense products: `lax.dot_general` with a parameter operand.

For `y = dot_general(x, W)` (or `dot_general(W, x)`) with contracting dims
`c`, batch dims `b` and the remaining "free" dims, the weight gradient of one
client is, per batch index g (a group),

  dW[g, c, f] = sum_m x[g, m, c] dy[g, m, f],

where `m` runs over the free dims of `x` (the batch of examples, and e.g.
sequence positions) and `f` over the free dims of `W`. So the tokens are
`a = x` with its dims ordered (batch, free, contracting) and `d = dy` with its
dims ordered (batch, free of x, free of W); this covers `x @ w`, `w @ x`, the
`jnp.einsum`s of attention-style weights, and `flax.linen.Dense` /
`DenseGeneral` kernels, whatever reshape or transpose brings the parameter to
the product (the ghost kernel pulls the gradient back through those).
See `prfl_jax.kernels.rules` for the protocol.
"""

import dataclasses
import math
from typing import Tuple

from jax import lax
import jax.numpy as jnp

from prfl_jax.kernels import rules


@dataclasses.dataclass(frozen=True)
class DenseLayer(rules.Layer):
  """A dot_general whose operand `weight_index` is the parameter."""
  x_perm: Tuple[int, ...] = ()  # x's dims as (batch, free, contracting).
  dy_perm: Tuple[int, ...] = ()  # dy's dims as (batch, free of x, free of W).
  w_split: Tuple[int, ...] = ()  # W's sizes in (batch, contracting, free) order.
  w_perm: Tuple[int, ...] = ()  # Puts (batch, contracting, free) into W's order.
  w_dtype: str = "float32"

  def tokens(self, x, dy):
    g, m, p, q = self.groups, self.tokens_per_call, self.p, self.q
    a = jnp.transpose(x, self.x_perm).reshape(g, m, p)
    d = jnp.transpose(dy, self.dy_perm).reshape(g, m, q)
    return a, d

  def fold(self, w):
    return jnp.transpose(w.reshape(self.w_split), self.w_perm).astype(
        self.w_dtype)

  def fold_key(self):
    return (DenseLayer, self.groups, self.p, self.q, self.w_split, self.w_perm,
            self.w_dtype)


def match(params: dict, in_avals: tuple, weight_index: int):
  """`DenseLayer` for a `dot_general` with the parameter at `weight_index`."""
  (lc, rc), (lb, rb) = params["dimension_numbers"]
  w_aval, x_aval = in_avals[weight_index], in_avals[1 - weight_index]
  wc, xc = (rc, lc) if weight_index == 1 else (lc, rc)
  wb, xb = (rb, lb) if weight_index == 1 else (lb, rb)
  wc, xc, wb, xb = (tuple(int(i) for i in t) for t in (wc, xc, wb, xb))
  wf = tuple(i for i in range(w_aval.ndim) if i not in wc + wb)
  xf = tuple(i for i in range(x_aval.ndim) if i not in xc + xb)
  nb = len(wb)
  # Output dims: batch, then lhs free, then rhs free.
  x_out = tuple(range(nb, nb + len(xf)))
  w_out = tuple(range(nb + len(xf), nb + len(xf) + len(wf)))
  if weight_index == 0:
    w_out = tuple(range(nb, nb + len(wf)))
    x_out = tuple(range(nb + len(wf), nb + len(wf) + len(xf)))
  size = lambda shape, dims: math.prod(shape[i] for i in dims)
  order = wb + wc + wf
  return DenseLayer(
      groups=size(w_aval.shape, wb), p=size(w_aval.shape, wc),
      q=size(w_aval.shape, wf), tokens_per_call=size(x_aval.shape, xf),
      feature_dims=tuple(range(nb)) + w_out,
      x_perm=xb + xf + xc, dy_perm=tuple(range(nb)) + x_out + w_out,
      w_split=tuple(w_aval.shape[i] for i in order),
      w_perm=tuple(order.index(i) for i in range(w_aval.ndim)),
      w_dtype=jnp.dtype(w_aval.dtype).name)


rules.register_rule(lax.dot_general_p, match)
