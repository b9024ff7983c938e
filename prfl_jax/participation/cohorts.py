"""Partial participation for every algorithm: one wrapper.

`cohort(algorithm, cohort_size=C)` turns any `Algorithm` into its cohort
version. Every round it draws C of the N registered clients from the round's
key (`sampling.draw`), gathers their rows of the per-client state fields (the
state class's `layout`, `prfl_jax.algorithms.base.Layout`), runs the
algorithm's own step on those C rows and the C clients' batches, and
scatters the rows back. So:

* only the cohort computes; every other client's rows stay bit for bit;
* server state (IFCA's K models, Momentum-Clustering's centres, Ditto's
  global model, FedAvg's global model and its optimizer state, the round
  counter) is updated from the cohort alone;
* Federated-Clustering forms its groups inside the cohort;
* a round costs O(C): a gather and a scatter of C rows around the step;
* dropped clients (`dropout`) are drawn but never gathered: their messages
  never arrive and their rows stay as they were.

FedAvg's `params` and `opt_state` are `shared` fields (N copies of one
value): the cohort state keeps one copy, so N = 10^5 clients cost no more
memory than N = 10.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from prfl_jax import tree as tree_lib
from prfl_jax import validation
from prfl_jax.algorithms import base
from prfl_jax.participation import sampling

PyTree = Any


class Replicated(NamedTuple):
  """One model that every one of `num_clients` clients starts from.

  The N copies are never built: pass it as `params` to a cohort
  algorithm's `init` (or to `prfl.train`) for federations whose stacked
  params would not fit in memory.
  """
  params: PyTree  # one client's params (unstacked).
  num_clients: int  # N.


class CohortState(NamedTuple):
  """State of a cohort algorithm: per-client rows and the server's part."""
  clients: dict  # layout.clients field -> leaves [N, ...].
  server: dict  # other fields; layout.shared ones kept once (no N axis).

  @property
  def round(self) -> jax.Array:
    return self.server["round"]

  @property
  def byzantine(self) -> jax.Array:
    return self.clients["byzantine"]


class Cohort(NamedTuple):
  """A cohort algorithm: `Algorithm`'s init and step, plus the draws.

  `step(state, batch, key)`: batch leaves `[C - D, B, ...]` are the batches
  of `members(key, N).index`, in that order.
  """
  init: Callable[..., CohortState]
  step: Callable[[CohortState, PyTree, jax.Array], tuple]
  members: Callable[[jax.Array, int], sampling.Members]
  apply: Callable  # apply(state, index [C - D], batch, key): a step on index.
  init_parts: Callable  # (one model, N, byzantine) -> see `cohort`.
  view: Callable  # view(state, index) -> the inner state of those clients.
  algorithm: base.Algorithm  # the wrapped algorithm.
  cohort_size: int  # C.
  num_arrived: int  # C - D.


def _layout(state_type) -> base.Layout:
  layout = getattr(state_type, "layout", None)
  if not isinstance(layout, base.Layout):
    raise TypeError(
        f"{state_type.__name__} declares no `layout` (a prfl_jax.algorithms."
        "base.Layout class attribute naming its per-client fields), so it "
        "cannot run in cohorts.")
  return layout


def split_state(state, layout: base.Layout) -> CohortState:
  """An algorithm's full `[N, ...]` state as a `CohortState`."""
  fields = state._asdict()
  clients = {f: fields[f] for f in layout.clients}
  server = {f: v for f, v in fields.items() if f not in layout.clients}
  for f in layout.shared:
    server[f] = jax.tree.map(lambda x: x[0], server[f])
  return CohortState(clients, server)


def gather(state: CohortState, state_type, index: jax.Array):
  """The inner algorithm's state of the clients `index` (`[C]`)."""
  layout = state_type.layout
  c = index.shape[0]
  fields = {f: tree_lib.take(v, index) for f, v in state.clients.items()}
  for f, v in state.server.items():
    fields[f] = tree_lib.broadcast(v, c) if f in layout.shared else v
  return state_type(**fields)


def scatter(state: CohortState, index: jax.Array, inner) -> CohortState:
  """Writes the cohort's new rows back; takes the new server fields."""
  layout = type(inner).layout
  fields = inner._asdict()
  clients = {
      f: jax.tree.map(lambda x, r: x.at[index].set(r), v, fields[f])
      for f, v in state.clients.items()}
  server = {}
  for f in state.server:
    server[f] = (jax.tree.map(lambda x: x[0], fields[f])
                 if f in layout.shared else fields[f])
  return CohortState(clients, server)


