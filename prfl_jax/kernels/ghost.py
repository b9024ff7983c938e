"""The ghost kernel: Gram matrices of per-client gradients, never materialised.

For a layer whose weight gradient factors over tokens (`kernels.rules`: for a
dense layer `h = a W + b`, `dW_j = a_j^T d_j` and `db_j = 1^T d_j`, with
`d_j = dL_j/dh` the output cotangent of client j), the inner product of two
clients' gradients is

  <g_j, g_k> = sum_{m, m'} (a_jm . a_km' + 1)(d_jm . d_km'),          (*)

the entrywise product of two `[M, M]` blocks of Gram matrices of the layer's
input tokens and output cotangents. Federated-Clustering (Werner et al., 2023,
Algorithm 1, lines 6-7) only needs, for every model i, the `[N, N]` Gram
matrix of `{g_j(x_i)}_j` (Threshold-Clustering runs on it, see
`clustering.gram_clustering_coefs`) and one combination `sum_j c_j g_j(x_i)`
(the centre), which for such a layer is one GEMM `a^T (c * d)`. So the
`[N, p, q]` per-client weight gradients are never built: the batched small
GEMMs become `[N M, q] x [q, N M]` GEMMs (half of them, by symmetry), and the
input Gram of a layer fed by the data is shared by all models of a round.

The layers are found automatically in any `loss_fn(params, batch)`
(`kernels.trace`): no protocol to implement. Per layer, (*) is used only where
it costs fewer FLOPs than materialising the per-client gradients
(`uses_ghost`); otherwise the gradients are built from the same tokens, one
batched GEMM `einsum("ngmp,ngmq->ngpq")` (for a convolution this avoids the
grouped convolutions that a vmapped weight gradient becomes). Every parameter
outside a recognised layer is differentiated by plain autodiff. A loss with no
recognised layer is served by the Gram kernel (`kernels.resolve_plan`).

References:
  The per-example form of (*) is the "ghost norm" of Goodfellow (2015),
  "Efficient per-example gradient computations", and of ghost clipping (Li et
  al., 2022); here it is used across clients and models.
"""

import functools
from typing import Any, NamedTuple, Optional, Tuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax.kernels import base
from prfl_jax.kernels import interpret
from prfl_jax.kernels import trace

PyTree = Any
_HIGHEST = lax.Precision.HIGHEST

# Below this many rows (clients x tokens) a diagonal block of (*) is computed
# as one GEMM; above, it is split in halves and the off-diagonal block is
# computed once for both (measured 2x faster at 1024 rows on XLA:CPU). On
# CPU only by default (`kernel(split=None)`): on an H100 (jax 0.11.2) FC's
# rounds through the split with 9 clients (halves of 4 and 5) and all models
# in one vmap came out 4e-2 off at HIGHEST precision, while the same round
# unsplit, or split with 3 models per chunk, matched the CPU to 6e-8
# (benchmarks/check_ghost_precision.py). The split was never measured to
# help on a GPU.
_MIN_SPLIT_ROWS = 256


class Options(NamedTuple):
  """Variants of the ghost kernel (same results; see `kernel`)."""
  # Split large diagonal blocks of (*) in halves: None on XLA:CPU only.
  split: Optional[bool] = None
  # Every recognised layer through (*), not only where it costs fewer FLOPs.
  always: bool = False
  # Rows above which a block is split (`_block_gram`).
  min_split_rows: int = _MIN_SPLIT_ROWS


def uses_ghost(num_clients: int, tokens: int, p: int, q: int, shared: bool,
               groups: int = 1) -> bool:
  """Whether (*) costs fewer FLOPs than materialised per-client gradients.

  Per model and group, (*) costs `R^2 q` (half of `d d^T`, `R = N M` rows)
  plus `2 R^2 p` for the input Gram unless it is `shared` by all models;
  materialising costs `2 R p q` (the gradients) plus `2 N^2 p q` (their Gram
  matrix). Roughly: (*) wins when `N M^2 < p q`.

  Args:
    num_clients: N.
    tokens: M, tokens per client (batch x positions).
    p, q: token widths (a `[p, q]` weight per group; p counts the bias).
    shared: whether the input Gram is computed once per round.
    groups: G.
  """
  rows = num_clients * tokens
  ghost_flops = rows**2 * q + (0 if shared else 2 * rows**2 * p)
  dense_flops = 2 * (rows + num_clients**2) * p * q
  return groups * ghost_flops < groups * dense_flops


