"""Momentum-Clustering (Werner et al., 2023, Algorithm 3).

Every client sends its momentum `m_i = alpha * g_i(x_i) + (1 - alpha) * m_i`
(eq. (momentum-definition)); the server runs Threshold-Clustering on the N
momenta with K centres carried over from the previous round, assigns every
client to its nearest centre and sends it that centre, which the client uses as
its update direction. Communication is O(N) per round instead of O(N^2).

The paper leaves these choices open; each is an option here. The default,
`balls="assigned", sticky=False, warmup_rounds=5, seed_average=True,
freeze_when_stable=5`, is the variant that worked best over the federations
measured (`experiments/results/momentum_clustering/README.md`): K active
clusters in every run, at least Myopic-Clustering's accuracy on both Table
1 tasks (digits and Fashion-MNIST) with the true clusters (ARI 1) on both;
not on the synthetic regression federation, where the assignment never
settles (never frozen) and the error is above Myopic-Clustering's on most
seeds: there the true clusters' momenta are not nearest-mean separable
(`diagnostics.rounds.separation_stats`: ARI of nearest-true-mean
assignment below 1 on 4 of 5 seeds already at round 0, where no option
acts yet, and sigma / Delta growing to 5-107 as the models converge). The
paper-literal reading is `PAPER_LITERAL` (`balls="all", warmup_rounds=0,
seed_average=False, freeze_when_stable=None`, nearest centre, no
re-seeding, no bias correction), under which the centres collapse onto one
another within a few tens of rounds; `balls="assigned", sticky=True,
warmup_rounds=0, seed_average=False, freeze_when_stable=None` is the
default before 27
November (its assignment drifts from the true clusters, and it diverges on
the synthetic federation); until session 8 the default had
`warmup_rounds=10`, which seeded two true clusters on one centre on
Fashion-MNIST private label:

* `balls`: Algorithm 2 averages every centre's ball over all N points
  (`"all"`), so the balls do not compete: centres whose balls overlap are
  pulled to the same points and never separate, and the clients of a
  duplicate centre move together. `"assigned"` gives each centre only its
  own clients, those assigned to it last round (`clustering.cluster_and_assign`
  with `members`; at the seeding round, the points nearest to it), so each
  centre follows its clients' momenta wherever they moved since the last
  round, and only the final nearest-centre assignment moves clients between
  centres. With `"all"`, a drift shared by all momenta (their common part
  changes from round to round) leaves the carried centres behind, and the
  nearest one is then the one lying furthest along the drift for every
  client.
* `sticky` (with `balls="assigned"`): Algorithm 3 does not say how `k_i` is
  chosen; by default every client goes to its nearest centre. With `sticky`
  a client stays with its centre while its momentum is inside that centre's
  final ball, and only the others go to their nearest centre, so noise in
  one round's momenta does not reshuffle clients whose models have been
  moving together.
* `freeze_after` (with `balls="assigned"`): from this round on no client
  changes centre; the centres still follow their clients' momenta. With
  nearest-centre moves (`sticky=False`) the assignment is often nearly the
  truth a few rounds after seeding, while the models are still close, and
  drifts once they have personalised (a client's momentum is then a
  gradient at its own model). Freezing 10 rounds after seeding keeps an
  early assignment, right or wrong: it won where that assignment was right
  and lost badly where two true clusters shared a centre at the freeze
  (`experiments/results/momentum_clustering/README.md`).
* `freeze_when_stable` (with `balls="assigned"`): the freeze comes when the
  assignment has settled, not at a fixed round: once no client has changed
  centre for this many consecutive rounds after seeding, none changes
  again. Where the momenta keep moving clients (as on the synthetic
  regression, whose true clusters are not a fixed point of nearest-centre
  assignment) it never freezes. With `sticky=False` it
  froze at rounds 8-11 on the digits and Fashion-MNIST and beat every other
  variant there, except where the settled assignment was a wrong one (two
  true clusters on one centre), which it keeps.
  `stable_share` relaxes "no client": a round is still when at most that
  share of the N clients moved (at N = 300 on Fashion-MNIST private label
  20-60 clients moved in every round, so the strict rule never fired).
* `seed_average`: a warm-up of own steps lets the clusters show in the
  momenta (on Table 1's digits it turned a seeding at ARI 0.67 into 1.0),
  but each client's own steps stay in its model for good, since the
  clients of a centre only ever share directions. With `seed_average` the
  clients of every centre take its mean model once, at seeding (one upload
  of the models); with `sticky=False, freeze_when_stable=5`
  it was the best variant measured on the digits and Fashion-MNIST.
* `warmup_rounds`: the K centres are seeded by farthest-first traversal of
  the momenta (a random first client, then repeatedly the client farthest
  from every chosen centre) at round `warmup_rounds`; before it every client
  steps with its own momentum (no clustering). Round-1 momenta are `alpha`
  times one noisy gradient; after many own steps each momentum is a
  gradient at a model personalised to its own data, and the clusters no
  longer show (Fashion-MNIST private label: the true clusters at seeding
  after 5 rounds, two on one centre after 10, one centre after 20).
* `reseed`: a centre that received no client, or coincides with a centre of
  lower index, moves to the momentum of a random client of the largest
  cluster for the next round.
* `assign`: the signal that picks every client's centre after seeding.
  `"momentum"` (Algorithm 3): the nearest centre to its momentum.
  `"loss"` (IFCA's signal, Ghosh et al., 2020): the centre whose model
  (the mean model of its clients last round) gives the client the lowest
  loss on its batch, K forward passes per client; a client that changes
  centre then takes that mean model (one download), so the clients of a
  centre keep one model. The centres themselves are still
  Threshold-Clustering's of the momenta, and the directions sent are
  still those centres. Not the default: on the synthetic regression an
  emptied centre has no model to win clients back (median error 1.08
  against 0.60; `docs/design.md`, the results' README).
* `bias_correction`: the server clusters `m_i / (1 - (1 - alpha)^t)` (as
  Adam does), so that the carried centres and this round's momenta have the
  same scale during the first ~1/alpha rounds; the direction sent back is
  rescaled, so the step is unchanged.
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

PyTree = Any

# Algorithm 3 as written (every ball over all N momenta, nearest centre,
# seeded at round 0, never frozen): `momentum_clustering(...,
# **PAPER_LITERAL)`.
PAPER_LITERAL = {"balls": "all", "sticky": False, "warmup_rounds": 0,
                 "seed_average": False, "freeze_when_stable": None}


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
  layout = base.Layout(clients=("params", "opt_state", "momentum",
                                "assignment", "byzantine"))


def dead_centers(centers: PyTree, assignment: jax.Array,
                 rtol: float = 1e-3) -> jax.Array:
  """`[K]` bool: centres with no client, or coinciding with a lower one.

  Centres k > j coincide when `||c_k - c_j|| <= rtol * max(||c_k||,
  ||c_j||)` (as in `diagnostics.partition.center_stats`).
  """
  k = tree_lib.num_leading(centers)
  sizes = jax.ops.segment_sum(jnp.ones_like(assignment), assignment, k)
  dist = jnp.sqrt(jnp.maximum(tree_lib.sq_distances(centers, centers), 0.0))
  norms = jnp.sqrt(tree_lib.sq_norms(centers))
  close = dist <= rtol * jnp.maximum(norms[:, None], norms[None, :])
  return (sizes == 0) | jnp.any(jnp.tril(close, k=-1), axis=1)


def reseed_centers(centers: PyTree, messages: PyTree, assignment: jax.Array,
                   key: jax.Array):
  """Moves every dead centre to a random member of the largest cluster.

  Args:
    centers: leaves `[K, ...]`.
    messages: the clients' momenta, leaves `[N, ...]`.
    assignment: `[N]` int32 cluster of every client.
    key: PRNG key drawing the members.

  Returns:
    `(centers, num_reseeded)`.
  """
  k = tree_lib.num_leading(centers)
  dead = dead_centers(centers, assignment)
  sizes = jax.ops.segment_sum(jnp.ones_like(assignment), assignment, k)
  largest = jnp.argmax(jnp.where(dead, -1, sizes))
  usable = tree_lib.usable(messages)
  pick = jax.random.categorical(
      key, jnp.where((assignment == largest) & usable, 0.0, -jnp.inf),
      shape=(k,))
  new = tree_lib.take(messages, pick)
  return tree_lib.where(dead, new, centers), jnp.sum(dead).astype(jnp.float32)


def momentum_clustering(loss_fn, optimizer: optax.GradientTransformation, *,
                        num_clusters: int, radius: clustering.Radius,
                        num_iters: int = 10, alpha: float = 0.1,
                        attack=None, method: str = "direct",
                        balls: str = "assigned", sticky: bool = False,
                        warmup_rounds: int = 5, seed_average: bool = True,
                        reseed: bool = False, bias_correction: bool = False,
                        freeze_after: Optional[int] = None,
                        freeze_when_stable: Optional[int] = 5,
                        stable_share: float = 0.0, assign: str = "momentum",
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
      `balls="assigned"`); else every client goes to its nearest centre.
    warmup_rounds: rounds of own-momentum steps before the centres are
      seeded.
    seed_average: at seeding, every client's model becomes the mean model
      of its centre's clients (after a warm-up of own steps the models
      differ; Momentum-Clustering never averages them otherwise).
    reseed: move empty or coinciding centres (see the module docstring).
    bias_correction: cluster bias-corrected momenta.
    freeze_after: from round `freeze_after` (counted from 0) on, no client
      changes centre; the centres still follow their clients' momenta
      (needs `balls="assigned"` and `freeze_after > warmup_rounds`). None:
      clients may move in every round.
    freeze_when_stable: once no client has changed centre for this many
      consecutive rounds after seeding, no client changes centre again
      (needs `balls="assigned"`; see the module docstring). None: never.
      `PAPER_LITERAL` holds the paper-literal values of `balls`, `sticky`,
      `warmup_rounds`, `seed_average` and `freeze_when_stable`.
    stable_share: with `freeze_when_stable`, a round counts as still when
      at most `floor(stable_share * N)` clients changed centre, in [0, 1);
      0 (no move at all) by default. For federations where a few clients
      never stop moving on minibatch noise (module docstring). Nonzero
      needs `freeze_when_stable`.
    assign: `"momentum"` (nearest centre to the momentum, Algorithm 3) or
      `"loss"` (lowest loss at the centres' mean models; see the module
      docstring); at the seeding round always `"momentum"`.
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
      K > N or `true_clusters` does not have N entries.

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
    return MomentumClusteringState(
        params, jax.vmap(optimizer.init)(params), zeros, centers,
        jnp.zeros((n,), jnp.int32), base.byzantine_mask(byzantine, n),
        jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

  def cluster(state, sent, messages, keys, batch):
    """The server's round: (centers, assignment, directions, coefs, moved)."""
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
      models, sizes = cluster_models.segment_mean(state.params,
                                                  state.assignment, k)
      losses = cluster_models.cluster_losses(loss_fn, models, batch)
      by_loss = cluster_models.loss_assignment(
          jnp.where(sizes[:, None] > 0, losses, jnp.inf))
      assignment = jnp.where(seeding, assignment, by_loss)
      directions = tree_lib.take(centers, assignment)
    if freeze_after is not None or freeze_when_stable is not None:
      assignment = jnp.where(is_frozen(state), state.assignment, assignment)
      directions = tree_lib.take(centers, assignment)
    moved = jnp.zeros((), jnp.float32)
    if reseed:
      centers, moved = reseed_centers(centers, messages, assignment,
                                      reseed_key)
    return centers, assignment, directions, info.coefs[assignment], moved

  def own(state, sent, messages, keys, batch):
    """A warm-up round: every client steps with its own momentum."""
    del messages, keys, batch
    n = state.assignment.shape[0]
    return (state.centers, state.assignment, sent,
            jnp.eye(n, dtype=jnp.float32), jnp.zeros((), jnp.float32))

  def step(state: MomentumClusteringState, batch, key):
    gradients.check_loss_fn(loss_fn, state.params, batch)  # At trace time.
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
    centers, assignment, directions, row_coefs, moved = out
    clustered = state.round > warmup_rounds  # Seeded in an earlier round.
    changed = jnp.sum(clustered & (assignment != state.assignment))
    tolerated = int(stable_share * assignment.shape[0])  # Static: N is.
    still = jnp.where(clustered & (changed <= tolerated), state.still + 1, 0)
    directions = jax.tree.map(lambda d: d * scale.astype(d.dtype), directions)
    params = state.params
    if seed_average:  # One upload of the models, at seeding (only then).
      params = lax.cond(
          state.round == warmup_rounds,
          lambda p: tree_lib.take(
              cluster_models.segment_mean(p, assignment, k)[0], assignment),
          lambda p: p, params)
    if assign == "loss":  # A client that changed centre takes its model.
      models, _ = cluster_models.segment_mean(state.params, state.assignment,
                                              k)
      params = tree_lib.where(clustered & (assignment != state.assignment),
                              tree_lib.take(models, assignment), params)
    params, opt_state = base.apply_updates(optimizer, directions,
                                           state.opt_state, params)
    metrics = {
        "loss": base.benign_mean(losses, state.byzantine),
        "grad_norm": base.benign_mean(base.grad_norms(grads), state.byzantine),
        "update_norm": base.benign_mean(base.grad_norms(directions),
                                        state.byzantine),
        "num_active_clusters": cluster_models.count_nonempty(assignment, k),
        "reseeded": moved,
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
                                        state.round + 1, still)
    return new_state, metrics

  return base.Algorithm(init, step)
