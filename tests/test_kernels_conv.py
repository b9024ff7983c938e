"""Tests of the convolution rule (`prfl_jax.kernels.conv`).

Mutations that these tests were seen to catch (each made once, then undone):
  * taps cut in reverse order in `conv.patches` (`np.ndindex` reversed):
    `test_fold_of_tokens_is_the_kernel_gradient`, `test_patches_match_lax`
    and the Gram tests fail;
  * `fold` without `jnp.moveaxis` of the groups (groups mixed with taps):
    the grouped and depthwise cases of the first test fail;
  * the window strides left out of the slices: the strided cases fail;
  * `match` accepting `batch_group_count = 2`: `test_match_declines` fails;
  * `conv_by_patches` splitting the output features as (Og, G) instead of
    (G, Og): its grouped and depthwise cases fail;
  * `conv_by_patches` with the kernel's spatial axes swapped:
    `test_engine_ghost_centres_equal_gram_on_a_flax_cnn` fails (the engine
    runs it in place of the 2x2-map convolution);
  * `conv_cpu.transpose_input` without `lax.rev` of the kernel, or with its
    input and output features left unswapped, or padding after the input by
    one less: `test_fast_input_gradient_is_the_convolutions` fails;
  * `conv_cpu.weight_gradient` with the patch features reversed
    (`a[:, ::-1]`): `test_fast_input_gradient_is_the_convolutions` fails
    (its kernel gradient).
"""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from prfl_jax.kernels import conv
from prfl_jax.kernels import conv_cpu
from tests import tolerances

