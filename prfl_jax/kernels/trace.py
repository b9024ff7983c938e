"""Where a loss's parameters enter through recognised layers, from its jaxpr.

`analyse(loss_fn, params, batch)` traces ONE client's loss to a jaxpr once and
finds every equation whose primitive has a layer rule (`kernels.rules`: dense
products, convolutions) and one operand that is a parameter leaf, seen through
linear view ops (reshape, transpose, dtype casts, broadcasts, slices); and the
biases: a parameter added to such an equation's output, broadcast over every
non-feature axis. It recurses into `jit`, `closed_call`, `custom_jvp_call`,
`custom_vjp_call` and `checkpoint` (jnp functions, Flax and Equinox modules show
up wrapped in them). A parameter used anywhere else (outside a recognised
equation, as both operands, inside a primitive it does not know such as `scan`
or `while`) is left to plain autodiff, and so is every parameter of a layer
whose equations disagree on the weight's layout.

`kernels.interpret` runs the jaxpr again with taps on the layers found here.
"""

import dataclasses
import math
from typing import Any, Dict, Optional, Tuple

import jax
from jax.extend import core as jcore
import numpy as np

from prfl_jax.kernels import rules

PyTree = Any
Path = Tuple[int, ...]

# Single-operand linear structural ops: a parameter seen through them is still
# "the parameter"; the gradient is pulled back through them exactly.
_VIEW_OPS = frozenset({
    "reshape", "transpose", "convert_element_type", "squeeze", "expand_dims",
    "broadcast_in_dim", "copy", "copy_p", "rev", "slice"})
# Call-like primitives whose body is interpreted equation by equation.
_CALL_OPS = frozenset({
    "pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
    "custom_vjp_call", "custom_vjp_call_jaxpr", "checkpoint", "remat",
    "remat2"})
_ADD_OPS = frozenset({"add", "add_any"})


def inner_jaxpr(eqn) -> Optional[tuple]:
  """`(jaxpr, consts)` of a call-like equation, or None."""
  if eqn.primitive.name not in _CALL_OPS:
    return None
  for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
    sub = eqn.params.get(name)
    if isinstance(sub, jcore.ClosedJaxpr):
      sub, consts = sub.jaxpr, sub.consts
    elif isinstance(sub, jcore.Jaxpr):
      consts = ()
    else:
      continue
    if len(sub.invars) == len(eqn.invars):
      return sub, consts
  return None


@dataclasses.dataclass(frozen=True)
class View:
  """A value that is parameter leaf `leaf` seen through the view ops `chain`."""
  leaf: int
  chain: tuple  # ((primitive, params), ...), leaf -> value.

  def key(self):
    return (self.leaf, tuple((p.name, repr(sorted(k.items())))
                             for p, k in self.chain))


@dataclasses.dataclass
class Site:
  """One recognised equation with a parameter operand."""
  path: Path
  view: View
  weight_index: int
  layer: rules.Layer
  x_aval: Any  # the other operand, one client.
  out_aval: Any  # the output, one client.
  x_tainted: bool  # True if the layer input depends on the parameters.
  bias: Optional[tuple] = None  # (View, ct_shape) of a bias added to it.


@dataclasses.dataclass(frozen=True)
class LayerGroup:
  """A parameter leaf whose every use is a site of one layout (+ its bias).

  Its gradient for one client is `pullback(fold(A^T D))`, with A, D the
  concatenation of its sites' tokens along M (shared weights), and A carrying
  a column that is 1 on the tokens of sites with the bias added, 0 elsewhere.
  """
  weight: View
  sites: Tuple[Site, ...]
  bias: Optional[View]  # the bias leaf seen at the add, minus broadcasts.
  bias_shape: Optional[tuple]  # shape of that value (its cotangent).

  @property
  def layer(self) -> rules.Layer:
    return self.sites[0].layer

  @property
  def num_tokens(self) -> int:
    """M: tokens of one client over all sites."""
    return sum(s.layer.tokens_per_call for s in self.sites)

  @property
  def shared_input(self) -> bool:
    """True if no site's input depends on the parameters (e.g. the data)."""
    return not any(s.x_tainted for s in self.sites)

  @property
  def width(self) -> int:
    """p, plus 1 for the bias column."""
    return self.layer.p + (self.bias is not None)


