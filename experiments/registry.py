"""Every algorithm the experiments run, by name: one factory and its defaults.

An experiment, a sweep or a benchmark builds an algorithm in two steps:

  s = registry.settings(cfg, "fc")     # cfg's settings, then fc's overrides
  alg = registry.build("fc", ctx, s)   # prfl.algorithms.federated_clustering

`settings` collects the options of the setting groups (`groups.SETTINGS`:
optimizer, schedule, clustering, plan, baselines, robust aggregation) from
the experiment's configuration (group defaults for groups it does not have),
then the entry's own defaults (what makes a variant, e.g. `global_median`'s
aggregator), then `per_algorithm[name]` of the configuration. So one run can
give FC another batch size, number of rounds or groups than the others
(`--per-algorithm fc.batch_size=16`, or `[per_algorithm.fc]` in a file); the
runner (`experiments.training`) reads `rounds`, `batch_size` and `eval_every`
from each algorithm's settings.

Adding an algorithm: a function `build(ctx, s) -> prfl.algorithms.Algorithm`
registered with `@register(name, label, reads=(settings it reads), **defaults)`.
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np
import optax

import prfl_jax as prfl
from experiments import groups
from experiments import options


class Context(NamedTuple):
  """What an algorithm needs from the experiment besides its settings."""
  loss_fn: Callable  # loss_fn(params, batch) -> scalar, for one client.
  clusters: np.ndarray  # [N] true clusters: the oracle's only input.
  num_clusters: int  # K, for IFCA, HypCluster, CFL, Myopic- and MC.
  key: jax.Array  # IFCA's / HypCluster's random initial models.
  attack: Any = None  # What Byzantine clients send (`prfl.attacks`).
  num_byzantine: int = 0  # Krum's f (the defender is told it).
  init_models: Any = None  # IFCA / HypCluster: explicit initial models.
  # FC: a radius (value or rule) in place of `quantile_radius(quantile)`,
  # for benchmarks that fix it or force the quantile's method.
  radius: Any = None


class Settings(dict):
  """Setting name -> value of one algorithm (read as attributes)."""

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(f"no setting {name!r}") from None


class Entry(NamedTuple):
  name: str
  label: str  # In tables and plots.
  build: Callable[[Context, Settings], prfl.algorithms.Algorithm]
  reads: tuple  # The settings `build` reads.
  defaults: dict  # Settings that define this entry (variants).


REGISTRY: dict = {}
# Every algorithm reads these through the runner (`experiments.training`).
RUN_SETTINGS = ("rounds", "eval_every", "batch_size")
_OPTIMIZER = ("lr", "momentum")


def register(name: str, label: str, *, reads: tuple = (), **defaults):
  """Decorator: registers `build(ctx, settings)` as algorithm `name`."""
  def wrap(build):
    REGISTRY[name] = Entry(name, label, build, _OPTIMIZER + tuple(reads),
                           defaults)
    return build
  return wrap


def names() -> tuple:
  return tuple(REGISTRY)


def label(name: str) -> str:
  return REGISTRY[name].label


def settings(cfg, name: Optional[str] = None) -> Settings:
  """The settings algorithm `name` runs with under configuration `cfg`
  (None: the shared settings, before any algorithm's own)."""
  values = {}
  for cls in groups.SETTINGS:
    values.update(options.to_dict(cls()))
  present = {o.name: o.value for o in options.walk(type(cfg), cfg)
             if o.owner in groups.SETTINGS}
  values.update(present)
  if name is not None:
    values.update(REGISTRY[name].defaults)
    values.update(_per_algorithm(cfg).get(name, {}))
  return Settings(values)


def _per_algorithm(cfg) -> dict:
  found = [o.value for o in options.walk(type(cfg), cfg)
           if o.name == "per_algorithm"]
  return found[0] if found else {}


def check(cfg, used: tuple):
  """Raises ValueError if `per_algorithm` names an algorithm not in `used`
  or a setting that algorithm does not read (a likely typo), or settings
  that contradict each other (Momentum-Clustering's stable share without
  its stable freeze, stickiness or the worst-fit re-seed pick with the
  other assignment rule)."""
  for name, entries in _per_algorithm(cfg).items():
    if name not in used:
      raise ValueError(f"--per-algorithm names {name!r}, which this run does "
                       f"not train ({', '.join(used)}).")
    entry = REGISTRY[name]
    ignored = [k for k in entries
               if k not in entry.reads + RUN_SETTINGS]
    if ignored:
      raise ValueError(f"--per-algorithm {name}.{ignored[0]}: {entry.label} "
                       f"does not read {ignored[0]!r}; it reads "
                       f"{', '.join(entry.reads + RUN_SETTINGS)}.")
  for name in used:
    s = settings(cfg, name) if name in REGISTRY else None
    # Momentum-Clustering's stable share relaxes the stable freeze, which
    # `_mc` passes only with assigned balls: refused here, before any data
    # loads, in every experiment (the library would refuse it at build).
    if s is not None and s.get("mc_stable_share") and (
        s.mc_freeze_stable is None or s.mc_balls != "assigned"):
      raise ValueError(f"--mc-stable-share {s.mc_stable_share} ({name}) "
                       "needs the stable freeze: --mc-freeze-stable not "
                       "auto, with --mc-balls assigned.")
    # Stickiness (with assigned balls) and the worst-fit re-seed pick read
    # one assignment rule each; since session 12 the default is the loss
    # assignment, so `--mc-sticky` alone would fail at the library's build,
    # after the data loaded.
    if s is not None and s.get("mc_sticky") and s.mc_balls == "assigned" \
        and s.mc_assign == "loss":
      raise ValueError(f"--mc-sticky ({name}) keeps clients by their "
                       "momenta: it needs --mc-assign momentum (the default "
                       "is loss).")
    if s is not None and s.get("mc_reseed_pick") == "worst" and (
        s.mc_assign != "loss"):
      raise ValueError(f"--mc-reseed-pick worst ({name}) ranks clients by "
                       "their loss at their centre's model: it needs "
                       "--mc-assign loss.")


def build(name: str, ctx: Context,
          s: Optional[Settings] = None) -> prfl.algorithms.Algorithm:
  """Algorithm `name` for `ctx` with settings `s` (default: all defaults)."""
  if name not in REGISTRY:
    raise ValueError(f"unknown algorithm {name!r}; known: "
                     f"{', '.join(REGISTRY)}.")
  if s is None:
    s = settings(groups.Optim(), name)
  return REGISTRY[name].build(ctx, s)


def optimizer(s: Settings, momentum: Optional[float] = None):
  """SGD with heavy-ball momentum (`s.momentum`, or `momentum`)."""
  m = s.momentum if momentum is None else momentum
  return optax.sgd(s.lr, momentum=m or None)


def plan(s: Settings) -> prfl.ExecutionPlan:
  chunk = None if s.chunk_size == "all" else s.chunk_size
  return prfl.ExecutionPlan(chunk_size=chunk, kernel=s.kernel)


def aggregator(s: Settings, num_byzantine: int):
  """The robust aggregator of `s` (None for the plain mean)."""
  make = {
      "mean": lambda: None,
      "median": prfl.aggregators.median,
      "trimmed_mean": lambda: prfl.aggregators.trimmed_mean(s.trim_fraction),
      # The defender is told the number of Byzantine clients.
      "krum": lambda: prfl.aggregators.krum(num_byzantine),
      "geometric_median": lambda: prfl.aggregators.geometric_median(
          s.gm_iters),
      "centered_clipping": lambda: prfl.aggregators.centered_clipping(
          s.cc_radius, s.cc_iters),
  }
  return make[s.aggregator]()


_AGGREGATION = ("aggregator", "trim_fraction", "gm_iters", "cc_radius",
                "cc_iters")
_CLUSTERING = ("quantile", "num_iters")


@register("local", "Local")
def _local(ctx, s):
  return prfl.algorithms.local(ctx.loss_fn, optimizer(s))


@register("global", "Global (FedAvg)", reads=_AGGREGATION)
def _global(ctx, s):
  return prfl.algorithms.fedavg(ctx.loss_fn, optimizer(s), attack=ctx.attack,
                                aggregator=aggregator(s, ctx.num_byzantine))


@register("ditto", "Ditto", reads=("ditto_lambda", "ditto_momentum",
                                   "local_steps"))
def _ditto(ctx, s):
  """Ditto's optimizer has its own momentum (`ditto_momentum`, default 0:
  plain SGD, as in Li et al. 2021): with heavy-ball momentum 0.9 and lambda =
  1 its personal models diverged on Fashion-MNIST (personal loss 1.7 -> 11 in
  300 rounds, 4 x 5 clients). Its FedAvg part restarts the optimizer every
  round, so momentum acts there only with `local_steps` > 1."""
  return prfl.algorithms.ditto(
      ctx.loss_fn, optimizer(s, momentum=s.ditto_momentum),
      lam=s.ditto_lambda, local_steps=s.local_steps, attack=ctx.attack)


@register("ifca", "IFCA", reads=_AGGREGATION)
def _ifca(ctx, s):
  return prfl.algorithms.ifca(
      ctx.loss_fn, optimizer(s), num_clusters=ctx.num_clusters,
      attack=ctx.attack, **_initial_models(ctx),
      aggregator=aggregator(s, ctx.num_byzantine),
      true_clusters=ctx.clusters)


@register("ifca2", "IFCA (Option II)", reads=("local_steps",))
def _ifca2(ctx, s):
  return prfl.algorithms.ifca(
      ctx.loss_fn, optimizer(s), num_clusters=ctx.num_clusters, option=2,
      local_steps=s.local_steps, attack=ctx.attack, **_initial_models(ctx))


def _initial_models(ctx) -> dict:
  if ctx.init_models is not None:
    return {"init_models": ctx.init_models}
  return {"key": ctx.key}


@register("knn", "kNN-Per", reads=("knn_lambda", "knn_k", "knn_temperature"))
def _knn(ctx, s):
  """kNN-Per's training phase (FedAvg); its kNN evaluation is the
  experiment's (`experiments.training.knn_eval_fn`)."""
  return prfl.algorithms.knn_per(ctx.loss_fn, optimizer(s), attack=ctx.attack)


_FC = _CLUSTERING + ("groups", "fc_local_steps", "chunk_size", "kernel")
# FC's Byzantine defences (`prfl_jax.algorithms.fc_defence`): duplicate
# messages counted once, then each client limited to the median client's
# number of balls (docs/design.md, "Byzantine robustness of FC").
FC_DEFENCES = {"none": {}, "dedup": {"pre": True},
               "ball_cap": {"pre": True, "ball_cap": 1.0}}


@register("fc", "FC (ours)", reads=_FC)
def _fc(ctx, s):
  defence = FC_DEFENCES[s.get("fc_defence", "none")]
  radius = (prfl.quantile_radius(s.quantile) if ctx.radius is None
            else ctx.radius)
  grouping = None
  if s.get("fc_grouping") == "cluster_aware":
    grouping = prfl.algorithms.fc_groups.cluster_aware(
        quantile=s.get("aware_quantile"),
        random_share=s.get("aware_random_share"))
  return prfl.algorithms.federated_clustering(
      ctx.loss_fn, optimizer(s), radius=radius,
      num_iters=s.num_iters, num_groups=s.groups or 1,
      local_steps=s.fc_local_steps, attack=ctx.attack, plan=plan(s),
      pre_aggregator=(prfl.aggregators.cap_duplicates() if defence.get("pre")
                      else None), ball_cap=defence.get("ball_cap"),
      grouping=grouping, true_clusters=ctx.clusters)


register("fc_dedup", "FC + cap_duplicates", reads=_FC,
         fc_defence="dedup")(_fc)
register("fc_ball_cap", "FC + cap_duplicates + ball cap", reads=_FC,
         fc_defence="ball_cap")(_fc)
# Beyond the paper: each round's groups formed from the models, with a
# random share kept (`prfl_jax.algorithms.fc_groups.cluster_aware`).
register("fc_aware", "FC, cluster-aware groups",
         reads=_FC + ("aware_quantile", "aware_random_share"),
         fc_grouping="cluster_aware")(_fc)


@register("oracle", "Ground truth (oracle)")
def _oracle(ctx, s):
  return prfl.algorithms.oracle(ctx.loss_fn, optimizer(s),
                                clusters=ctx.clusters)


@register("cfl", "CFL", reads=("cfl_eps", "cfl_warmup", "local_steps"))
def _cfl(ctx, s):
  """CFL restarts its local optimizer every round: momentum acts only with
  `local_steps` > 1."""
  eps1, eps2 = s.cfl_eps
  return prfl.algorithms.cfl(
      ctx.loss_fn, optimizer(s), eps1=eps1, eps2=eps2,
      max_clusters=2 * ctx.num_clusters, local_steps=s.local_steps,
      warmup_rounds=s.cfl_warmup, attack=ctx.attack,
      true_clusters=ctx.clusters)


@register("hypcluster", "HypCluster", reads=("local_steps",))
def _hypcluster(ctx, s):
  return prfl.algorithms.hypcluster(
      ctx.loss_fn, optimizer(s), num_clusters=ctx.num_clusters,
      local_steps=s.local_steps, attack=ctx.attack, **_initial_models(ctx),
      true_clusters=ctx.clusters)


@register("myopic", "Myopic-Clustering", reads=_CLUSTERING + (
    "clustering_method",))
def _myopic(ctx, s):
  """`clustering_method="gram"` (the default) reads every distance of a round
  off one [N, N] Gram matrix: at N = 300 on the MNIST MLP a round takes 0.72 s
  instead of 5.3 s with "direct" (one core, `benchmarks/bench_myopic.py`);
  the results differ only by float rounding of the distances."""
  return prfl.algorithms.myopic_clustering(
      ctx.loss_fn, optimizer(s), num_clusters=ctx.num_clusters,
      radius=prfl.quantile_radius(s.quantile), num_iters=s.num_iters,
      attack=ctx.attack, method=s.clustering_method,
      true_clusters=ctx.clusters)


@register("mc", "Momentum-Clustering", reads=_CLUSTERING + (
    "clustering_method", "mc_alpha", "mc_lr_over_alpha", "mc_balls",
    "mc_quantile", "mc_sticky", "mc_warmup", "mc_seed_average",
    "mc_reseed", "mc_reseed_pick",
    "mc_bias_correction", "mc_freeze", "mc_freeze_stable",
    "mc_stable_share", "mc_assign"))
def _mc(ctx, s):
  """Momentum-Clustering's momentum is `m = alpha g + (1 - alpha) m` with
  alpha = 1 - momentum by default; with the step lr / alpha this is exactly
  heavy-ball SGD (lr, momentum) when every client is alone in its cluster, so
  it gets the same step size as the others. With `mc_balls="assigned"` the
  radius quantile is over each centre's own clients, hence 0.95 by default
  (`experiments/results/momentum_clustering/`); stickiness and the stable
  freeze apply to assigned balls only, so `mc_balls="all"` with `mc_warmup=0`,
  `mc_seed_average=False` is Algorithm 3 as written."""
  assigned = s.mc_balls == "assigned"
  alpha = 1.0 - s.momentum if s.mc_alpha is None else s.mc_alpha
  q = s.mc_quantile
  if q is None:
    q = 0.95 if s.mc_balls == "assigned" else s.quantile
  lr = s.lr / alpha if s.mc_lr_over_alpha else s.lr
  return prfl.algorithms.momentum_clustering(
      ctx.loss_fn, optax.sgd(lr), num_clusters=ctx.num_clusters,
      radius=prfl.quantile_radius(q), num_iters=s.num_iters, alpha=alpha,
      attack=ctx.attack, method=s.clustering_method, balls=s.mc_balls,
      sticky=s.mc_sticky and assigned,
      warmup_rounds=s.mc_warmup, seed_average=s.mc_seed_average,
      reseed=s.mc_reseed, reseed_pick=s.mc_reseed_pick,
      bias_correction=s.mc_bias_correction,
      freeze_after=s.mc_freeze,
      freeze_when_stable=s.mc_freeze_stable if assigned else None,
      stable_share=s.mc_stable_share, assign=s.mc_assign,
      true_clusters=ctx.clusters)


for _name, _agg, _label in (
    ("global_median", "median", "median"),
    ("global_trimmed_mean", "trimmed_mean", "trimmed mean"),
    ("global_krum", "krum", "Krum"),
    ("global_gm", "geometric_median", "geometric median"),
    ("global_cc", "centered_clipping", "centered clipping")):
  register(_name, f"Global + {_label}", reads=_AGGREGATION,
           aggregator=_agg)(_global)
register("ifca_median", "IFCA + median", reads=_AGGREGATION,
         aggregator="median")(_ifca)


@dataclasses.dataclass(frozen=True)
class Algorithms:
  """Which algorithms run, and settings for one of them alone."""
  algorithms: tuple[str, ...] = options.option(
      ("local", "global", "ditto", "ifca", "knn", "fc", "oracle"),
      "algorithms to run", choices=names())
  per_algorithm: dict = options.option(
      {}, "a setting for one algorithm alone, ALG.SETTING=VALUE (e.g. "
      "fc.rounds=300; repeatable; [per_algorithm.fc] in files)",
      choices=names(), groups=groups.SETTINGS)