def _cross(ka: jax.Array, d1: jax.Array, d2: jax.Array, n1: int,
           n2: int) -> jax.Array:
  """`[n1, n2]` block sums of `ka * (d1 @ d2.T)`; rows come M per client."""
  prod = ka * jnp.matmul(d1, d2.T, precision=_HIGHEST)
  return jnp.sum(prod.reshape(n1, prod.shape[0] // n1, n2, -1), axis=(1, 3))


def _block_gram(ka: jax.Array, d: jax.Array, n: int, split: bool,
                min_rows: int = _MIN_SPLIT_ROWS) -> jax.Array:
  """`[n, n]` block sums of `ka * (d @ d.T)` for symmetric `ka` `[nM, nM]`.

  The matrix is symmetric, so with `split` a block of more than `min_rows`
  rows is split in halves of clients and the off-diagonal block is
  computed once.
  """
  if n < 2 or d.shape[0] <= min_rows or not split:
    return _cross(ka, d, d, n, n)
  h = n // 2
  r = h * (d.shape[0] // n)
  top = _block_gram(ka[:r, :r], d[:r], h, split, min_rows)
  bottom = _block_gram(ka[r:, r:], d[r:], n - h, split, min_rows)
  off = _cross(ka[:r, r:], d[:r], d[r:], h, n - h)
  return jnp.block([[top, off], [off.T, bottom]])


def _rows(t: jax.Array) -> jax.Array:
  """`[N, G, M, w]` -> `[G, N M, w]` (client-major rows per group)."""
  n, g, m, w = t.shape
  return jnp.transpose(t, (1, 0, 2, 3)).reshape(g, n * m, w)


def _finite_or_zero(x: jax.Array) -> jax.Array:
  return jnp.where(jnp.isfinite(x), x, 0.0)


class Context(NamedTuple):
  """Round-level state of the ghost kernel (`prepare`)."""
  analysis: Any  # trace.Analysis (static).
  ghost: Tuple[bool, ...]  # per layer group: (*) (True) or materialised.
  # Per layer group: None, or (a [N, G, M, p'] finite, K_a [G, N M, N M]) of
  # a group whose input does not depend on the model.
  shared: Tuple[Optional[tuple], ...]
  options: Options  # with `split` resolved to a bool.


def _float(x: jax.Array) -> jax.Array:
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _input_tokens(group: trace.LayerGroup, xs: dict,
                  bias_column: bool = True) -> jax.Array:
  """`a [N, G, M, p']` of a layer group from its sites' inputs `[N, ...]`.

  With `bias_column`, a group with a bias gets the column `p` that is 1 on
  the tokens of the sites with the bias added (`_bias_mask`), else `p' = p`.
  """
  parts = []
  for s in group.sites:
    zeros = jnp.zeros(s.out_aval.shape, s.out_aval.dtype)
    a = jax.vmap(lambda x, l=s.layer, z=zeros: l.tokens(x, z)[0])(xs[s.path])
    parts.append(_float(a))
  a = jnp.concatenate(parts, axis=2)
  if group.bias is not None and bias_column:
    mask = jnp.asarray(_bias_mask(group), a.dtype)
    a = jnp.concatenate(
        [a, jnp.broadcast_to(mask[:, None], a.shape[:-1] + (1,))], axis=-1)
  return a


def _bias_mask(group: trace.LayerGroup) -> np.ndarray:
  """`[M]`: 1 on the tokens of the sites with the group's bias, else 0."""
  return np.concatenate([
      np.full(s.layer.tokens_per_call, 0.0 if s.bias is None else 1.0)
      for s in group.sites])


def _materialised(group: trace.LayerGroup, xs: dict, d: jax.Array):
  """`[N, G, p', q]`: every client's `a^T d`, the bias row as `sum_m d`.

  The bias row is summed from `d` rather than multiplied by a column of
  ones, which would copy the `[N, G, M, p]` tokens once more.
  """
  w = jnp.einsum("ngmp,ngmq->ngpq", _input_tokens(group, xs, False), d,
                 precision=_HIGHEST)
  if group.bias is None:
    return w
  mask = jnp.asarray(_bias_mask(group), d.dtype)
  bias = jnp.einsum("ngmq,m->ngq", d, mask, precision=_HIGHEST)
  return jnp.concatenate([w, bias[:, :, None, :]], axis=2)


def _output_tokens(group: trace.LayerGroup, xs: dict, dys: dict) -> jax.Array:
  """`d [N, G, M, q]` of a layer group from its sites' cotangents."""
  parts = [_float(jax.vmap(lambda x, dy, l=s.layer: l.tokens(x, dy)[1])(
      xs[s.path], dys[s.path])) for s in group.sites]
  return jnp.concatenate(parts, axis=2)


def _input_gram(a: jax.Array) -> jax.Array:
  """`[G, N M, N M]` Gram matrices of input tokens `[N, G, M, p']`."""
  rows = _rows(a)
  return jnp.einsum("grp,gsp->grs", rows, rows, precision=_HIGHEST)


def _leaf_grads(group: trace.LayerGroup, analysis, w: jax.Array) -> dict:
  """`{leaf: gradient}` from `w [G, p', q]` (one client or the centre)."""
  layer = group.layer
  aval = analysis.param_avals
  out = {group.weight.leaf: trace.pullback(
      group.weight.chain, aval[group.weight.leaf],
      layer.fold(w[:, :layer.p, :]))}
  if group.bias is not None:
    out[group.bias.leaf] = trace.pullback(
        group.bias.chain, aval[group.bias.leaf],
        w[:, layer.p, :].reshape(group.bias_shape))
  return out


def _model_leaves(analysis, x_i):
  leaves = jax.tree.leaves(x_i)
  if len(leaves) != analysis.num_param_leaves:
    raise ValueError("`params` do not match the analysed loss.")
  return leaves


def layer_choices(analysis: trace.Analysis, num_clients: int,
                  options: Options = Options()) -> Tuple[bool, ...]:
  """Per layer group of `analysis`: through (*) (True) or materialised."""
  if options.always:
    return (True,) * len(analysis.groups)
  return tuple(uses_ghost(num_clients, g.num_tokens, g.width, g.layer.q,
                          g.shared_input, g.layer.groups)
               for g in analysis.groups)


def prepare(problem: base.Problem, params: PyTree, analysis: trace.Analysis,
            options: Options = Options()) -> Context:
  """Picks (*) per layer and shares the model-free input Grams of a round.

  Args:
    problem: the round's `Problem`.
    params: stacked models, leaves `[M, ...]`.
    analysis: `trace.analyse` of the loss on one client.
    options: the kernel's variant (`kernel`).
  """
  one = lambda t: jax.tree.map(lambda x: x[0], t)
  n = tree_lib.num_leading(problem.batch, "batch")
  ghost = layer_choices(analysis, n, options)
  shared_groups = [g for g, use in zip(analysis.groups, ghost)
                   if use and g.shared_input]
  shared = [None] * len(analysis.groups)
  if shared_groups:
    active = analysis.active(shared_groups)
    inline = interpret.inline_paths(analysis, active)
    model = _model_leaves(analysis, one(params))
    batch_leaves = jax.tree.leaves(problem.batch)
    xs = jax.vmap(lambda b: interpret.evaluate(analysis, model + list(b), None,
                                           active, inline)[1])(batch_leaves)
    for k, g in enumerate(analysis.groups):
      if g in shared_groups:
        a = _input_tokens(g, xs)
        shared[k] = (_finite_or_zero(a), _input_gram(a))
  split = (jax.default_backend() == "cpu" if options.split is None else
           options.split)
  return Context(analysis, ghost, tuple(shared),
                 options._replace(split=split))


class GhostGrads(NamedTuple):
  """One model's per-client losses and gradients, in factored form."""
  losses: jax.Array  # [N]: client j's loss at the model.
  gram: jax.Array  # [N, N]: <g_j, g_k> over all parameters.
  # Per (*) layer group: (a [N, G, M, p'] finite, d [N, G, M, q]).
  tokens: tuple
  materialised: dict  # {leaf: [N, ...]}: every other parameter's gradient.


def ghost_grads(ctx: Context, x_i: PyTree, batch: PyTree) -> GhostGrads:
  """Client losses and the Gram matrix of `{g_j(x_i)}_j` at one model, by (*).

  Args:
    ctx: from `prepare`.
    x_i: one model's params (unstacked).
    batch: leaves `[N, B, ...]`.
  """
  analysis = ctx.analysis
  n = tree_lib.num_leading(batch, "batch")
  model = _model_leaves(analysis, x_i)
  active = analysis.active()
  inline = interpret.inline_paths(analysis, active)
  rest_index = analysis.autodiff

  def client(rest, taps, b):
    leaves = list(model)
    for k, v in zip(rest_index, rest):
      leaves[k] = v
    return interpret.evaluate(analysis, leaves + list(b), taps, active, inline)

  taps = {p: jnp.zeros((n,) + s.out_aval.shape, s.out_aval.dtype)
          for p, s in active.items()}
  rest = [model[k] for k in rest_index]
  (losses, xs), (g_rest, dys) = jax.vmap(
      jax.value_and_grad(client, argnums=(0, 1), has_aux=True),
      in_axes=(None, 0, 0))(rest, taps, jax.tree.leaves(batch))
  materialised = dict(zip(rest_index, g_rest))
  gram = 0.0
  tokens = []
  for g, use, shared in zip(analysis.groups, ctx.ghost, ctx.shared):
    d = _output_tokens(g, xs, dys)
    if use:
      if shared is None:
        a = _input_tokens(g, xs)
        a, ka = _finite_or_zero(a), _input_gram(a)
      else:
        a, ka = shared
      rows = _rows(d)
      gram = gram + sum(_block_gram(ka[k], rows[k], n, ctx.options.split,
                                    ctx.options.min_split_rows)
                        for k in range(g.layer.groups))
      tokens.append((a, d))
    else:
      w = _materialised(g, xs, d)
      materialised.update(jax.vmap(
          lambda wj, g=g: _leaf_grads(g, analysis, wj))(w))
  gram = gram + tree_lib.gram(materialised)
  return GhostGrads(losses, jnp.asarray(gram), tuple(tokens), materialised)


def combine(ctx: Context, coefs: jax.Array, grads: GhostGrads, ok: jax.Array,
            params_def) -> PyTree:
  """`sum_j coefs[j] g_j` over the `ok` clients, one GEMM per (*) layer.

  Args:
    ctx: from `prepare`.
    coefs: `[N]` weights on the clients' gradients.
    grads: `GhostGrads` of one model.
    ok: `[N]` bool, clients whose gradient is finite.
    params_def: the treedef of one model's params.

  Returns:
    unstacked params-shaped pytree.
  """
  analysis = ctx.analysis
  c = jnp.where(ok, coefs, 0.0)
  out = dict(tree_lib.masked_combination(c, grads.materialised, ok))
  ghost_groups = [g for g, use in zip(analysis.groups, ctx.ghost) if use]
  for g, (a, d) in zip(ghost_groups, grads.tokens):
    cd = jnp.where(ok[:, None, None, None], c[:, None, None, None] * d, 0.0)
    w = jnp.einsum("ngmp,ngmq->gpq", a, cd, precision=_HIGHEST)
    out.update(_leaf_grads(g, analysis, w))
  return jax.tree.unflatten(
      params_def, [out[k] for k in range(analysis.num_param_leaves)])


def _cluster(problem: base.Problem, ctx: Context, index,
             x_i) -> base.PairsOutput:
  grads = ghost_grads(ctx, x_i, problem.batch)
  centred, ok = base.owner_centred(grads.gram, index)
  a, info = base.cluster_on_gram(problem, centred, ok)
  c = base.owner_coefs(a, index)
  center = combine(ctx, c, grads, ok | (jnp.arange(a.shape[0]) == index),
                   jax.tree.structure(x_i))
  center = jax.tree.map(lambda v, x: v.astype(x.dtype), center, x_i)
  own_norm = jnp.sqrt(grads.gram[index, index])
  return base.PairsOutput(center, grads.losses[index], own_norm,
                          info.inside[0], c)


def kernel(**options) -> base.Kernel:
  """The ghost kernel with `Options(**options)`, for `ExecutionPlan(kernel=)`.

  E.g. `ExecutionPlan(1, ghost.kernel(split=False))`; `"ghost"` is
  `kernel()`. Every variant gives the same results up to float rounding.
  """
  return base.Kernel(functools.partial(prepare, options=Options(**options)),
                     _cluster, accepts_messages=False, needs_analysis=True)


base.register_kernel("ghost", kernel())