@dataclasses.dataclass
class Analysis:
  """What `analyse` found in one loss."""
  closed: Any  # ClosedJaxpr of loss_fn(params, batch) for one client.
  treedef: Any  # of (params, batch).
  num_param_leaves: int
  param_avals: tuple
  groups: Tuple[LayerGroup, ...]
  autodiff: Tuple[int, ...]  # param leaves left to plain autodiff.
  calls: Dict[Path, Any]  # call paths -> their inner (jaxpr, consts).
  notes: Tuple[str, ...]  # why leaves were left to autodiff.

  def active(self, groups=None) -> Dict[Path, Site]:
    """Sites of `groups` (all by default), by path."""
    groups = self.groups if groups is None else groups
    return {s.path: s for g in groups for s in g.sites}


@dataclasses.dataclass
class _Meta:
  view: Optional[View] = None
  tainted: bool = False  # depends on a parameter.
  # (path, feature axes): the output of this site, possibly transposed (its
  # (G, q) features sit at these axes of this value).
  site: Optional[tuple] = None


class _Walk:
  """Static pass over the jaxpr (see module docstring)."""

  def __init__(self, avals):
    self.avals = avals  # of the parameter leaves.
    self.sites: Dict[Path, Site] = {}
    self.other: Dict[int, str] = {}  # leaf -> why it is left to autodiff.
    self.calls: Dict[Path, Any] = {}

  def use(self, meta: _Meta, why: str):
    if meta.view is not None:
      self.other.setdefault(meta.view.leaf, why)

  def run(self, jaxpr, in_metas, prefix: Path):
    env = {}
    uses = {}
    for eqn in jaxpr.eqns:
      for v in eqn.invars:
        if not isinstance(v, jcore.Literal):
          uses[v] = uses.get(v, 0) + 1
    for v in jaxpr.outvars:
      if not isinstance(v, jcore.Literal):
        uses[v] = uses.get(v, 0) + 1
    read = lambda v: (_Meta() if isinstance(v, jcore.Literal) else
                      env.get(v, _Meta()))
    for v, m in zip(jaxpr.invars, in_metas):
      env[v] = m
    for i, eqn in enumerate(jaxpr.eqns):
      path = prefix + (i,)
      ins = [read(v) for v in eqn.invars]
      outs = self.eqn(eqn, ins, path, uses)
      for v, m in zip(eqn.outvars, outs):
        if not isinstance(v, jcore.DropVar):
          env[v] = m
    return [read(v) for v in jaxpr.outvars]

  def eqn(self, eqn, ins, path, uses):
    name = eqn.primitive.name
    tainted = any(m.tainted for m in ins)
    n_out = len(eqn.outvars)
    plain = [_Meta(tainted=tainted) for _ in range(n_out)]
    sub = inner_jaxpr(eqn)
    if sub is not None:
      self.calls[path] = sub
      return self.run(sub[0], ins, path)
    if (name in _VIEW_OPS and len(ins) == 1 and ins[0].view is not None and
        jax.dtypes.issubdtype(eqn.outvars[0].aval.dtype, np.inexact)):
      v = ins[0].view
      return [_Meta(View(v.leaf, v.chain + ((eqn.primitive, eqn.params),)),
                    True)]
    match = rules.RULES.get(eqn.primitive)
    views = [k for k, m in enumerate(ins) if m.view is not None]
    if match is not None and len(views) == 1 and len(ins) == 2:
      w = views[0]
      layer = match(eqn.params, tuple(v.aval for v in eqn.invars), w)
      if layer is not None:
        self.sites[path] = Site(
            path, ins[w].view, w, layer, eqn.invars[1 - w].aval,
            eqn.outvars[0].aval, ins[1 - w].tainted)
        return [_Meta(tainted=True, site=(path, layer.feature_dims))]
      self.use(ins[w], f"{name} at {path} has no supported layout")
      return plain
    if (name == "transpose" and ins[0].site is not None and
        uses.get(eqn.invars[0], 0) == 1):  # E.g. Equinox's vmapped Linear.
      perm = tuple(eqn.params["permutation"])
      return [_Meta(tainted=True, site=(ins[0].site[0], tuple(
          perm.index(a) for a in ins[0].site[1])))]
    if name in _ADD_OPS and len(views) == 1 and ins[1 - views[0]].site:
      s = 1 - views[0]
      path, features = ins[s].site
      site = self.sites[path]
      shape = eqn.invars[s].aval.shape
      if (site.bias is None and uses.get(eqn.invars[s], 0) == 1 and
          eqn.outvars[0].aval.shape == shape):
        view = ins[views[0]].view
        bias = _bias_view(view, self.avals[view.leaf],
                          eqn.invars[views[0]].aval.shape, features, shape)
        if bias is not None:
          site.bias = bias
          return plain
    for m in ins:
      self.use(m, f"used by {name} at {path}")
    return plain


