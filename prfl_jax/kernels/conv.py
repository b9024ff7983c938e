"""Layer rule for convolutions: `conv_general_dilated` with a parameter kernel.

For `y = conv_general_dilated(x, w, ...)` with `G = feature_group_count`, the
input channels `C` and output features `O` split into `G` groups of `Cg = C / G`
and `Og = O / G` (output feature `o` belongs to group `o // Og`). Flatten the
output positions of every example into tokens (`M = B * T`, `T` output
positions per example) and let, for group `g`,

  A_g [M, p]: the input patch each token sees, `p = K * Cg` (K kernel taps),
  D_g [M, q]: the cotangent `dL/dy` at the token, `q = Og`.

Then one client's kernel gradient is, group by group,

  dw_g = A_g^T D_g  [p, q],                                              (1)

and a bias added to `y`'s feature dimension has gradient `1^T D_g`. So, as for
a dense layer (`prfl_jax.kernels.rules`), the inner product of two clients'
conv gradients is

  <g_j, g_k> = sum_g sum_{t, t'} (A_j A_k^T + 1)_g (D_j D_k^T)_g        (2)

(entrywise products of `[M, M]` blocks; the `+ 1` is the bias), and a
combination `sum_j c_j dw_j` is `fold(A^T (c D))`, one GEMM per group.

`tokens` cuts the patches by strided slices of the padded (for `lhs_dilation`,
interior-padded) input, one slice per kernel tap, in channels-last layout and
concatenated along channels: a patch's features are tap-major, `(k_0, k_1,
..., cg)` with the taps in row-major order of the spatial dimensions.
(`lax.conv_general_dilated_patches` orders them channel-major, `(cg, k_0, k_1,
...)`, and computes them as a depthwise convolution, which is slower on
XLA:CPU; the tests check the two against each other.) `fold` undoes that order
and the dimension numbers, so `fold(A^T D)` is the kernel's gradient in its own
shape and layout (HWIO for flax, OIHW for torch-style dimension numbers).

`kernels/conv_cpu.py` computes the convolution itself from the same patches
where XLA:CPU's own convolution is slow, for the engine's interpreter.

Supported: any spatial rank (1-D, 2-D, 3-D), window strides, explicit padding
(a jaxpr always carries pairs; `"SAME"` / `"VALID"` are accepted by the pure
functions too), lhs (transposed) and rhs (atrous) dilation, any dimension
numbers, feature groups (depthwise included). `batch_group_count > 1` is not
supported: `match` returns None, so such a kernel is differentiated by plain
autodiff.

References:
  The per-example form of (2) is the ghost norm of convolutional layers (Bu et
  al., 2022, "Scalable and efficient training of large convolutional neural
  networks with differential privacy"); here it is used across clients and
  models (Werner et al., 2023, Algorithm 1, lines 6-7).
"""

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence, Tuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax.kernels import rules

Params = Mapping[str, Any]


def conv_params(lhs_ndim: int, *, window_strides: Sequence[int],
                padding: Any, lhs_dilation: Optional[Sequence[int]] = None,
                rhs_dilation: Optional[Sequence[int]] = None,
                dimension_numbers: Any = None, feature_group_count: int = 1,
                batch_group_count: int = 1) -> dict:
  """The primitive's params from the arguments of `lax.conv_general_dilated`.

  Args:
    lhs_ndim: rank of the input `x` (number of spatial dimensions + 2).
    window_strides: as in `lax.conv_general_dilated`.
    padding: `"SAME"`, `"VALID"` or `(low, high)` pairs (kept as given;
      a string with `lhs_dilation` raises in `tokens`, as in lax).
    lhs_dilation: as in `lax.conv_general_dilated` (None: 1s).
    rhs_dilation: as in `lax.conv_general_dilated` (None: 1s).
    dimension_numbers: None, strings such as `("NHWC", "HWIO", "NHWC")`, or
      a `lax.ConvDimensionNumbers`.
    feature_group_count: as in `lax.conv_general_dilated`.
    batch_group_count: as in `lax.conv_general_dilated`.

  Returns:
    dict with the keys of `eqn.params` that this rule reads.
  """
  n = lhs_ndim - 2
  shape = (1,) * lhs_ndim
  return dict(window_strides=tuple(window_strides), padding=padding,
              lhs_dilation=tuple(lhs_dilation or (1,) * n),
              rhs_dilation=tuple(rhs_dilation or (1,) * n),
              dimension_numbers=lax.conv_dimension_numbers(
                  shape, shape, dimension_numbers),
              feature_group_count=int(feature_group_count),
              batch_group_count=int(batch_group_count))


