"""XLA:CPU convolutions for the ghost kernel's interpreter (`interpret`).

Two of XLA:CPU's convolution paths are slow in the shapes of the engine's
rounds, and the interpreter runs these replacements in their place (same
values, same gradients; `rules.register_replacement`):

* The input gradient. JAX transposes a convolution into one with the kernel
  reversed and its input and output features swapped in the dimension
  numbers (`01oi`). Inside the engine's map over models, where the kernel is
  a slice of the stacked params, XLA:CPU runs that convolution with its
  generic loop: in the small Flax CNN of `benchmarks/bench_models.py`
  (conv 16 -> 32 on 14x14 maps, 128 images) it took 116 ms of CPU time per
  model against 4.9 ms for the same convolution with the reversed kernel
  transposed to `HWIO` in memory first (`benchmarks/README.md`).
  `conv_with_fast_grads` differentiates the input that way.
* Inputs smaller than the kernel, such as the 2x2 maps of a CIFAR VGG's last
  block (`slow_on_xla_cpu`), and inputs with few features, such as an
  image's 1 or 3 channels in a first layer (`thin_input`):
  `conv_by_patches`, one GEMM on the patches.

The interpreter gets a recognised layer's weight gradient from its tokens
(`kernels.ghost`); a convolution weight left to plain autodiff of
`conv_with_fast_grads` gets `weight_gradient`, the same tokens' GEMM (XLA:CPU
runs JAX's own rule, a convolution with batch and features swapped, 2-3x
slower).
"""

import math
from typing import Any, Mapping, Sequence

import jax
from jax import lax
import jax.numpy as jnp

from prfl_jax.kernels import conv
from prfl_jax.kernels import rules

Params = Mapping[str, Any]


def slow_on_xla_cpu(params: Params, x_shape: Sequence[int],
                    kernel_shape: Sequence[int]) -> bool:
  """Whether XLA:CPU's convolution is the slow kind for these shapes.

  XLA:CPU runs a convolution whose (dilated) input is smaller than its
  (dilated) kernel in some spatial dimension, e.g. a 3x3 SAME convolution of
  a 2x2 or 1x1 feature map (the last block of a CIFAR VGG), with a generic
  loop: measured 2.2 s for 2.4 GFLOP (128 x 2x2x512 -> 512), against 26 ms
  for `conv_by_patches` (and 85x for the input gradient). Larger inputs go
  to its fast convolution, which beats `conv_by_patches`.

  Args:
    params: the primitive's params.
    x_shape: the input's shape.
    kernel_shape: the kernel's shape.
  """
  lhs, rhs, _ = conv.dimension_numbers_of(params, len(x_shape))
  for i, (a, b) in enumerate(zip(lhs[2:], rhs[2:])):
    dilated_in = (x_shape[a] - 1) * params["lhs_dilation"][i] + 1
    dilated_k = (kernel_shape[b] - 1) * params["rhs_dilation"][i] + 1
    if dilated_in < dilated_k:
      return True
  return False


# Most input features per group for which `conv_by_patches` replaces
# XLA:CPU's own convolution (`thin_input`).
THIN_FEATURES = 4


def thin_input(params: Params, kernel_shape: Sequence[int]) -> bool:
  """Whether the convolution has at most `THIN_FEATURES` input features per
  group, where XLA:CPU's convolution is slower than `conv_by_patches`.

  CPU time of 8 models in a `lax.map` as the engine runs them, 3x3 SAME
  kernels, 128 images, XLA against patches (`benchmarks/bench_conv_cpu.py`
  on 2 loaded cores): forward pass (a first layer) 1 -> 16 on 28x28 maps
  74 / 7 ms, 3 -> 64 on 32x32 87 / 70 ms, 4 -> 16 83 / 20 ms, but 8 -> 16
  66 / 56 ms and 16 -> 32 on 14x14 43 / 54 ms; with the input gradient (a
  later layer) 1 -> 16 158 / 54 ms, 4 -> 16 186 / 86 ms, 3 -> 64 315 /
  333 ms, 8 -> 16 142 / 196 ms, 16 -> 32 66 / 128 ms.

  Args:
    params: the primitive's params.
    kernel_shape: the kernel's shape.
  """
  _, rhs, _ = conv.dimension_numbers_of(params, len(kernel_shape))
  return kernel_shape[rhs[1]] <= THIN_FEATURES