def num_clients(params) -> int:
  """N of stacked params or of a `Replicated`."""
  if isinstance(params, Replicated):
    validation.check_positive_int(params.num_clients, "num_clients")
    return int(params.num_clients)
  return base.init_params(params)


def cohort(algorithm: base.Algorithm, *, cohort_size: int,
           dropout: float = 0.0, weights=None) -> Cohort:
  """The cohort version of `algorithm`: C clients per round.

  Args:
    algorithm: any `Algorithm` whose state class declares a `layout`.
    cohort_size: C, clients drawn per round (1 <= C <= N, checked at init).
    dropout: share of the cohort that fails each round, in [0, 1):
      `floor(dropout * C)` drawn clients send nothing and keep their state.
    weights: optional `[N]` sampling weights (e.g. the clients' example
      counts, `data.num_examples`): successive sampling proportional to
      them. None: uniform without replacement.

  Returns:
    a `Cohort`; `init(params, *, byzantine=None)` takes stacked params
    (leaves `[N, ...]`) or a `Replicated(params, N)`.

  Raises:
    TypeError: if `algorithm` is not an `Algorithm`.
    ValueError: on a bad `cohort_size` or `dropout`, before any compile.
  """
  if not isinstance(algorithm, base.Algorithm):
    raise TypeError(f"`algorithm` must be a prfl_jax Algorithm, got "
                    f"{type(algorithm)}.")
  c = sampling.check_cohort_size(cohort_size)
  dropout = sampling.check_dropout(dropout)
  d = sampling.num_dropped(c, dropout)
  arrived = c - d
  checked = {}  # N -> weights as a device array (or None).

  def check_n(n: int):
    if n not in checked:
      if c > n:
        raise ValueError(
            f"`cohort_size`={c} exceeds the number of clients N={n}.")
      checked[n] = (None if weights is None else
                    jnp.asarray(sampling.check_weights(weights, n, c)))
    return checked[n]

  def members(key: jax.Array, n: int) -> sampling.Members:
    cohort_key, _ = jax.random.split(key)
    return sampling.draw(cohort_key, n, c, d, check_n(n))

  def inner_type(one_params, n: int):
    """The wrapped state class, traced (never run) on N copies of a model."""
    rows = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        (n,) + np.shape(x), jnp.result_type(x)), one_params)
    state_type = type(jax.eval_shape(algorithm.init, rows))
    _layout(state_type)
    return state_type

  def state_type(state: CohortState):
    n = state.clients["byzantine"].shape[0]
    if "params" in state.clients:
      one = jax.tree.map(lambda x: x[0], state.clients["params"])
    else:
      one = state.server["params"]
    return inner_type(one, n)

  def init_parts(one: PyTree, n: int, mask: jax.Array):
    """The state of N clients that all start at `one`, without N copies.

    Returns `(row, server, clients)`: one client's rows and the server
    fields, from the algorithm's init on C - D copies (row 0), so that N
    copies are never built; or, when that init refuses C - D clients
    because its state holds per-client constants of all N (the oracle's
    true clusters), `row` None and the full per-client fields.
    """
    layout = inner_type(one, n).layout
    try:
      state = split_state(
          algorithm.init(tree_lib.broadcast(one, min(arrived, n))), layout)
    except ValueError:
      state = split_state(
          algorithm.init(tree_lib.broadcast(one, n), byzantine=mask), layout)
      return None, state.server, state.clients
    row = {f: jax.tree.map(lambda x: x[0], v)
           for f, v in state.clients.items()}
    return row, state.server, None

  def init(params, *, byzantine=None) -> CohortState:
    n = num_clients(params)
    check_n(n)
    mask = base.byzantine_mask(byzantine, n)
    if isinstance(params, Replicated):
      row, server, clients = init_parts(params.params, n, mask)
      if clients is None:
        clients = {f: tree_lib.broadcast(v, n) for f, v in row.items()}
        clients["byzantine"] = mask
      return CohortState(clients, server)
    layout = inner_type(jax.tree.map(lambda x: x[0], params), n).layout
    return split_state(algorithm.init(params, byzantine=mask), layout)

  def view(state: CohortState, index: jax.Array):
    return gather(state, state_type(state), index)

  def apply(state: CohortState, index: jax.Array, batch: PyTree,
            key: jax.Array):
    inner, metrics = algorithm.step(view(state, index), batch, key)
    return scatter(state, index, inner), metrics

  def step(state: CohortState, batch: PyTree, key: jax.Array):
    n = state.clients["byzantine"].shape[0]
    _, inner_key = jax.random.split(key)
    return apply(state, members(key, n).index, batch, inner_key)

  return Cohort(init, step, members, apply, init_parts, view, algorithm, c,
                arrived)