def dimension_numbers_of(params: Params,
                         ndim: int) -> lax.ConvDimensionNumbers:
  """The params' dimension numbers as a `lax.ConvDimensionNumbers`."""
  dn = params.get("dimension_numbers")
  if isinstance(dn, lax.ConvDimensionNumbers):
    return dn
  return lax.conv_dimension_numbers((1,) * ndim, (1,) * ndim, dn)


def explicit_padding(params: Params, in_spatial: Sequence[int],
                     filter_spatial: Sequence[int]) -> Tuple:
  """`(low, high)` pairs, from pairs or from `"SAME"` / `"VALID"`."""
  padding = params["padding"]
  if not isinstance(padding, str):
    return tuple((int(lo), int(hi)) for lo, hi in padding)
  if any(d != 1 for d in params["lhs_dilation"]):
    raise ValueError(  # As lax.conv_general_dilated.
        f"`padding` {padding!r} with `lhs_dilation` "
        f"{params['lhs_dilation']}: give explicit (low, high) pairs.")
  dilated_k = [(k - 1) * d + 1 for k, d in zip(filter_spatial,
                                               params["rhs_dilation"])]
  return tuple(tuple(pair) for pair in lax.padtype_to_pads(
      in_spatial, dilated_k, params["window_strides"], padding))


