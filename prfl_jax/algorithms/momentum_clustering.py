"""Momentum-Clustering (Werner et al., 2023, Algorithm 3).

Every client sends its momentum `m_i = alpha * g_i(x_i) + (1 - alpha) * m_i`
(eq. (momentum-definition)); the server runs Threshold-Clustering on the N
momenta with K centres carried over from the previous round, assigns every
client to its nearest centre and sends it that centre, which the client uses as
its update direction. Communication is O(N) per round instead of O(N^2).

The paper leaves these choices open; each is an option here, and
`docs/design.md` ("Momentum-Clustering's options, one by one") says what
each does and what was measured (`experiments/results/momentum_clustering/
README.md`). The default, `balls="assigned", sticky=False, warmup_rounds=5,
seed_average=True, freeze_when_stable=5, assign="loss", reseed=True,
reseed_pick="split"` (since session 12), was the best variant measured: the
true clusters (K active clusters of the right sizes) on the synthetic
regression's seeds 0-9, on Fashion-MNIST rotation and private label
(4 x 25) and on both digits Table 1 tasks, at least Myopic-Clustering's accuracy on each. The
default before it (`assign="momentum"`, no re-seed: driver variant
`assigned_stable_warm`) did not settle on the synthetic regression, whose
true clusters' momenta are not nearest-mean separable, nor on Fashion-MNIST
rotation 4 x 25. `PAPER_LITERAL` is Algorithm 3 as written (its centres
collapse):

* `balls`: `"all"` (Algorithm 2: every ball over all N momenta) or
  `"assigned"` (each centre's ball over its own clients, last round's).
* `sticky`: a client stays with its centre while inside its final ball.
* `freeze_after` / `freeze_when_stable` / `stable_share`: no client changes
  centre from a round on, or once (almost) none has for some rounds.
* `seed_average`: at seeding, every client takes its centre's mean model.
* `warmup_rounds`: own-momentum steps before farthest-first seeding.
* `reseed` / `reseed_pick` (`mc_reseed`): a centre without clients, or
  coinciding with a lower one, moves into the largest cluster: to the
  momentum of a random client (`"random"`), of its worst-fit client
  (`"worst"`: the highest loss at its centre's model) or to the mean
  momentum of the half of it that 2-means splits off (`"split"`).
* `assign`: after seeding, `"momentum"` (the nearest centre, Algorithm 3)
  or `"loss"` (IFCA's signal, Ghosh et al., 2020: the centre whose model
  gives the client the lowest loss). With `"loss"` the state carries one
  model per centre (the mean of its clients' models, kept while the centre
  is empty); a client that changes centre takes its model; with `reseed`
  an emptied centre's model becomes its picked client's own step (its model
  minus the optimizer's step along its momentum; with `"split"` the mean
  own step of the half), and no round with a
  re-seed counts towards `freeze_when_stable`.
* `bias_correction`: cluster `m_i / (1 - (1 - alpha)^t)` (as Adam does).
"""

from typing import Any, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import optax

from prfl_jax import clustering
from prfl_jax import diagnostics
from prfl_jax import gradients
from prfl_jax import tree as tree_lib
from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models
from prfl_jax.algorithms import mc_reseed
# Public names of this module before they moved to `mc_reseed` (tests and
# users import them from here).
from prfl_jax.algorithms.mc_reseed import dead_centers  # noqa: F401
from prfl_jax.algorithms.mc_reseed import RESEED_PICKS  # noqa: F401
from prfl_jax.algorithms.mc_reseed import reseed_centers  # noqa: F401
from prfl_jax.algorithms.mc_reseed import split_half  # noqa: F401

PyTree = Any

# Algorithm 3 as written (every ball over all N momenta, nearest centre,
# seeded at round 0, never frozen, no re-seeding): `momentum_clustering(...,
# **PAPER_LITERAL)`.
PAPER_LITERAL = {"balls": "all", "sticky": False, "warmup_rounds": 0,
                 "seed_average": False, "freeze_when_stable": None,
                 "assign": "momentum", "reseed": False}


