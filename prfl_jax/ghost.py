"""Gram matrices of per-client gradients of dense layers, never materialised.

For a dense layer `h = a @ W + b` (`a` `[B, in]`, `W` `[in, out]`) the gradient
of client j's loss is `dW_j = a_j^T d_j`, `db_j = 1^T d_j`, where `d_j = dL_j/dh`
`[B, out]` is the signal back-propagated to the layer's output. The inner
product of two clients' gradients is then

  <g_j, g_k> = sum_{b, b'} (a_jb . a_kb' + 1) (d_jb . d_kb'),          (*)

the entrywise product of two `[B, B]` blocks of Gram matrices of the layer's
inputs and output signals. Federated-Clustering (Werner et al., 2023,
Algorithm 1, lines 6-7) only needs, for every model i, the `[N, N]` Gram
matrix of `{g_j(x_i)}_j` (Threshold-Clustering then runs on it, see
`clustering.gram_clustering_coefs`) and one combination `sum_j c_j g_j(x_i)`
(the centre), which for a dense layer is one GEMM `a^T (c * d)`. So a round
needs no per-client weight gradient at all: the `[N, in, out]` batched small GEMMs
are replaced by `[N B, out] x [out, N B]` GEMMs (half of them, by symmetry),
and the input Gram of a layer fed by the data is shared by all models.

A `GhostLoss` is a loss that exposes its dense layers: `fn(params, batch, taps)`
adds `taps[name]` (`[B, out]`) to layer `name`'s output (for the names in
`taps`) and returns the loss and every such layer's input. It is also an
ordinary `loss_fn(params, batch)`, so every algorithm accepts it;
`Schedule(kernel="ghost")` makes `gradients.cluster_at_models` use (*). A
layer goes through (*) only where that costs fewer FLOPs than materialising its
per-client gradients (`uses_ghost`); for a small layer such as the MNIST MLP's
200 x 10 output layer the gradients are cheaper, and are computed as usual.

References:
  The per-example form of (*) is the "ghost norm" of Goodfellow (2015),
  "Efficient per-example gradient computations", and of ghost clipping (Li et
  al., 2022); here it is used across clients and models.
"""

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import clustering
from prfl_jax import tree as tree_lib

PyTree = Any
Taps = Optional[Mapping[str, jax.Array]]
# fn(params, batch, taps) -> (scalar loss, {layer name: layer input [B, in]})
TappedLossFn = Callable[[PyTree, PyTree, Taps], Any]

# Below this many rows (clients x batch) a diagonal block of (*) is computed as
# one GEMM; above, it is split in halves and the off-diagonal block is computed
# once for both (measured 2x faster at 1024 rows on XLA:CPU).
_MIN_SPLIT_ROWS = 256


def dense(layer: Mapping[str, jax.Array], x: jax.Array,
          tap: Optional[jax.Array] = None) -> jax.Array:
  """`x @ layer["kernel"] + layer["bias"] (+ tap)`, as in `flax.linen.Dense`.

  Args:
    layer: `{"kernel": [in, out], "bias": [out]}`.
    x: `[B, in]` inputs.
    tap: optional `[B, out]` zeros whose gradient is the output signal `d`.

  Returns:
    `[B, out]`.
  """
  h = x @ layer["kernel"] + layer["bias"]
  return h if tap is None else h + tap


@dataclasses.dataclass(frozen=True)
class GhostLoss:
  """A one-client loss whose dense layers are exposed for (*).

  `params[name]` must be `{"kernel": [in, out], "bias": [out]}` for every
  `name` in `layers` (the layout of `flax.linen.Dense`), and `fn` must compute
  each of them as `dense(params[name], a, taps[name] if taps else None)` on a
  `[B, in]` input `a`, returning `(loss, {name: a})`; `taps` is None or maps
  some of the layer names to `[B, out]` (a layer not in it gets no tap). The
  loss must be a sum or mean of per-example terms, so that the gradient of
  layer `name` is `a^T d` with `d` the gradient at the tap.
  """
  fn: TappedLossFn
  layers: Sequence[str]
  # True: every layer goes through (*) whatever it costs (tests, or hardware
  # where the FLOP count of `uses_ghost` misleads); False: `uses_ghost` picks.
  always: bool = False

  def __post_init__(self):
    if not callable(self.fn):
      raise TypeError(f"`fn` must be callable, got {type(self.fn)}.")
    if isinstance(self.layers, str):
      raise TypeError(
          f"`layers` must be a sequence of layer names, got {self.layers!r}.")
    object.__setattr__(self, "layers", tuple(self.layers))

  def __call__(self, params: PyTree, batch: PyTree) -> jax.Array:
    """The plain loss, `loss_fn(params, batch) -> scalar` for one client."""
    return self.fn(params, batch, None)[0]