def _bias_view(view: View, leaf_aval, shape: tuple, feature_dims: tuple,
               out_shape: tuple) -> Optional[tuple]:
  """`(view, shape)` of a bias broadcast over every non-feature axis, or None.

  Trailing `broadcast_in_dim`s of the chain that only broadcast along
  non-feature axes are dropped; what remains must have, in its own axes, the
  feature axes at full size and size 1 elsewhere, so that its cotangent is
  `sum_m d` (features in order) reshaped to `shape`.

  Args:
    view: the bias as it is added to the site's output.
    leaf_aval: the bias leaf's abstract value.
    shape: the added value's shape.
    feature_dims: the site layer's `feature_dims`.
    out_shape: the site's output shape.
  """
  if list(feature_dims) != sorted(feature_dims):
    return None
  if not shape:  # A scalar added to the output (lax broadcasts it).
    if math.prod(out_shape[a] for a in feature_dims) != 1:
      return None
    return view, ()
  if len(shape) != len(out_shape):
    return None
  chain = view.chain
  axes = tuple(range(len(shape)))  # value axis k is output axis axes[k].
  while chain and chain[-1][0].name == "broadcast_in_dim":
    dims = tuple(chain[-1][1]["broadcast_dimensions"])
    before = jax.eval_shape(lambda x, c=chain[:-1]: apply_chain(c, x),
                            jax.ShapeDtypeStruct(leaf_aval.shape,
                                                 leaf_aval.dtype)).shape
    if len(dims) != len(before):
      return None
    for k, ax in enumerate(axes):
      placed = [j for j, d in enumerate(dims) if d == k]
      grown = not placed or before[placed[0]] != shape[k]
      if grown and ax in feature_dims and out_shape[ax] != 1:
        return None
    axes, shape, chain = tuple(axes[d] for d in dims), tuple(before), chain[:-1]
  for k, ax in enumerate(axes):
    if shape[k] != (out_shape[ax] if ax in feature_dims else 1):
      return None
  if math.prod(shape) != math.prod(out_shape[a] for a in feature_dims):
    return None
  return View(view.leaf, chain), tuple(shape)


def bind(primitive, params: dict, args: list):
  """`primitive.bind(*args, **params)` as `jax.core.eval_jaxpr` does it.

  Returns:
    the list of outputs.
  """
  bound = primitive.get_bind_params(params)
  if isinstance(bound, tuple):  # jax < 0.7: (subfuns, params).
    subfuns, bound = bound
    args = list(subfuns) + list(args)
  out = primitive.bind(*args, **bound)
  return out if primitive.multiple_results else [out]