def patches(x: jax.Array, filter_spatial: Sequence[int],
            out_spatial: Sequence[int], params: Params) -> jax.Array:
  """Input patches of one client, channels last, tap-major features.

  Args:
    x: the conv input, layout per `params["dimension_numbers"]`, e.g.
      `[B, H, W, C]` for NHWC.
    filter_spatial: the kernel's spatial sizes `(k_0, k_1, ...)`, in the order
      of the spatial dimensions (that of `lhs_spec[2:]`).
    out_spatial: the output's spatial sizes `(T_0, T_1, ...)`, same order.
    params: the primitive's params.

  Returns:
    `[B, T_0, T_1, ..., K * C]`, `K = prod(filter_spatial)`: entry
    `[b, t..., k * C + c]` is the input value that kernel tap `k` (row-major
    over `filter_spatial`) of input channel `c` multiplies at output
    position `t` (zero where the window covers padding or dilation holes).
  """
  lhs = dimension_numbers_of(params, x.ndim).lhs_spec
  x = jnp.transpose(x, (lhs[0],) + tuple(lhs[2:]) + (lhs[1],))
  pads = explicit_padding(params, x.shape[1:-1], filter_spatial)
  config = ([(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in
                           zip(pads, params["lhs_dilation"])] + [(0, 0, 0)])
  x = lax.pad(x, jnp.zeros((), x.dtype), config)
  strides = tuple(params["window_strides"])
  rhs_dil = params["rhs_dilation"]
  cuts = []
  for tap in np.ndindex(*filter_spatial):
    start = [i * d for i, d in zip(tap, rhs_dil)]
    limit = [s + (t - 1) * st + 1 for s, t, st in zip(start, out_spatial,
                                                     strides)]
    cuts.append(lax.slice(x, [0] + start + [0],
                          [x.shape[0]] + limit + [x.shape[-1]],
                          (1,) + strides + (1,)))
  return cuts[0] if len(cuts) == 1 else jnp.concatenate(cuts, axis=-1)


def tokens(x: jax.Array, dy: jax.Array, params: Params,
           kernel_shape: Sequence[int]) -> Tuple[jax.Array, jax.Array]:
  """One client's patches and output cotangents as `G` token matrices.

  Args:
    x: the conv input of one client, e.g. `[B, H, W, C]` for NHWC.
    dy: the cotangent of the conv output, e.g. `[B, H', W', O]` for NHWC.
    params: the primitive's params (`eqn.params`, or `conv_params(...)`).
    kernel_shape: the kernel's shape, e.g. `[kh, kw, Cg, O]` for HWIO.

  Returns:
    `(a [G, M, p], d [G, M, q])` with `M = B * T` tokens in row-major order
    of (example, output position), `p = K * Cg` (tap-major, see `patches`)
    and `q = O / G`; the kernel's gradient is `fold(a^T d)` (see `fold`).
    `a` depends only on `x`, `d` only on `dy`.
  """
  ndim = x.ndim
  _, rhs, out = dimension_numbers_of(params, ndim)
  g = params.get("feature_group_count", 1)
  d = jnp.transpose(dy, (out[0],) + tuple(out[2:]) + (out[1],))
  out_spatial, o = d.shape[1:-1], d.shape[-1]
  m = d.shape[0] * math.prod(out_spatial)
  filter_spatial = [kernel_shape[i] for i in rhs[2:]]
  a = patches(x, filter_spatial, out_spatial, params)
  if g == 1:
    return a.reshape(1, m, -1), d.reshape(1, m, o)
  k = math.prod(filter_spatial)
  # [M, K, G, Cg] -> [G, M, K, Cg]: channel c = g * Cg + cg.
  a = jnp.transpose(a.reshape(m, k, g, -1), (2, 0, 1, 3)).reshape(g, m, -1)
  d = jnp.transpose(d.reshape(m, g, o // g), (1, 0, 2))
  return a, d


def fold(w: jax.Array, params: Params,
         kernel_shape: Sequence[int]) -> jax.Array:
  """`[G, p, q]` products such as `a^T d` of `tokens`, as a kernel.

  Args:
    w: `[G, p, q]`, e.g. `a_g^T d_g` of one client (its kernel gradient) or
      `a^T (c d)` over clients (a combination of their gradients).
    params: the primitive's params.
    kernel_shape: the kernel's shape (its layout is `rhs_spec`).

  Returns:
    array of `kernel_shape`: entry `[o, cg, k...]` (in `rhs_spec` order) is
    `w[o // Og, k * Cg + cg, o % Og]`.
  """
  rhs = dimension_numbers_of(params, len(kernel_shape)).rhs_spec
  g = params.get("feature_group_count", 1)
  o, cg = kernel_shape[rhs[0]], kernel_shape[rhs[1]]
  filter_spatial = tuple(kernel_shape[i] for i in rhs[2:])
  n = len(filter_spatial)
  # [G, k..., Cg, Og] -> [k..., Cg, G, Og] -> [k..., Cg, O].
  w = w.reshape((g,) + filter_spatial + (cg, o // g))
  if g > 1:
    w = jnp.moveaxis(w, 0, n + 1)
  w = w.reshape(filter_spatial + (cg, o))
  # Axis rhs[0] of the kernel is O (axis n + 1 here), rhs[1] is I (n), and
  # rhs[2 + i] is spatial axis i.
  src = {rhs[0]: n + 1, rhs[1]: n}
  src.update({rhs[2 + i]: i for i in range(n)})
  return jnp.transpose(w, [src[axis] for axis in range(n + 2)])


def out_spatial_size(params: Params, in_spatial: Sequence[int],
                     filter_spatial: Sequence[int]) -> Tuple[int, ...]:
  """The output's spatial sizes, in the order of the spatial dimensions."""
  pads = explicit_padding(params, in_spatial, filter_spatial)
  out = []
  for s, k, (lo, hi), ld, rd, st in zip(
      in_spatial, filter_spatial, pads, params["lhs_dilation"],
      params["rhs_dilation"], params["window_strides"]):
    size = (s - 1) * ld + 1 + lo + hi - ((k - 1) * rd + 1)
    out.append(max(0, size // st + 1))
  return tuple(out)


def _hashable(params: Params) -> dict:
  """The params this rule reads, as hashable values."""
  return dict(
      window_strides=tuple(int(s) for s in params["window_strides"]),
      padding=(params["padding"] if isinstance(params["padding"], str) else
               tuple((int(lo), int(hi)) for lo, hi in params["padding"])),
      lhs_dilation=tuple(int(s) for s in params["lhs_dilation"]),
      rhs_dilation=tuple(int(s) for s in params["rhs_dilation"]),
      dimension_numbers=params["dimension_numbers"],
      feature_group_count=int(params.get("feature_group_count", 1)),
      batch_group_count=int(params.get("batch_group_count", 1)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConvLayer(rules.Layer):
  """A `conv_general_dilated` whose kernel (operand 1) is the parameter."""
  window_strides: Tuple[int, ...]
  padding: Any  # ((low, high), ...) or "SAME" / "VALID".
  lhs_dilation: Tuple[int, ...]
  rhs_dilation: Tuple[int, ...]
  dimension_numbers: lax.ConvDimensionNumbers
  feature_group_count: int
  batch_group_count: int
  kernel_shape: Tuple[int, ...]
  kernel_dtype: str

  @property
  def params(self) -> dict:
    return dict(window_strides=self.window_strides, padding=self.padding,
                lhs_dilation=self.lhs_dilation, rhs_dilation=self.rhs_dilation,
                dimension_numbers=self.dimension_numbers,
                feature_group_count=self.feature_group_count,
                batch_group_count=self.batch_group_count)

  def tokens(self, x, dy):
    """`(a [G, M, p], d [G, M, q])` of one client (see module `tokens`)."""
    return tokens(x, dy, self.params, self.kernel_shape)

  def fold(self, w):
    """`w [G, p, q]` -> kernel-shaped array (see module `fold`)."""
    return fold(w, self.params, self.kernel_shape).astype(self.kernel_dtype)

  def fold_key(self):
    # fold reads only the kernel's layout, groups and dtype.
    return (ConvLayer, self.groups, self.p, self.q, self.kernel_shape,
            self.dimension_numbers.rhs_spec, self.kernel_dtype)


def match(params: dict, in_avals: tuple,
          weight_index: int) -> Optional[ConvLayer]:
  """`ConvLayer` for a convolution whose kernel is the parameter, else None.

  Args:
    params: the equation's params (`eqn.params`).
    in_avals: `(x, kernel)` abstract values for ONE client.
    weight_index: the parameter's operand; only 1 (the kernel) is supported.

  Returns:
    a `ConvLayer`, or None for a parameter input (`weight_index` 0) or
    `batch_group_count > 1` (then the parameter is materialised by autodiff).
  """
  if weight_index != 1 or params.get("batch_group_count", 1) != 1:
    return None
  x_aval, w_aval = in_avals
  hashable = _hashable(params)
  lhs, rhs, out = dimension_numbers_of(hashable, x_aval.ndim)
  hashable["dimension_numbers"] = lax.ConvDimensionNumbers(lhs, rhs, out)
  out_aval = jax.eval_shape(
      lambda x, w: lax.conv_general_dilated(
          x, w, hashable["window_strides"], hashable["padding"],
          hashable["lhs_dilation"], hashable["rhs_dilation"],
          hashable["dimension_numbers"], hashable["feature_group_count"]),
      x_aval, w_aval)
  g = hashable["feature_group_count"]
  k = math.prod(w_aval.shape[i] for i in rhs[2:])
  return ConvLayer(
      groups=g, p=k * w_aval.shape[rhs[1]], q=w_aval.shape[rhs[0]] // g,
      tokens_per_call=math.prod(out_aval.shape[i] for i in (out[0],) +
                                tuple(out[2:])),
      feature_dims=(out[1],), kernel_shape=tuple(w_aval.shape),
      kernel_dtype=jnp.dtype(w_aval.dtype).name, **hashable)


rules.register_rule(lax.conv_general_dilated_p, match)