def require_ghost_loss(loss_fn, messages: Optional[str] = None):
  """Raises unless the ghost kernel can serve `loss_fn` (checked before jit).

  Args:
    loss_fn: the loss given with `Schedule(kernel="ghost")`.
    messages: the name of the argument that would replace the honest
      gradients (`"message_fn"`, `"attack"`) if one is given, else None.

  Raises:
    TypeError: if `loss_fn` is not a `GhostLoss`.
    ValueError: if `messages` is given: an attack needs the materialised
      messages, which the ghost kernel never builds.
  """
  if not isinstance(loss_fn, GhostLoss):
    raise TypeError(
        "`loss_fn` must be a prfl_jax.ghost.GhostLoss for "
        f"Schedule(kernel='ghost'), got {type(loss_fn)}.")
  if messages is not None:
    raise ValueError(
        f"`{messages}` needs the materialised messages, which "
        "Schedule(kernel='ghost') never builds; use kernel='gram'.")


def check_ghost_loss(loss_fn, params: PyTree, batch: PyTree):
  """Checks, without compiling, that `loss_fn` is a usable `GhostLoss`.

  Args:
    loss_fn: the loss given to `cluster_at_models` with the ghost kernel.
    params: one model (unstacked) or any abstract value of its structure.
    batch: one client's batch (leaves `[B, ...]`).

  Raises:
    TypeError: if `loss_fn` is not a `GhostLoss`, or `params` is not a mapping.
    ValueError: if a layer is missing from `params`, or `fn` returns layer
      inputs whose shapes do not fit the layer's kernel.
  """
  require_ghost_loss(loss_fn)
  if not isinstance(params, Mapping):
    raise TypeError(
        "`params` must be a mapping from layer names to layers for "
        f"Schedule(kernel='ghost'), got {type(params)}.")
  if not loss_fn.layers:
    raise ValueError("`loss_fn.layers` names no dense layer.")
  for name in loss_fn.layers:
    layer = params.get(name)
    if (not isinstance(layer, Mapping) or set(layer) != {"kernel", "bias"} or
        np.ndim(layer["kernel"]) != 2):
      raise ValueError(
          f"`params[{name!r}]` must be {{'kernel': [in, out], 'bias': [out]}} "
          f"for the ghost kernel, got "
          f"{jax.tree.map(np.shape, layer) if layer is not None else None}.")
  _, inputs = jax.eval_shape(lambda p, b: loss_fn.fn(p, b, None), params,
                             batch)
  for name in loss_fn.layers:
    k_in = np.shape(params[name]["kernel"])[0]
    shape = np.shape(inputs[name]) if name in inputs else None
    if shape is None or len(shape) != 2 or shape[1] != k_in:
      raise ValueError(
          f"`loss_fn.fn` must return the input of layer {name!r} as "
          f"[B, {k_in}], got {shape}.")


def uses_ghost(num_clients: int, batch_size: int, d_in: int, d_out: int,
               shared: bool) -> bool:
  """Whether (*) costs fewer FLOPs than materialised per-client gradients.

  Per model, (*) costs `R^2 out` (half of `d d^T`, `R = N B` rows) plus
  `2 R^2 in` for the input Gram unless it is `shared`; materialising costs
  `2 R in out` (the gradients) plus `2 N^2 in out` (their Gram matrix).
  """
  rows = num_clients * batch_size
  ghost_flops = rows**2 * d_out + (0 if shared else 2 * rows**2 * d_in)
  dense_flops = 2 * (rows + num_clients**2) * d_in * d_out
  return ghost_flops < dense_flops


def _split(params: Mapping, layers: Sequence[str]):
  dense_part = {k: params[k] for k in layers}
  rest = {k: v for k, v in params.items() if k not in dense_part}
  return dense_part, rest