def apply_chain(chain: tuple, x: jax.Array) -> jax.Array:
  """Applies view ops `((primitive, params), ...)` to `x`."""
  for prim, params in chain:
    (x,) = bind(prim, params, [x])
  return x


def pullback(chain: tuple, aval, ct: jax.Array) -> jax.Array:
  """Gradient w.r.t. the leaf `aval` from the cotangent `ct` after `chain`."""
  if not chain:
    return ct.astype(aval.dtype)
  (out,) = jax.linear_transpose(lambda x: apply_chain(chain, x),
                                jax.ShapeDtypeStruct(aval.shape, aval.dtype)
                                )(ct.astype(_chain_out_dtype(chain, aval)))
  return out


def _chain_out_dtype(chain, aval):
  return jax.eval_shape(lambda x: apply_chain(chain, x),
                        jax.ShapeDtypeStruct(aval.shape, aval.dtype)).dtype


def analyse(loss_fn, params: PyTree, batch: PyTree) -> Analysis:
  """Traces `loss_fn` for one client and finds its layers (module docstring).

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    params: one model (unstacked), arrays or `jax.ShapeDtypeStruct`s.
    batch: one client's batch.

  Returns:
    an `Analysis`.
  """
  closed = jax.make_jaxpr(loss_fn)(params, batch)
  leaves, treedef = jax.tree.flatten((params, batch))
  num_params = len(jax.tree.leaves(params))
  avals = tuple(v.aval for v in closed.jaxpr.invars[:num_params])
  walk = _Walk(avals)
  in_metas = ([_Meta(View(i, ()), True) for i in range(num_params)] +
              [_Meta() for _ in closed.jaxpr.invars[num_params:]])
  for m in walk.run(closed.jaxpr, in_metas, ()):
    walk.use(m, "returned by the loss")
  other = dict(walk.other)
  by_leaf: Dict[int, list] = {}
  for site in walk.sites.values():
    by_leaf.setdefault(site.view.leaf, []).append(site)
  bias_of: Dict[int, list] = {}  # bias leaf -> sites it is added to.
  for site in walk.sites.values():
    if site.bias is not None:
      bias_of.setdefault(site.bias[0].leaf, []).append(site)
  groups = []
  for leaf, sites in sorted(by_leaf.items()):
    if leaf in other:
      continue
    keys = {(s.view.key(), s.layer.fold_key()) for s in sites}
    if len(keys) > 1:
      other[leaf] = "its products disagree on the weight's layout"
      continue
    if not jax.dtypes.issubdtype(avals[leaf].dtype, np.inexact):
      continue
    groups.append((leaf, tuple(sorted(sites, key=lambda s: s.path))))
  weight_leaves = {leaf for leaf, _ in groups}
  final = []
  for leaf, sites in groups:
    biases = {s.bias[0].key() + (s.bias[1],) for s in sites if s.bias}
    bias = None
    if len(biases) == 1:
      view, shape = next(s.bias for s in sites if s.bias)
      b = view.leaf
      if (b not in other and b not in weight_leaves and b not in by_leaf and
          all(s.view.leaf == leaf for s in bias_of[b])):
        bias = (view, shape)
    for s in sites:
      if s.bias is not None and bias is None:
        other.setdefault(s.bias[0].leaf, "bias of a layer left to autodiff")
    final.append(LayerGroup(sites[0].view, sites, *(bias or (None, None))))
  final = [g for g in final if g.weight.leaf not in other]
  covered = {g.weight.leaf for g in final} | {
      g.bias.leaf for g in final if g.bias is not None}
  autodiff = tuple(i for i in range(num_params) if i not in covered)
  notes = tuple(f"leaf {i}: {why}" for i, why in sorted(other.items()))
  return Analysis(closed, treedef, num_params, avals, tuple(final), autodiff,
                  walk.calls, notes)