# name: (x shape, kernel shape, conv_general_dilated keyword arguments).
CASES = {
    "nhwc_same": ((2, 6, 5, 3), (3, 3, 3, 4), dict(
        window_strides=(1, 1), padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "nhwc_valid_stride": ((2, 7, 8, 2), (3, 2, 2, 3), dict(
        window_strides=(2, 3), padding="VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "nchw_explicit": ((2, 3, 6, 5), (4, 3, 2, 3), dict(
        window_strides=(1, 2), padding=((2, 0), (1, 3)),
        dimension_numbers=("NCHW", "OIHW", "NCHW"))),
    "negative_padding": ((1, 2, 7, 6), (2, 2, 3, 2), dict(
        window_strides=(1, 1), padding=((-1, 2), (0, -1)),
        dimension_numbers=("NCHW", "OIHW", "NCHW"))),
    "lhs_rhs_dilation": ((2, 5, 6, 2), (2, 3, 2, 3), dict(
        window_strides=(2, 1), padding=((1, 2), (0, 1)), lhs_dilation=(2, 1),
        rhs_dilation=(1, 2), dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "groups": ((2, 6, 6, 4), (3, 3, 2, 6), dict(
        window_strides=(1, 1), padding="SAME", feature_group_count=2,
        dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "depthwise_nchw": ((2, 3, 7, 6), (6, 1, 3, 3), dict(
        window_strides=(2, 2), padding="SAME", rhs_dilation=(2, 1),
        feature_group_count=3, dimension_numbers=("NCHW", "OIHW", "NCHW"))),
    "mixed_layouts": ((2, 5, 3, 6), (4, 3, 2, 3), dict(
        window_strides=(1, 2), padding="SAME",
        dimension_numbers=("NWCH", "OHWI", "NCWH"))),
    "1d_nwc": ((3, 11, 2), (3, 2, 4), dict(
        window_strides=(2,), padding="SAME", rhs_dilation=(2,),
        dimension_numbers=("NWC", "WIO", "NWC"))),
    "1d_nch_groups_lhs_dilation": ((2, 4, 9), (6, 2, 3), dict(
        window_strides=(1,), padding=((2, 1),), lhs_dilation=(3,),
        feature_group_count=2, dimension_numbers=("NCH", "OIH", "NCH"))),
    "3d_ndhwc": ((1, 4, 5, 3, 2), (2, 3, 2, 2, 3), dict(
        window_strides=(1, 2, 1), padding="VALID",
        dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))),
}


def _normal(seed, shape):
  """Standard normal float32 from NumPy (no XLA compile per shape)."""
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv(x, w, kwargs):
  return lax.conv_general_dilated(x, w, precision=lax.Precision.HIGHEST,
                                  **kwargs)


def _layer(x, w, kwargs) -> conv.ConvLayer:
  """The rule's `match` on the jaxpr's conv equation, as the engine calls it."""
  jaxpr = jax.make_jaxpr(lambda x, w: _conv(x, w, kwargs))(x, w)
  (eqn,) = [e for e in jaxpr.jaxpr.eqns
            if e.primitive is lax.conv_general_dilated_p]
  layer = conv.match(eqn.params, tuple(v.aval for v in eqn.invars), 1)
  assert isinstance(layer, conv.ConvLayer)
  return layer


def _on_cpu(fn, *args):
  """`jax.jit(fn)(*args)` on the CPU, as NumPy arrays: the references.

  On an H100 (jax 0.11.2) cuDNN has no algorithm for the input gradient of
  the 1-D grouped lhs-dilated case (CUDNN_STATUS_BAD_PARAM), so
  `conv_general_dilated`'s own vjp fails there; XLA:CPU computes it.
  """
  with jax.default_device(jax.devices("cpu")[0]):
    return jax.device_get(jax.jit(fn)(*args))


def _ata(a, d):
  return jnp.einsum("gmp,gmq->gpq", a, d, precision=lax.Precision.HIGHEST)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fold_of_tokens_is_the_kernel_gradient(name):
  """`fold(a^T d)` == the kernel's vjp; `feature_dims` holds the bias features.

  Also: the layer's sizes fit the tokens and the kernel, and summing `d` over
  tokens gives the gradient of a bias on the `feature_dims` axis.
  """
  x_shape, w_shape, kwargs = CASES[name]
  x, w = _normal(0, x_shape), _normal(1, w_shape)
  layer = _layer(x, w, kwargs)
  (axis,) = layer.feature_dims

  y_shape = jax.eval_shape(lambda: _conv(x, w, kwargs)).shape
  dy = _normal(2, y_shape)

  def reference(x, w, dy):
    _, vjp = jax.vjp(lambda w: _conv(x, w, kwargs), w)
    return vjp(dy)[0]

  @jax.jit
  def run(x, dy):
    a, d = layer.tokens(x, dy)
    bias_grad = jnp.sum(dy, axis=tuple(i for i in range(dy.ndim)
                                       if i != axis))
    return (a, d, layer.fold(_ata(a, d)), jnp.sum(d, axis=1).reshape(-1),
            bias_grad)

  a, d, got, d_sum, bias_grad = run(x, dy)
  want = _on_cpu(reference, x, w, dy)
  y_size = np.prod(y_shape)
  g = layer.groups
  assert g == kwargs.get("feature_group_count", 1)
  assert a.shape == (g, layer.tokens_per_call, layer.p)
  assert d.shape == (g, layer.tokens_per_call, layer.q)
  assert layer.tokens_per_call * g * layer.q == y_size
  assert g * layer.p * layer.q == w.size
  assert got.shape == w.shape and got.dtype == w.dtype
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_sum, bias_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["nhwc_same", "nhwc_valid_stride",
                                  "lhs_rhs_dilation", "1d_nwc", "3d_ndhwc",
                                  "nchw_explicit"])
def test_patches_match_lax(name):
  """`patches` == `lax.conv_general_dilated_patches` up to the documented order.

  Ours are tap-major `(k..., c)`, lax's channel-major `(c, k...)`.
  """
  x_shape, w_shape, kwargs = CASES[name]
  x, w = _normal(0, x_shape), _normal(1, w_shape)
  layer = _layer(x, w, kwargs)
  dn = layer.dimension_numbers
  y = jax.eval_shape(lambda: _conv(x, w, kwargs))
  filter_spatial = [w.shape[i] for i in dn.rhs_spec[2:]]
  out_spatial = [y.shape[i] for i in dn.out_spec[2:]]
  n = len(filter_spatial)

  @jax.jit
  def run(x):
    ours = conv.patches(x, filter_spatial, out_spatial, layer.params)
    # Canonical layouts (N, C, spatial...) for lax, spatial dims in order.
    x_nc = jnp.transpose(x, dn.lhs_spec)
    canon = lax.conv_dimension_numbers(
        x_nc.shape, (1, 1) + tuple(filter_spatial), None)
    theirs = lax.conv_general_dilated_patches(
        x_nc, filter_spatial, layer.window_strides, layer.padding,
        layer.lhs_dilation, layer.rhs_dilation, canon,
        precision=lax.Precision.HIGHEST)  # [B, C * K, T...]
    c = x_nc.shape[1]
    theirs = jnp.moveaxis(theirs, 1, -1).reshape(
        theirs.shape[:1] + theirs.shape[2:] + (c, -1))
    return ours, jnp.swapaxes(theirs, -1, -2).reshape(ours.shape)

  ours, theirs = run(x)
  assert ours.shape[1:1 + n] == tuple(out_spatial)
  np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def _numpy_conv_grads(x, dy, w_shape, stride, pad, lhs_dil, rhs_dil, groups):
  """Kernel and bias gradients of an NHWC / HWIO conv by loops (float64)."""
  x = np.asarray(x, np.float64)
  dy = np.asarray(dy, np.float64)
  b, h, wd, c = x.shape
  kh, kw, cg, o = w_shape
  # Dilate, then pad (negative padding crops).
  xd = np.zeros((b, (h - 1) * lhs_dil[0] + 1, (wd - 1) * lhs_dil[1] + 1, c))
  xd[:, ::lhs_dil[0], ::lhs_dil[1]] = x
  (t, bot), (l, r) = pad
  xp = np.zeros((b, xd.shape[1] + t + bot, xd.shape[2] + l + r, c))
  xp[:, t:t + xd.shape[1], l:l + xd.shape[2]] = xd
  og = o // groups
  dw = np.zeros(w_shape)
  for i in range(kh):
    for j in range(kw):
      for th in range(dy.shape[1]):
        for tw in range(dy.shape[2]):
          row = th * stride[0] + i * rhs_dil[0]
          col = tw * stride[1] + j * rhs_dil[1]
          for g in range(groups):
            patch = xp[:, row, col, g * cg:(g + 1) * cg]  # [B, Cg]
            dw[i, j, :, g * og:(g + 1) * og] += (
                patch.T @ dy[:, th, tw, g * og:(g + 1) * og])
  return dw, dy.sum(axis=(0, 1, 2))


GRAM_CASES = {
    "plain": (dict(window_strides=(1, 1), padding=((1, 1), (1, 1))), 1, (1, 1),
              (1, 1)),
    "strided_dilated_groups": (dict(window_strides=(2, 1),
                                    padding=((0, 1), (2, 1)),
                                    lhs_dilation=(1, 2), rhs_dilation=(2, 1),
                                    feature_group_count=2), 2, (1, 2), (2, 1)),
}


@pytest.mark.parametrize("name", sorted(GRAM_CASES))
def test_ghost_gram_equals_materialised_and_numpy(name):
  """(2) with the bias equals the Gram of per-client (kernel, bias) gradients.

  Three clients, each with its own batch at one model: the materialised
  gradients come from `jax.grad` of a conv + bias + tanh loss, and from loops
  in NumPy (float64) on the same cotangents; the centre `fold(a^T (c d))`
  equals `sum_j c_j dw_j`.
  """
  kwargs, groups, lhs_dil, rhs_dil = GRAM_CASES[name]
  kwargs = dict(kwargs, dimension_numbers=("NHWC", "HWIO", "NHWC"))
  n, c, o = 3, 4, 6
  w = _normal(0, (3, 2, c // groups, o))
  bias = _normal(1, (o,))
  xs = _normal(2, (n, 2, 6, 5, c))
  targets = _normal(3, (n,) + jax.eval_shape(
      lambda: _conv(xs[0], w, kwargs)).shape)

  def loss(params, x, target):
    y = _conv(x, params["w"], kwargs) + params["b"]
    return 0.5 * jnp.sum((jnp.tanh(y) - target) ** 2)

  layer = _layer(xs[0], w, kwargs)
  coefs = jnp.array([0.5, -1.0, 2.0])

  @jax.jit
  def run(w, bias, xs, targets):
    params = {"w": w, "b": bias}
    grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, xs,
                                                            targets)
    # Output cotangents of each client, as the engine's taps give them.
    def dy_of(x, target):
      return jax.grad(lambda y: 0.5 * jnp.sum(
          (jnp.tanh(y + bias) - target) ** 2))(_conv(x, w, kwargs))
    dys = jax.vmap(dy_of)(xs, targets)
    a, d = jax.vmap(layer.tokens)(xs, dys)  # [N, G, M, p], [N, G, M, q]
    ka = jnp.einsum("igmp,jghp->ijgmh", a, a,
                    precision=lax.Precision.HIGHEST) + 1.0
    kd = jnp.einsum("igmq,jghq->ijgmh", d, d, precision=lax.Precision.HIGHEST)
    gram = jnp.sum(ka * kd, axis=(2, 3, 4))
    folded = jax.vmap(lambda a, d: layer.fold(_ata(a, d)))(a, d)
    a_all = jnp.concatenate(list(a), axis=1)
    d_all = jnp.concatenate(list(coefs[:, None, None, None] * d), axis=1)
    return grads, dys, gram, folded, layer.fold(_ata(a_all, d_all))

  grads, dys, gram, folded, centre = run(w, bias, xs, targets)
  flat = np.concatenate([np.reshape(grads["w"], (n, -1)), grads["b"]], axis=1)
  flat = flat.astype(np.float64)
  np.testing.assert_allclose(gram, flat @ flat.T, rtol=1e-4)
  flat_np = []
  for j in range(n):
    dw_np, db_np = _numpy_conv_grads(xs[j], dys[j], w.shape,
                                     kwargs["window_strides"], layer.padding,
                                     lhs_dil, rhs_dil, groups)
    np.testing.assert_allclose(grads["w"][j], dw_np, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads["b"][j], db_np, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(folded[j], dw_np, rtol=1e-4, atol=1e-4)
    flat_np.append(np.concatenate([dw_np.reshape(-1), db_np]))
  flat_np = np.stack(flat_np)
  np.testing.assert_allclose(gram, flat_np @ flat_np.T, rtol=1e-4)
  np.testing.assert_allclose(centre, jnp.tensordot(coefs, grads["w"], 1),
                             rtol=1e-4, atol=1e-4)


def test_tokens_under_jit_and_vmap():
  """`tokens` works under jit and a vmap over clients, as the engine uses it."""
  x_shape, w_shape, kwargs = CASES["groups"]
  xs, w = _normal(0, (3,) + x_shape), _normal(1, w_shape)
  layer = _layer(xs[0], w, kwargs)
  dys = _normal(2, (3,) + jax.eval_shape(lambda: _conv(xs[0], w, kwargs)).shape)
  a, d = jax.jit(jax.vmap(layer.tokens))(xs, dys)
  one = jax.jit(layer.tokens)
  for j in range(3):
    a_j, d_j = one(xs[j], dys[j])
    np.testing.assert_allclose(a[j], a_j)
    np.testing.assert_allclose(d[j], d_j)


def test_match_declines_what_it_does_not_support():
  """A parameter input (operand 0) or batch_group_count > 1 gives None."""
  x, w = _normal(0, (4, 5, 5, 2)), _normal(1, (3, 3, 2, 4))
  kwargs = dict(window_strides=(1, 1), padding="SAME",
                dimension_numbers=("NHWC", "HWIO", "NHWC"))
  layer = _layer(x, w, kwargs)
  avals = (jax.ShapeDtypeStruct(x.shape, x.dtype),
           jax.ShapeDtypeStruct(w.shape, w.dtype))
  params = dict(layer.params, precision=None, preferred_element_type=None)
  assert conv.match(params, avals, 0) is None
  grouped = dict(params, batch_group_count=2)
  assert conv.match(grouped, avals, 1) is None
  assert hash(layer) == hash(_layer(x, w, kwargs))


@pytest.mark.parametrize("name", ["depthwise_nchw", "1d_nwc", "nhwc_same"])
def test_conv_params_resolves_string_padding_like_lax(name):
  """`conv_params` with "SAME" / "VALID" gives the kernel's vjp too."""
  x_shape, w_shape, kwargs = CASES[name]
  x, w = _normal(0, x_shape), _normal(1, w_shape)
  for padding in ("SAME", "VALID"):
    kw = dict(kwargs, padding=padding)
    params = conv.conv_params(x.ndim, **kw)

    @jax.jit
    def run(x, w, kw=kw, params=params):
      y, vjp = jax.vjp(lambda w: _conv(x, w, kw), w)
      dy = _normal(2, y.shape)
      a, d = conv.tokens(x, dy, params, w.shape)
      return conv.fold(_ata(a, d), params, w.shape), vjp(dy)[0]

    got, want = run(x, w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_string_padding_with_lhs_dilation_raises():
  """As in lax, "SAME" with lhs (transposed) dilation is ambiguous: an error."""
  x_shape, w_shape, kwargs = CASES["lhs_rhs_dilation"]
  params = conv.conv_params(len(x_shape), **dict(kwargs, padding="SAME"))
  with pytest.raises(ValueError, match="lhs_dilation"):
    conv.tokens(_normal(0, x_shape), _normal(1, (2, 10, 3, 3)), params,
                w_shape)


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_by_patches_is_the_convolution(name):
  """Same output and input and kernel vjps as `conv_general_dilated`."""
  x_shape, w_shape, kwargs = CASES[name]
  x, w = _normal(0, x_shape), _normal(1, w_shape)
  params = dict(_layer(x, w, kwargs).params, precision=lax.Precision.HIGHEST)

  dy = _normal(2, jax.eval_shape(lambda: _conv(x, w, kwargs)).shape)

  def reference(x, w, dy):
    y, vjp = jax.vjp(lambda x, w: _conv(x, w, kwargs), x, w)
    return y, vjp(dy)

  @jax.jit
  def run(x, w, dy):
    ours, our_vjp = jax.vjp(
        lambda x, w: conv_cpu.conv_by_patches(x, w, params), x, w)
    return ours, our_vjp(dy)

  ours, our_grads = run(x, w, dy)
  y, grads = _on_cpu(reference, x, w, dy)
  np.testing.assert_allclose(ours, y, rtol=1e-5, atol=1e-5)
  for got, want in zip(our_grads, grads):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


ONE_GROUP = sorted(k for k, (_, _, kw) in CASES.items()
                   if kw.get("feature_group_count", 1) == 1)


@pytest.mark.parametrize("name", ONE_GROUP)
def test_fast_input_gradient_is_the_convolutions(name):
  """`conv_with_fast_grads` has the convolution's output and both vjps, for
  every layout, stride, dilation and padding (one feature group)."""
  x_shape, w_shape, kwargs = CASES[name]
  x, w = _normal(0, x_shape), _normal(1, w_shape)
  params = dict(_layer(x, w, kwargs).params, precision=lax.Precision.HIGHEST,
                preferred_element_type=None)
  dy = _normal(2, jax.eval_shape(lambda: _conv(x, w, kwargs)).shape)

  @jax.jit
  def run(x, w, dy):
    ours, our_vjp = jax.vjp(
        lambda x, w: conv_cpu.conv_with_fast_grads(x, w, params), x, w)
    return ours, our_vjp(dy)

  ours, our_grads = run(x, w, dy)
  y, grads = _on_cpu(lambda x, w, dy: (lambda y, vjp: (y, vjp(dy)))(
      *jax.vjp(lambda x, w: _conv(x, w, kwargs), x, w)), x, w, dy)
  np.testing.assert_allclose(ours, y, rtol=1e-5, atol=1e-5)
  for got, want in zip(our_grads, grads):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_slow_on_xla_cpu_flags_inputs_smaller_than_the_kernel():
  """A 3x3 kernel on 2x2 or 1x1 maps is flagged; 3x3 maps are not."""
  def flag(x_shape, w_shape, **kwargs):
    kwargs = dict(dict(window_strides=(1, 1), padding="SAME",
                       dimension_numbers=("NHWC", "HWIO", "NHWC")), **kwargs)
    params = conv.conv_params(len(x_shape), **kwargs)
    return conv_cpu.slow_on_xla_cpu(params, x_shape, w_shape)

  assert flag((4, 2, 2, 8), (3, 3, 8, 8))
  assert flag((4, 1, 1, 8), (3, 3, 8, 8))
  assert flag((4, 5, 2, 8), (3, 3, 8, 8))
  assert not flag((4, 3, 3, 8), (3, 3, 8, 8))
  assert flag((4, 3, 3, 8), (3, 3, 8, 8), rhs_dilation=(2, 1))
  assert not flag((4, 2, 2, 8), (3, 3, 8, 8), lhs_dilation=(2, 2),
                  padding=((1, 1), (1, 1)))
  assert flag((4, 8, 2, 2), (8, 8, 3, 3), dimension_numbers=("NCHW", "OIHW",
                                                              "NCHW"))


def test_engine_ghost_centres_equal_gram_on_a_flax_cnn():
  """Through the engine: a Flax CNN's ghost-kernel centres equal the Gram's.

  The second convolution sees 2x2 maps, so the interpreter runs it by
  `conv_by_patches` (registered replacement) and the pools by
  `kernels.pool`; the Gram kernel differentiates the plain loss.
  """
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import prfl_jax as prfl  # pylint: disable=g-import-not-at-top
  from prfl_jax.kernels import rules  # pylint: disable=g-import-not-at-top

  class Net(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = nn.max_pool(nn.relu(nn.Conv(4, (3, 3))(x)), (2, 2), (2, 2))
      x = nn.relu(nn.Conv(5, (3, 3))(x))
      return nn.Dense(3)(x.reshape(x.shape[0], -1))

  net = Net()

  def loss(params, batch):
    x, y = batch
    logits = net.apply(params, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits),
                                         y[:, None], 1))

  n = 3
  params = jax.vmap(lambda k: net.init(k, jnp.zeros((1, 4, 4, 2))))(
      jax.random.split(jax.random.key(0), n))
  batch = (_normal(1, (n, 2, 4, 4, 2)),
           np.random.default_rng(2).integers(0, 3, (n, 2)).astype(np.int32))
  # The second convolution's equation (2x2 maps, 3x3 kernel) is replaced on
  # CPU (XLA:CPU's slow convolutions only; an accelerator runs it as it is).
  layer = _layer(_normal(0, (2, 2, 2, 4)), _normal(0, (3, 3, 4, 5)),
                 CASES["nhwc_same"][2])
  matches, _ = rules.REPLACEMENTS[lax.conv_general_dilated_p]
  avals = (jax.ShapeDtypeStruct((2, 2, 2, 4), jnp.float32),
           jax.ShapeDtypeStruct((3, 3, 4, 5), jnp.float32))
  assert matches(layer.params, avals) == (jax.default_backend() == "cpu")

  def centres(kernel):
    return jax.jit(lambda p, b: prfl.kernels.cluster_at_models(
        loss, p, b, radius=prfl.quantile_radius(0.5), num_iters=3,
        plan=prfl.ExecutionPlan(1, kernel)).centers)(params, batch)

  ghost, gram = centres("ghost"), centres("gram")
  for g, r in zip(jax.tree.leaves(ghost), jax.tree.leaves(gram)):
    np.testing.assert_allclose(
        g, r, **tolerances.model(1e-4, 1e-6, scale=np.abs(r).max()))


def test_thin_inputs_go_by_patches_on_cpu():
  """A convolution with at most `THIN_FEATURES` input features runs as
  patches times the kernel in the interpreter (no XLA convolution in its
  program), a wider one as XLA's convolution, in either layout.

  Seen to fail with `THIN_FEATURES = 0` and with `thin_input` reading the
  output features (`rhs[0]`) instead of the input features.
  """
  def convs(x_shape, w_shape, dn=("NHWC", "HWIO", "NHWC")):
    params = conv.conv_params(len(x_shape), window_strides=(1, 1),
                              padding="SAME", dimension_numbers=dn)
    x, w = jnp.zeros(x_shape), jnp.zeros(w_shape)
    jaxpr = jax.make_jaxpr(lambda x, w: conv_cpu._replacement(  # pylint: disable=protected-access
        params, x, w))(x, w)
    return str(jaxpr).count("conv_general_dilated")

  assert convs((2, 6, 6, 1), (3, 3, 1, 16)) == 0
  assert convs((2, 6, 6, 4), (3, 3, 4, 2)) == 0
  assert convs((2, 3, 6, 6), (16, 3, 3, 3), ("NCHW", "OIHW", "NCHW")) == 0
  assert convs((2, 6, 6, 8), (3, 3, 8, 2)) == 1
  assert convs((2, 16, 6, 6), (2, 16, 3, 3), ("NCHW", "OIHW", "NCHW")) == 1