def _cross(ka: jax.Array, d1: jax.Array, d2: jax.Array, n1: int,
           n2: int) -> jax.Array:
  """`[n1, n2]` block sums of `ka * (d1 @ d2.T)`; rows come `B` per client."""
  prod = ka * (d1 @ d2.T)
  return jnp.sum(prod.reshape(n1, prod.shape[0] // n1, n2, -1), axis=(1, 3))


def _block_gram(ka: jax.Array, d: jax.Array, n: int) -> jax.Array:
  """`[n, n]` block sums of `ka * (d @ d.T)` for symmetric `ka` `[nB, nB]`.

  The matrix is symmetric, so it is split in halves of clients and the
  off-diagonal block is computed once.
  """
  if n < 2 or d.shape[0] <= _MIN_SPLIT_ROWS:
    return _cross(ka, d, d, n, n)
  h = n // 2
  r = h * (d.shape[0] // n)
  top = _block_gram(ka[:r, :r], d[:r], h)
  bottom = _block_gram(ka[r:, r:], d[r:], n - h)
  off = _cross(ka[:r, r:], d[:r], d[r:], h, n - h)
  return jnp.block([[top, off], [off.T, bottom]])


def _input_gram(a: jax.Array) -> jax.Array:
  """`a a^T + 1` for layer inputs `a` `[N, B, in]`, as `[N B, N B]`."""
  flat = a.reshape(-1, a.shape[-1])
  return jnp.matmul(flat, flat.T, precision=lax.Precision.HIGHEST) + 1.0


class SharedInput(NamedTuple):
  """A dense layer's input that is the same at every model (e.g. the data)."""
  gram: jax.Array  # [N B, N B]: a a^T + 1, from the raw inputs.
  inputs: jax.Array  # [N, B, in]: the inputs, non-finite entries zeroed.


def shared_inputs(loss_fn: GhostLoss, params: PyTree, batch: PyTree) -> dict:
  """Inputs and input Grams of the layers whose input is model-independent.

  Such a layer (typically the first) sees the same `[N, B, in]` inputs at
  every model, so its `[N B, N B]` input Gram is computed once per round.

  Args:
    loss_fn: a `GhostLoss`.
    params: stacked models, leaves `[M, ...]`.
    batch: stacked client batches, leaves `[N, B, ...]`.

  Returns:
    `{name: SharedInput}` for those of them that go through (*).
  """
  one_model = jax.tree.map(lambda x: x[0], params)
  inputs_at = lambda p: jax.vmap(lambda b: loss_fn.fn(p, b, None)[1])(batch)
  abstract = jax.eval_shape(inputs_at, one_model)
  n = jax.tree.leaves(batch)[0].shape[0]
  shared = {}
  for name in loss_fn.layers:
    if not (loss_fn.always or uses_ghost(
        n, abstract[name].shape[1], *np.shape(one_model[name]["kernel"]),
        shared=True)):
      continue
    try:  # out_axes=None fails iff the input depends on the model.
      jax.eval_shape(jax.vmap(lambda p, layer=name: inputs_at(p)[layer],
                              out_axes=None),
                     jax.tree.map(lambda x: x[:1], params))
    except ValueError:
      continue
    a = inputs_at(one_model)[name]
    shared[name] = SharedInput(_input_gram(a), _finite_or_zero(a))
  return shared


def _finite_or_zero(x: jax.Array) -> jax.Array:
  return jnp.where(jnp.isfinite(x), x, 0.0)


class GhostGrads(NamedTuple):
  """One model's per-client losses and gradients, in factored form."""
  losses: jax.Array  # [N]: client j's loss at the model.
  gram: jax.Array  # [N, N]: <g_j, g_k> over all parameters.
  # {layer: [N, B, in]}: inputs a_j of the layers done by (*), non-finite
  # entries zeroed (a client with such inputs has a non-finite Gram row).
  inputs: dict
  signals: dict  # {layer: [N, B, out]}: output signals d_j.
  rest: PyTree  # [N, ...]: gradients of the other parameters, materialised.


def ghost_layers(loss_fn: GhostLoss, model: PyTree, inputs: Mapping,
                 num_clients: int, shared: Mapping) -> tuple:
  """The layers of `loss_fn` that go through (*) (see `uses_ghost`).

  Args:
    loss_fn: a `GhostLoss`.
    model: one model's params (unstacked, possibly abstract).
    inputs: one client's layer inputs `{name: [B, in]}` (possibly abstract).
    num_clients: N.
    shared: `shared_inputs` of this round.
  """
  return tuple(
      name for name in loss_fn.layers
      if loss_fn.always or name in shared or
      uses_ghost(num_clients, inputs[name].shape[0],
                 *np.shape(model[name]["kernel"]), False))


def ghost_grads(loss_fn: GhostLoss, model: PyTree, batch: PyTree,
                shared: Mapping[str, SharedInput]) -> GhostGrads:
  """Client losses and the Gram matrix of `{g_j(x_i)}_j` at one model, by (*).

  Args:
    loss_fn: a `GhostLoss`.
    model: one model's params (unstacked).
    batch: leaves `[N, B, ...]`.
    shared: `shared_inputs` of this round.

  Returns:
    `GhostGrads`.
  """
  n = jax.tree.leaves(batch)[0].shape[0]
  _, abstract_inputs = jax.eval_shape(
      lambda b: loss_fn.fn(model, b, None), jax.tree.map(lambda x: x[0], batch))
  layers = ghost_layers(loss_fn, model, abstract_inputs, n, shared)
  dense_part, rest = _split(model, layers)

  def client(rest_params, taps, client_batch):
    return loss_fn.fn({**rest_params, **dense_part}, client_batch, taps)

  taps = {name: jnp.zeros((n, abstract_inputs[name].shape[0],
                           dense_part[name]["kernel"].shape[1]),
                          dense_part[name]["kernel"].dtype)
          for name in layers}
  (losses, inputs), (g_rest, signals) = jax.vmap(
      jax.value_and_grad(client, argnums=(0, 1), has_aux=True),
      in_axes=(None, 0, 0))(rest, taps, batch)
  gram = tree_lib.gram(g_rest)  # 0 when every parameter is in `layers`.
  clean = {}
  for name in layers:
    if name in shared:
      ka, clean[name] = shared[name]
    else:
      ka, clean[name] = _input_gram(inputs[name]), _finite_or_zero(inputs[name])
    d = signals[name].reshape(-1, signals[name].shape[-1])
    gram = gram + _block_gram(ka, d, n)
  return GhostGrads(losses, gram, clean, signals, g_rest)


def centred(gram: jax.Array, index: jax.Array) -> tuple:
  """Gram matrix of `g_j - g_i` from that of `g_j`, masked by `mask_gram`.

  `<g_j - g_i, g_k - g_i> = G_jk - G_ji - G_ik + G_ii`. In float32 this loses
  about `eps * ||g_i||^2` in each entry, which matters only when the spread of
  the gradients is below about 1e-3 of their norm.

  Args:
    gram: `[N, N]`.
    index: the owner i.

  Returns:
    `(gram [N, N], ok [N] bool)`, as `clustering.mask_gram` returns them.
  """
  col = gram[:, index]
  return clustering.mask_gram(
      gram - col[:, None] - col[None, :] + gram[index, index])


def combine(coefs: jax.Array, grads: GhostGrads, ok: jax.Array) -> PyTree:
  """`sum_j coefs[j] g_j` over the `ok` clients, one GEMM per dense layer.

  Args:
    coefs: `[N]` weights on the clients' gradients.
    grads: `GhostGrads` of one model.
    ok: `[N]` bool, clients whose gradient is finite.

  Returns:
    unstacked params-shaped pytree.
  """
  c = jnp.where(ok, coefs, 0.0)
  out = tree_lib.masked_combination(c, grads.rest, ok)
  for name in grads.inputs:
    a, d = grads.inputs[name], grads.signals[name]
    cd = jnp.where(ok[:, None, None], c[:, None, None] * d, 0.0)
    cd = cd.reshape(-1, cd.shape[-1])
    a = a.reshape(-1, a.shape[-1])  # Finite: see GhostGrads.inputs.
    out[name] = {"kernel": jnp.matmul(a.T, cd,
                                      precision=lax.Precision.HIGHEST),
                 "bias": jnp.sum(cd, axis=0)}
  return out