def conv_by_patches(x: jax.Array, w: jax.Array, params: Params) -> jax.Array:
  """`conv_general_dilated(x, w, **params)` as patches times the kernel.

  The same convolution (up to float summation order) as one GEMM per feature
  group on the patches of `tokens`; its gradients (by autodiff: a GEMM and the
  transposes of strided slices) avoid XLA:CPU's slow convolutions (see
  `slow_on_xla_cpu`).

  Args:
    x: the input, layout per `params["dimension_numbers"]`.
    w: the kernel, layout per `params["dimension_numbers"]`.
    params: the primitive's params (`precision` and `preferred_element_type`
      are honoured when present).

  Returns:
    the output, in its layout.

  Raises:
    ValueError: for `batch_group_count > 1` (not supported).
  """
  if params.get("batch_group_count", 1) != 1:
    raise ValueError("conv_by_patches needs batch_group_count == 1, got "
                     f"{params['batch_group_count']}.")
  lhs, rhs, out = conv.dimension_numbers_of(params, x.ndim)
  g = params.get("feature_group_count", 1)
  filter_spatial = [w.shape[i] for i in rhs[2:]]
  n = len(filter_spatial)
  in_spatial = [x.shape[i] for i in lhs[2:]]
  out_spatial = conv.out_spatial_size(params, in_spatial, filter_spatial)
  a = conv.patches(x, filter_spatial, out_spatial, params)  # [B, T.., K * C]
  k = math.prod(filter_spatial)
  o, cg = w.shape[rhs[0]], w.shape[rhs[1]]
  wc = jnp.transpose(w, tuple(rhs[2:]) + (rhs[1], rhs[0]))  # [k.., Cg, O]
  kwargs = dict(precision=params.get("precision"),
                preferred_element_type=params.get("preferred_element_type"))
  if g == 1:
    y = jnp.matmul(a, wc.reshape(k * cg, o), **kwargs)
  else:
    a = a.reshape(a.shape[:-1] + (k, g, cg))
    y = jnp.einsum("...kgc,kcgo->...go", a, wc.reshape(k, cg, g, o // g),
                   **kwargs)
    y = y.reshape(y.shape[:-2] + (o,))
  # y is (N, spatial.., O); axis out[0] of the result is N, out[1] is O.
  src = {out[0]: 0, out[1]: n + 1}
  src.update({out[2 + i]: 1 + i for i in range(n)})
  return jnp.transpose(y, [src[axis] for axis in range(n + 2)])


def _conv(x: jax.Array, w: jax.Array, params: Params) -> jax.Array:
  """`lax.conv_general_dilated` with a primitive's params."""
  return lax.conv_general_dilated(
      x, w, window_strides=params["window_strides"],
      padding=params["padding"], lhs_dilation=params["lhs_dilation"],
      rhs_dilation=params["rhs_dilation"],
      dimension_numbers=params["dimension_numbers"],
      feature_group_count=params.get("feature_group_count", 1),
      batch_group_count=params.get("batch_group_count", 1),
      precision=params.get("precision"),
      preferred_element_type=params.get("preferred_element_type"))


def transpose_input(dy: jax.Array, w: jax.Array, params: Params,
                    x_aval) -> jax.Array:
  """The input gradient of `conv_general_dilated(x, w, **params)` for `dy`.

  JAX's transpose rule (a convolution of `dy` with the reversed kernel,
  input and output features swapped), with the reversed kernel laid out as
  `[spatial..., in, out]` in memory and plain dimension numbers, which
  XLA:CPU runs with its fast convolution. One feature group only.

  Args:
    dy: the cotangent of the output.
    w: the kernel.
    params: the primitive's params (`feature_group_count` 1).
    x_aval: the input's shape and dtype.
  """
  lhs, rhs, out = conv.dimension_numbers_of(params, len(x_aval.shape))
  n = len(rhs) - 2
  filter_spatial = [w.shape[i] for i in rhs[2:]]
  in_spatial = [x_aval.shape[i] for i in lhs[2:]]
  out_spatial = [dy.shape[i] for i in out[2:]]
  pads = conv.explicit_padding(params, in_spatial, filter_spatial)
  before, after = [], []
  for s, k, (lo, _), o, ld, rd, st in zip(
      in_spatial, filter_spatial, pads, out_spatial, params["lhs_dilation"],
      params["rhs_dilation"], params["window_strides"]):
    dilated_in, dilated_k = (s - 1) * ld + 1, (k - 1) * rd + 1
    before.append(dilated_k - lo - 1)
    after.append(dilated_in + dilated_k - 1 - ((o - 1) * st + 1) -
                 before[-1])
  # Reversed kernel as [spatial..., O, I]: its "input" features are the
  # convolution's outputs.
  wt = jnp.transpose(lax.rev(w, tuple(rhs[2:])),
                     tuple(rhs[2:]) + (rhs[0], rhs[1])).astype(dy.dtype)
  dn = lax.ConvDimensionNumbers(out, (n + 1, n) + tuple(range(n)), lhs)
  dx = lax.conv_general_dilated(
      dy, wt, window_strides=params["lhs_dilation"],
      padding=tuple(zip(before, after)),
      lhs_dilation=params["window_strides"],
      rhs_dilation=params["rhs_dilation"], dimension_numbers=dn,
      precision=params.get("precision"),
      preferred_element_type=params.get("preferred_element_type"))
  return dx.astype(x_aval.dtype)


def weight_gradient(x: jax.Array, dy: jax.Array, params: Params,
                    kernel_shape) -> jax.Array:
  """The kernel gradient of `conv_general_dilated(x, w, **params)` for `dy`.

  One GEMM per feature group, patches^T times cotangents (`conv.tokens`,
  folded back to the kernel's layout). JAX's own rule is a convolution
  with the batch and feature axes swapped, which XLA:CPU runs 2-3x slower:
  for pfl's CIFAR CNN (10 images, 3x3 conv 32 -> 64 on 30x30 maps) 36 ms
  of CPU time against 13-19 ms (`benchmarks/README.md`, peers section).
  """
  a, d = conv.tokens(x, dy, params, kernel_shape)
  kwargs = dict(precision=params.get("precision"),
                preferred_element_type=params.get("preferred_element_type"))
  return conv.fold(jnp.einsum("gmp,gmq->gpq", a, d, **kwargs), params,
                   kernel_shape)


def conv_with_fast_grads(x: jax.Array, w: jax.Array,
                         params: Params) -> jax.Array:
  """`conv_general_dilated(x, w, **params)`, input gradient by
  `transpose_input`, kernel gradient by `weight_gradient` (one feature
  group, one batch group)."""

  @jax.custom_vjp
  def f(x, w):
    return _conv(x, w, params)

  def fwd(x, w):
    return _conv(x, w, params), (x, w)

  def bwd(res, dy):
    x, w = res
    dw = weight_gradient(x, dy, params, w.shape).astype(w.dtype)
    return transpose_input(dy, w, params, x), dw

  f.defvjp(fwd, bwd)
  return f(x, w)


def _replaces(params: Params, avals: tuple) -> bool:
  """On XLA:CPU, every convolution with one feature and one batch group, and
  those `slow_on_xla_cpu` with several feature groups."""
  return (jax.default_backend() == "cpu" and
          params.get("batch_group_count", 1) == 1 and
          (params.get("feature_group_count", 1) == 1 or
           slow_on_xla_cpu(params, avals[0].shape, avals[1].shape)))


def _replacement(params: Params, x: jax.Array, w: jax.Array) -> jax.Array:
  if (slow_on_xla_cpu(params, x.shape, w.shape) or
      params.get("feature_group_count", 1) == 1 and thin_input(params,
                                                               w.shape)):
    return conv_by_patches(x, w, params)
  return conv_with_fast_grads(x, w, params)


rules.register_replacement(lax.conv_general_dilated_p, _replaces,
                           _replacement)
