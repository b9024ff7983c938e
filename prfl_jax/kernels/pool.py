"""Max-pooling with the gradient of `reduce_window_max`, as strided slices.

`jax.grad` of `lax.reduce_window(x, -inf, lax.max, ...)` (what
`flax.linen.max_pool`, `jax.example_libraries.stax.MaxPool` and Equinox's
`MaxPool2d` emit) is `select_and_scatter_add`, which XLA:CPU runs an order of
magnitude slower than the forward pass: in a CNN's gradient it costs more than
the convolutions. `max_pool` computes the same values and the same gradient
from one strided slice of the (padded) input per window tap:

  y = max_k s_k,     s_k = x_pad[o_k + stride * t]   (t: output positions),
  dx = sum_k pad_k(where(first_k, dy, 0)),

where `first_k` marks, for every output, the first tap (in row-major order of
the window) holding the maximum, which is the tap `select_and_scatter_add`
with `select_prim=ge` picks (ties included; where windows overlap, the sum
over taps may differ from XLA's in the last bit), and `pad_k` is the
transpose of the k-th strided slice. Where the windows tile the input (2x2
pools of stride 2 on even maps), the same taps are found in `x`'s own layout
instead (`_tiled_bwd`). The ghost kernel's interpreter
(`kernels.interpret.evaluate`) runs it in place of the `reduce_window_max`
equations that `matches` accepts (`rules.register_replacement`).

Not covered (`matches` is False, the equation is left as is): base and
window dilation (JAX has no gradient for the latter either), windows with more
than `MAX_TAPS` taps, and non-float inputs. A window whose
values are all NaN routes no gradient (the engine masks non-finite clients).
"""

import functools
import math
from typing import Any, Mapping

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax.kernels import rules

# Larger windows (e.g. global pooling) keep `reduce_window_max`: one slice per
# tap would cost more than the scatter.
MAX_TAPS = 64


def matches(params: Mapping[str, Any], aval) -> bool:
  """Whether `max_pool` can replace a `reduce_window_max` equation.

  Args:
    params: the equation's params (`window_dimensions`, `window_strides`,
      `padding`, `base_dilation`, `window_dilation`).
    aval: its operand's abstract value.
  """
  return (all(d == 1 for d in params["base_dilation"]) and
          all(d == 1 for d in params["window_dilation"]) and
          int(np.prod(params["window_dimensions"])) <= MAX_TAPS and
          jnp.issubdtype(aval.dtype, jnp.floating))