class MomentumClusteringState(NamedTuple):
  """State of Momentum-Clustering."""
  params: PyTree  # leaves [N, ...]: personalized models x_i.
  opt_state: PyTree  # leaves [N, ...]: per-client optimizer state.
  momentum: PyTree  # leaves [N, ...]: client momenta m_i.
  centers: PyTree  # leaves [K, ...]: server cluster centres v_k.
  assignment: jax.Array  # [N] int32: cluster of each client last round.
  byzantine: jax.Array  # [N] bool: malicious clients.
  round: jax.Array  # [] int32: rounds done.
  still: jax.Array  # [] int32: consecutive rounds in which no client moved.
  models: Optional[PyTree]  # leaves [K, ...]: assign="loss" only, else None.
  layout = base.Layout(clients=("params", "opt_state", "momentum",
                                "assignment", "byzantine"))


def momentum_clustering(loss_fn, optimizer: optax.GradientTransformation, *,
                        num_clusters: int, radius: clustering.Radius,
                        num_iters: int = 10, alpha: float = 0.1,
                        attack=None, method: str = "direct",
                        balls: str = "assigned", sticky: bool = False,
                        warmup_rounds: int = 5, seed_average: bool = True,
                        reseed: bool = True, reseed_pick: str = "split",
                        bias_correction: bool = False,
                        freeze_after: Optional[int] = None,
                        freeze_when_stable: Optional[int] = 5,
                        stable_share: float = 0.0, assign: str = "loss",
                        true_clusters=None) -> base.Algorithm:
  """Momentum-Clustering: server-side clustering of client momenta.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: optax optimizer applied per client to its centre
      (`optax.sgd(eta)` is the paper's `x <- x - eta * v_{k_i}`).
    num_clusters: K, the number of centres (K <= N).
    radius: Threshold-Clustering radius (scalar, `[K]`, or a rule). With
      `balls="assigned"` a quantile rule is over each centre's own points.
    num_iters: Threshold-Clustering steps per round.
    alpha: momentum weight of the new gradient, in (0, 1].
    attack: what Byzantine clients send instead of their momentum, or None.
    method: Threshold-Clustering kernel, "direct" or "gram". "gram" computes
      one `[N, N]` Gram matrix of the momenta per round (shared by
      farthest-first) and reads all distances off it
      (`clustering.cluster_and_assign`); the carried centres, which are not
      combinations of this round's momenta, enter through their `[N, K]`
      inner products with the momenta.
    balls: `"all"` (Algorithm 2 as written) or `"assigned"` (see the
      module docstring).
    sticky: clients stay with their centre while inside its ball (needs
      `balls="assigned"` and `assign="momentum"`); else every client goes
      to its nearest centre.
    warmup_rounds: rounds of own-momentum steps before the centres are
      seeded.
    seed_average: at seeding, every client's model becomes the mean model
      of its centre's clients (after a warm-up of own steps the models
      differ; Momentum-Clustering never averages them otherwise).
    reseed: move empty or coinciding centres (see the module docstring);
      with `assign="loss"` also re-seed an empty centre's model.
    reseed_pick: where `reseed` moves a dead centre
      (`mc_reseed.reseed_centers`):
      `"random"` (a random client of the largest cluster), `"worst"` (its
      client with the highest loss at its centre's model; needs
      `assign="loss"`) or `"split"` (the mean of the half of the largest
      cluster that 2-means on the momenta splits off; with `assign="loss"`
      the centre's model becomes that half's mean own step).
    bias_correction: cluster bias-corrected momenta.
    freeze_after: from round `freeze_after` (counted from 0) on, no client
      changes centre; the centres still follow their clients' momenta
      (needs `balls="assigned"` and `freeze_after > warmup_rounds`). None:
      clients may move in every round.
    freeze_when_stable: once no client has changed centre for this many
      consecutive rounds after seeding, no client changes centre again
      (needs `balls="assigned"`; see the module docstring). None: never.
      `PAPER_LITERAL` holds the paper-literal values of `balls`, `sticky`,
      `warmup_rounds`, `seed_average`, `freeze_when_stable`, `assign` and
      `reseed`.
    stable_share: with `freeze_when_stable`, a round counts as still when
      at most `floor(stable_share * N)` clients changed centre, in [0, 1);
      0 (no move at all) by default. For federations where a few clients
      never stop moving on minibatch noise (module docstring). Nonzero
      needs `freeze_when_stable`.
    assign: `"momentum"` (nearest centre to the momentum, Algorithm 3) or
      `"loss"` (lowest loss at the centres' models, carried in the state's
      `models`; see the module docstring); at the seeding round always
      `"momentum"`.
    true_clusters: optional concrete `[N]` true cluster ids, known to the
      experimenter only: the step then also reports the diagnostics that
      need them (`prfl_jax.diagnostics.rounds`).

  Returns:
    `Algorithm(init, step)`. Besides `loss`, `grad_norm`, `update_norm` and
    `num_active_clusters`, the step reports `reseeded` (centres moved),
    `moved` (clients that changed centre), `frozen` (1 once frozen),
    `carried_weight` (mean weight of the carried centre in a client's
    direction) and `diagnostics.rounds.assignment_stats`; with
    `true_clusters`, also `diagnostics.rounds.separation_stats` of the
    momenta the server clusters (`sep_spread`, `sep_delta`, `sep_ari`).

  Raises:
    TypeError: if `optimizer` is not an optax transformation.
    ValueError: on a bad `num_clusters`, `num_iters`, `alpha`, `radius`,
      `method`, `balls`, `warmup_rounds`, `freeze_after`,
      `freeze_when_stable`, `stable_share`, `assign` (also `"loss"` with
      `sticky`) or `true_clusters`; at `init`, if
      K > N or `true_clusters` does not have N entries; at `step` with
      `assign="loss"`, if the state's `models` are not K models.

  References:
    Werner et al., 2023, Algorithm 3 (Momentum-Clustering).
  """
  base.check_optimizer(optimizer)
  base.check_positive_int(num_clusters, "num_clusters")
  base.check_positive_int(num_iters, "num_iters")
  base.check_positive_int(warmup_rounds, "warmup_rounds", minimum=0)
  if not isinstance(alpha, jax.core.Tracer) and not 0.0 < float(alpha) <= 1.0:
    raise ValueError(f"`alpha` must be in (0, 1], got {alpha!r}.")
  clustering.check_radius(radius, num_clusters)
  clustering.check_method(method)
  clustering.check_balls(balls)
  if sticky and balls != "assigned":
    raise ValueError("`sticky=True` needs balls='assigned' (the clients of "
                     "each centre are carried over).")
  if freeze_after is not None:
    base.check_positive_int(freeze_after, "freeze_after",
                            minimum=warmup_rounds + 1)
    if balls != "assigned":
      raise ValueError("`freeze_after` needs balls='assigned' (the clients "
                       "of each centre are carried over).")
  if freeze_when_stable is not None:
    base.check_positive_int(freeze_when_stable, "freeze_when_stable")
    if balls != "assigned":
      raise ValueError("`freeze_when_stable` needs balls='assigned' (the "
                       "clients of each centre are carried over); pass "
                       "freeze_when_stable=None with balls='all', or "
                       "**PAPER_LITERAL for Algorithm 3 as written.")
  if not 0.0 <= float(stable_share) < 1.0:
    raise ValueError(f"`stable_share` must be in [0, 1), got "
                     f"{stable_share!r}.")
  if stable_share and freeze_when_stable is None:
    raise ValueError(f"`stable_share={stable_share!r}` needs "
                     "`freeze_when_stable` (it says when a round counts as "
                     "still for that freeze); got freeze_when_stable=None.")
  if assign not in ("momentum", "loss"):
    raise ValueError(f"`assign` must be 'momentum' or 'loss', got "
                     f"{assign!r}.")
  if reseed_pick not in mc_reseed.RESEED_PICKS:
    raise ValueError(f"`reseed_pick` must be one of "
                     f"{mc_reseed.RESEED_PICKS}, got {reseed_pick!r}.")
  if reseed_pick == "worst" and assign != "loss":
    raise ValueError("reseed_pick='worst' ranks clients by their loss at "
                     "their centre's model; it needs assign='loss'.")
  if assign == "loss" and sticky:
    raise ValueError("`sticky=True` keeps clients by their momenta; it "
                     "needs assign='momentum'.")
  truth = diagnostics.check_true_clusters(true_clusters)
  k = num_clusters

  def is_frozen(state) -> jax.Array:
    """`[]` bool: no client may change centre this round."""
    frozen = jnp.zeros((), bool)
    if freeze_after is not None:
      frozen = state.round >= freeze_after
    if freeze_when_stable is not None:
      frozen = frozen | (state.still >= freeze_when_stable)
    return frozen

  def init(params, *, byzantine=None) -> MomentumClusteringState:
    n = base.init_params(params)
    base.check_at_most_clients(num_clusters, "num_clusters", n)
    diagnostics.rounds.check_num_clients(truth, n)
    zeros = jax.tree.map(jnp.zeros_like, params)
    centers = jax.tree.map(lambda p: jnp.zeros((k,) + p.shape[1:], p.dtype),
                           params)
    models = centers if assign == "loss" else None  # Set at seeding.
    return MomentumClusteringState(
        params, jax.vmap(optimizer.init)(params), zeros, centers,
        jnp.zeros((n,), jnp.int32), base.byzantine_mask(byzantine, n),
        jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), models)

  def cluster(state, sent, messages, keys, batch):
    """The server's round: (centers, assignment, directions, coefs, picks)."""
    del sent
    seed_key, reseed_key = keys
    gram = tree_lib.gram(messages) if method == "gram" else None
    seeding = state.round == warmup_rounds
    members = None
    if balls == "assigned":  # The seeding round: the nearest centre.
      members = jnp.where(seeding, -1, state.assignment)
    prev = lax.cond(seeding,
                    lambda: tree_lib.take(messages, clustering.farthest_first(
                        messages, k, seed_key, gram=gram)),
                    lambda: state.centers)
    centers, assignment, directions, info = (
        clustering.cluster_and_assign_with_info(
            messages, prev, radius=radius, num_iters=num_iters,
            method=method, gram=gram, balls=balls, members=members,
            sticky=sticky))
    if assign == "loss":  # After seeding: the lowest loss at a centre model.
      losses = cluster_models.cluster_losses(loss_fn, state.models, batch)
      by_loss = cluster_models.loss_assignment(losses)
      assignment = jnp.where(seeding, assignment, by_loss)
      directions = tree_lib.take(centers, assignment)
    if freeze_after is not None or freeze_when_stable is not None:
      assignment = jnp.where(is_frozen(state), state.assignment, assignment)
      directions = tree_lib.take(centers, assignment)
    n = assignment.shape[0]
    picks = (jnp.zeros((k,), bool), jnp.zeros((k, n), jnp.float32))
    if reseed:
      scores = None
      if reseed_pick == "worst":  # The loss at its (final) centre's model.
        scores = jnp.take_along_axis(losses, assignment[None], axis=0)[0]
      centers, *picks = mc_reseed.reseed_centers(
          centers, messages, assignment, reseed_key, reseed_pick, scores)
    return (centers, assignment, directions, info.coefs[assignment],
            tuple(picks))

  def own(state, sent, messages, keys, batch):
    """A warm-up round: every client steps with its own momentum."""
    del messages, keys, batch
    n = state.assignment.shape[0]
    return (state.centers, state.assignment, sent,
            jnp.eye(n, dtype=jnp.float32),
            (jnp.zeros((k,), bool), jnp.zeros((k, n), jnp.float32)))

  def step(state: MomentumClusteringState, batch, key):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
    if assign == "loss" and (state.models is None or tree_lib.num_leading(
        state.models, "state.models") != k):
      raise ValueError(f"assign='loss' needs the state's `models`, {k} "
                       "centre models (leaves [K, ...], as `init` makes "
                       "them), got "
                       f"{jax.tree.map(jnp.shape, state.models)}.")
    base.check_at_most_clients(num_clusters, "num_clusters",
                               state.byzantine.shape[0])
    seed_key, attack_key, reseed_key = jax.random.split(key, 3)
    losses, grads = gradients.client_grads(loss_fn, state.params, batch)
    momentum = jax.tree.map(lambda g, m: alpha * g + (1.0 - alpha) * m,
                            grads, state.momentum)
    scale = (1.0 - (1.0 - alpha) ** (state.round + 1).astype(jnp.float32)
             if bias_correction else jnp.ones((), jnp.float32))
    sent = jax.tree.map(lambda m: m / scale.astype(m.dtype), momentum)
    messages = base.attacked(attack, sent, state.byzantine, attack_key)
    args = (state, sent, messages, (seed_key, reseed_key), batch)
    if warmup_rounds:
      out = lax.cond(state.round < warmup_rounds, own, cluster, *args)
    else:
      out = cluster(*args)
    centers, assignment, directions, row_coefs, (dead, pick_weights) = out
    clustered = state.round > warmup_rounds  # Seeded in an earlier round.
    changed = jnp.sum(clustered & (assignment != state.assignment))
    tolerated = int(stable_share * assignment.shape[0])  # Static: N is.
    settled = clustered & (changed <= tolerated)
    if assign == "loss" and reseed:  # Not while a centre is re-seeded.
      settled = settled & ~jnp.any(dead)
    still = jnp.where(settled, state.still + 1, 0)
    directions = jax.tree.map(lambda d: d * scale.astype(d.dtype), directions)
    params = state.params
    if seed_average:  # One upload of the models, at seeding (only then).
      params = lax.cond(
          state.round == warmup_rounds,
          lambda p: tree_lib.take(
              cluster_models.segment_mean(p, assignment, k)[0], assignment),
          lambda p: p, params)
    if assign == "loss":  # A client that changed centre takes its model.
      params = tree_lib.where(clustered & (assignment != state.assignment),
                              tree_lib.take(state.models, assignment), params)
    params, opt_state = base.apply_updates(optimizer, directions,
                                           state.opt_state, params)
    models = state.models
    if assign == "loss":  # From seeding on; an empty centre keeps its model.
      means, sizes = cluster_models.segment_mean(params, assignment, k)
      models = cluster_models.keep_where_empty(
          (sizes > 0) & (state.round >= warmup_rounds), means, models)
      if reseed:  # An emptied centre: its pick's own step, from its model.
        def own_steps(idx):
          return base.apply_updates(
              optimizer, jax.tree.map(lambda m: m * scale.astype(m.dtype),
                                      tree_lib.take(messages, idx)),
              tree_lib.take(state.opt_state, idx),
              tree_lib.take(state.params, idx))[0]
        if reseed_pick == "split":  # The half's mean own step.
          every = own_steps(jnp.arange(assignment.shape[0]))
          ok = (pick_weights.sum(axis=0) > 0) & tree_lib.all_finite(every)
          stepped = tree_lib.combine(pick_weights, tree_lib.where(
              ok, every, jax.tree.map(jnp.zeros_like, every)))
        else:  # One-hot rows: the pick's own step.
          stepped = own_steps(jnp.argmax(pick_weights, axis=1))
        models = tree_lib.where(dead & (sizes == 0), stepped, models)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "grad_norm": base.benign_mean(base.grad_norms(grads), state.byzantine),
        "update_norm": base.benign_mean(base.grad_norms(directions),
                                        state.byzantine),
        "num_active_clusters": cluster_models.count_nonempty(assignment, k),
        "reseeded": jnp.sum(dead).astype(jnp.float32),
        "moved": changed.astype(jnp.float32),
        "frozen": is_frozen(state).astype(jnp.float32),
        "carried_weight": base.benign_mean(1.0 - jnp.sum(row_coefs, axis=1),
                                           state.byzantine),
    }
    metrics.update(diagnostics.rounds.assignment_stats(
        assignment, k, state.byzantine, truth, row_coefs=row_coefs,
        centers=centers))
    if truth is not None:  # sigma and Delta of Assumptions 8-9, measured.
      metrics.update(diagnostics.rounds.separation_stats(
          messages, truth, ~state.byzantine))
    new_state = MomentumClusteringState(params, opt_state, momentum, centers,
                                        assignment, state.byzantine,
                                        state.round + 1, still, models)
    return new_state, metrics

  return base.Algorithm(init, step)