def _taps(params, shape):
  """Padding config, output shape and `(start, limit)` of every tap's slice."""
  window, strides = params["window_dimensions"], params["window_strides"]
  padded = [s + lo + hi for s, (lo, hi) in zip(shape, params["padding"])]
  out = [max(0, (p - w) // st + 1) for p, w, st in zip(padded, window, strides)]
  taps = []
  for start in np.ndindex(*window):
    start = list(start)
    limit = [s + (t - 1) * st + 1 for s, t, st in zip(start, out, strides)]
    taps.append((start, limit))
  return out, taps


def _pad(x, value, params):
  return lax.pad(x, jnp.array(value, x.dtype),
                 [(lo, hi, 0) for lo, hi in params["padding"]])


def _slices(x, params):
  xp = _pad(x, -jnp.inf, params)
  out, taps = _taps(params, x.shape)
  strides = params["window_strides"]
  return xp, out, [lax.slice(xp, s, l, strides) for s, l in taps]


def _forward(x, params):
  _, _, slices = _slices(x, params)
  y = slices[0]
  for s in slices[1:]:
    y = jnp.maximum(y, s)
  return y


def _freeze(params: Mapping[str, Any]) -> tuple:
  keys = ("window_dimensions", "window_strides", "padding", "base_dilation",
          "window_dilation")
  return tuple((k, tuple(tuple(v) if isinstance(v, (tuple, list)) else v
                         for v in params[k])) for k in keys)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _max_pool(x, frozen):
  return _forward(x, dict(frozen))


def _max_pool_fwd(x, frozen):
  y = _forward(x, dict(frozen))
  return y, (x, y)


def tiles(params: Mapping[str, Any], shape) -> bool:
  """Whether the windows tile the input: strides equal to the window, no
  padding, every size a multiple of the window (e.g. 2x2 pools of stride 2
  on even maps)."""
  return all(
      w == st and lo == hi == 0 and n % w == 0
      for w, st, (lo, hi), n in zip(params["window_dimensions"],
                                    params["window_strides"],
                                    params["padding"], shape))


def _tiled_bwd(params, x, y, dy):
  """`_max_pool_bwd` where the windows tile the input, in `x`'s own layout.

  `x` viewed as `[o_0, w_0, o_1, w_1, ...]` (a reshape, no copy) holds every
  window's taps in place; the first maximum of a window is the least tap
  index (row-major over the window) among those equal to its maximum, one
  reduction over the window axes, and `dx` is one select in that view. The
  taps' slices stacked and transposed into `dx` (the general path's parts)
  cost 3-4x more: in the small CNN's round (`benchmarks/profile_cnn.py`,
  2x2 pools of 28x28x16 and 14x14x32 maps) that fusion recomputed every
  tap's slice for every output and was the round's largest single op.
  """
  window = tuple(params["window_dimensions"])
  nd = len(window)
  pairs = tuple(v for o, w in zip(y.shape, window) for v in (o, w))
  singles = tuple(v for o in y.shape for v in (o, 1))
  tap = np.zeros((1,) * 2 * nd, np.int32)
  for d in range(nd):  # Row-major tap index over the window.
    shape = [1] * 2 * nd
    shape[2 * d + 1] = window[d]
    tap = tap + (np.arange(window[d]) * math.prod(window[d + 1:])).reshape(
        shape)
  is_max = x.reshape(pairs) == y.reshape(singles)
  first = jnp.min(jnp.where(is_max, tap, math.prod(window)),
                  axis=tuple(range(1, 2 * nd, 2)), keepdims=True)
  dx = jnp.where(tap == first, dy.reshape(singles), jnp.zeros((), dy.dtype))
  return dx.reshape(x.shape)


def _max_pool_bwd(frozen, res, dy):
  """Routes `dy` to the first maximum of each window (see module docstring);
  where the windows tile the input, by `_tiled_bwd`."""
  params = dict(frozen)
  x, y = res
  if tiles(params, x.shape):
    return (_tiled_bwd(params, x, y, dy),)
  xp, _, slices = _slices(x, params)
  _, taps = _taps(params, x.shape)
  strides = params["window_strides"]
  zero = jnp.zeros((), dy.dtype)
  taken = jnp.zeros(y.shape, bool)
  dxp = jnp.zeros(xp.shape, dy.dtype)
  for s, (start, _) in zip(slices, taps):
    first = (s == y) & ~taken
    taken = taken | first
    # The transpose of lax.slice(xp, start, limit, strides).
    config = [(lo, n - lo - ((t - 1) * st + 1) if t else n - lo, st - 1)
              for lo, t, n, st in zip(start, y.shape, xp.shape, strides)]
    dxp = dxp + lax.pad(jnp.where(first, dy, zero), zero, config)
  crop = tuple(slice(lo, lo + n)
               for (lo, _), n in zip(params["padding"], x.shape))
  return (dxp[crop],)


_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)


def max_pool(x: jax.Array, params: Mapping[str, Any]) -> jax.Array:
  """`reduce_window_max` of `x` with `params`, with a slice-based gradient.

  Args:
    x: input of any rank (float).
    params: the equation's params (see `matches`; padding as pairs).

  Returns:
    the pooled array, equal to `lax.reduce_window(x, -inf, lax.max, ...)`,
    whose gradient equals that of `reduce_window_max` (first maximum of each
    window, row-major).
  """
  return _max_pool(x, _freeze(params))


rules.register_replacement(lax.reduce_window_max_p,
                           lambda params, avals: matches(params, avals[0]),
                           lambda params, x: max_pool(x, params))
