"""`train`: a federated run as jitted `lax.scan` chunks between evaluations.

Rounds are grouped into chunks of `eval_every` rounds; each chunk is one XLA
program (a `lax.scan` over rounds, batches sampled inside it) that ends with a
personalized evaluation: every client's model on its own test data, averaged
over benign clients and per true cluster. Between chunks the host prints
progress (round, metrics, time left) and may save a checkpoint. The chunk
compiles once; a shorter last chunk (when `eval_every` does not divide
`num_rounds`) compiles once more.

Round r (counted from 0 over the whole run, i.e. `state.round` before it)
draws all its randomness (mini-batches, FC's groups, attack noise) from
`jax.random.fold_in(key, r)`: results depend neither on `eval_every` nor on
where a run was stopped and resumed.
"""

import math
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import checkpoint
from prfl_jax import sharding
from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models
from prfl_jax import participation
from prfl_jax.data import federated
from prfl_jax.data import ragged
from prfl_jax.participation import driver

PyTree = Any
EvalFn = Callable[[PyTree, PyTree], dict]


class TrainResult(NamedTuple):
  """Output of `train`."""
  state: Any  # final algorithm state (params leaves [N, ...]).
  history: dict  # name -> np.ndarray; see `train`.


def personalized_eval(eval_fn: EvalFn, params: PyTree, test: PyTree,
                      clusters: jax.Array, byzantine: jax.Array,
                      num_clusters: int) -> dict:
  """Each client's model on its own test data, summarised.

  Args:
    eval_fn: `eval_fn(params, test) -> {name: scalar}` for one client.
    params: leaves `[N, ...]`.
    test: leaves `[N, ...]`.
    clusters: `[N]` true clusters.
    byzantine: `[N]` bool; Byzantine clients are left out.
    num_clusters: K.

  Returns:
    `{name: scalar mean over benign clients, name + "/per_cluster": [K]}`;
    a cluster without benign clients (no client has its id, or all of them
    are Byzantine) reports NaN, never a made-up 0.
  """
  values = jax.vmap(eval_fn)(params, test)
  weights = (~byzantine).astype(jnp.float32)
  out = {}
  for name, v in values.items():
    v = jnp.where(byzantine, 0.0, v.astype(jnp.float32))  # NaN-safe.
    out[name] = base.benign_mean(v, byzantine)
    means, totals = cluster_models.segment_mean(v, clusters, num_clusters,
                                                weights)
    out[name + "/per_cluster"] = jnp.where(totals > 0, means, jnp.nan)
  return out


def check_eval_fn(eval_fn: EvalFn, params: PyTree, test: PyTree):
  """Raises TypeError unless `eval_fn` returns a dict of scalars.

  Traces `eval_fn` on one client's shapes with `jax.eval_shape` (nothing is
  compiled or run).

  Args:
    eval_fn: `eval_fn(params, test) -> {name: scalar}` for one client.
    params: leaves `[N, ...]`.
    test: leaves `[N, ...]`.
  """
  one = lambda tree: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), tree)
  out = jax.eval_shape(eval_fn, one(params), one(test))
  if not isinstance(out, dict):
    raise TypeError(
        "`eval_fn(params, test)` must return a dict {name: scalar} for one "
        f"client, got {type(out).__name__}.")
  for name, v in out.items():
    if (not isinstance(name, str) or not isinstance(v, jax.ShapeDtypeStruct)
        or v.shape != () or
        not jnp.issubdtype(v.dtype, jnp.number) and v.dtype != bool):
      raise TypeError(
          "`eval_fn(params, test)` must return a dict {name: scalar} for one "
          f"client; entry {name!r} is {v}.")


def _check_clusters(clusters: np.ndarray):
  if not (np.issubdtype(clusters.dtype, np.integer) and
          (clusters.size == 0 or clusters.min() >= 0)):
    raise ValueError(
        "`data.clusters` must hold non-negative integer cluster ids, got "
        f"dtype {clusters.dtype} with values {np.unique(clusters)[:10]}.")


def _format(metrics: dict) -> str:
  parts = []
  for name, v in sorted(metrics.items()):
    if np.ndim(v) == 0:
      parts.append(f"{name}={float(v):.4g}")
  return " ".join(parts)


def train(algorithm: base.Algorithm, params: PyTree,
          data: federated.FederatedData, *, num_rounds: int, key: jax.Array,
          batch_size: Optional[int] = None, eval_fn: Optional[EvalFn] = None,
          eval_every: Optional[int] = None, byzantine=None,
          verbose: bool = True, log: Callable[[str], None] = None,
          initial_state: Any = None, checkpoint_path: Optional[str] = None,
          donate: bool = True, state_on_host=False,
          eval_block: int = 1024) -> TrainResult:
  """Runs `num_rounds` rounds of `algorithm` on `data`.

  Args:
    algorithm: an `Algorithm(init, step)`.
    params: initial models, leaves `[N, ...]` (see `prfl_jax.tree.broadcast`);
      may be None when `initial_state` is given.
    data: the federation; `data.train` leaves `[N, M, ...]`.
    num_rounds: number of rounds T.
    key: PRNG key; the same key gives the same numbers. Round r's randomness
      is `fold_in(key, r)`, so a resumed run (same `key`) continues the
      random stream of the uninterrupted one.
    batch_size: examples per client per round (None: all M). With
      `data.num_examples`, batches are `prfl.data.Padded` (see
      `prfl.data.sample_batch`).
    eval_fn: `eval_fn(params, test) -> {name: scalar}` for one client.
    eval_every: rounds per compiled chunk / between evaluations (default: about
      20 evaluations per run); does not change the results.
    byzantine: optional `[N]` bool mask of malicious clients. It is part of
      the state: with `initial_state`, it may only repeat the state's mask.
    initial_state: resume from this state (e.g. `prfl.checkpoint.restore`d)
      instead of `algorithm.init(params, byzantine=byzantine)`; `num_rounds`
      more rounds are run and the history's rounds continue its count.
    checkpoint_path: if set, a directory where `prfl.checkpoint.save` stores
      the state after every chunk (orbax, with checksums), so an interrupted
      run can resume; checked writable before the first round. A fresh run
      (no `initial_state`) needs a directory without checkpoints.
    verbose: print progress after every chunk.
    log: where progress lines go (default: stderr).
    donate: donate each chunk's input state to XLA, so that the new state is
      written over the old one: a run then holds one copy of the state (e.g.
      the `[N, ...]` params and optimizer state) instead of two. `train` first
      copies the initial state once, so the arrays passed in (`params`,
      `initial_state`) stay valid. Set False on a backend without donation.

  Returns:
    `TrainResult(state, history)`. `history` holds numpy arrays:
    `"round"` `[T]` and `"train/<metric>"` `[T]` for every step metric;
    `"eval_round"` `[E]` (0 and every chunk end), `"eval/<name>"` `[E]`,
    `"eval/<name>/per_cluster"` `[E, K]` (NaN for a cluster id without
    benign clients) and `"elapsed_s"` `[E]`.

  Raises:
    ValueError/TypeError: on inconsistent arguments (also `eval_fn` not
      returning a dict of scalars, a `byzantine` mask that contradicts
      `initial_state`'s), before compiling.
    OSError: if `checkpoint_path` is not writable, before the first round.
  """
  if not isinstance(algorithm, (base.Algorithm, participation.Cohort)):
    raise TypeError(f"`algorithm` must be a prfl_jax Algorithm, got "
                    f"{type(algorithm)}.")
  base.check_positive_int(num_rounds, "num_rounds")
  if eval_every is None:
    eval_every = max(1, num_rounds // 20)
  base.check_positive_int(eval_every, "eval_every")
  eval_every = min(eval_every, num_rounds)
  if eval_fn is not None and not callable(eval_fn):
    raise TypeError(f"`eval_fn` must be callable, got {type(eval_fn)}.")
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  if (isinstance(algorithm, participation.Cohort) or
      isinstance(data, ragged.HostData) or state_on_host):
    if not isinstance(algorithm, participation.Cohort):
      raise TypeError(
          "host data and `state_on_host` need a cohort algorithm, "
          "prfl.participation.cohort(algorithm, cohort_size=C).")
    base.check_positive_int(eval_block, "eval_block")
    clusters = np.asarray(data.clusters)
    _check_clusters(clusters)
    runner = driver.setup(
        algorithm, params, data, key=key, batch_size=batch_size,
        eval_fn=eval_fn, byzantine=byzantine, initial_state=initial_state,
        state_on_host=state_on_host, donate=donate, eval_block=eval_block,
        clusters=clusters,
        num_clusters=int(clusters.max()) + 1 if clusters.size else 1)
    return _loop(runner, num_rounds=num_rounds, eval_every=eval_every,
                 checkpoint_path=checkpoint_path,
                 fresh=initial_state is None, verbose=verbose, log=log)
  if params is None and initial_state is not None:
    params = initial_state.params
  n = federated.check_data(data)
  n_params = base.init_params(params)
  if n_params != n:
    raise ValueError(f"`params` has {n_params} clients but `data` has {n}.")
  federated.check_batch_size(batch_size, data.train)
  clusters = sharding.to_host(data.clusters)
  _check_clusters(clusters)
  num_clusters = int(clusters.max()) + 1 if clusters.size else 1
  if eval_fn is not None:
    check_eval_fn(eval_fn, params, data.test)

  if initial_state is None:
    state = algorithm.init(params, byzantine=byzantine)
  else:
    state = initial_state
    if byzantine is not None:
      saved = sharding.to_host(state.byzantine)
      if (np.shape(byzantine) != saved.shape or
          not np.array_equal(np.asarray(byzantine, bool), saved)):
        raise ValueError(
            "`byzantine` differs from `initial_state.byzantine`; the mask is "
            "part of the state, so a resumed run keeps it: leave `byzantine` "
            "out (or pass the state's mask), or start a new run.")

  def evaluate(state, test):
    if eval_fn is None:
      return {}
    return personalized_eval(eval_fn, state.params, test, clusters,
                             state.byzantine, num_clusters)

  def chunk(state, first_round, train_data, num_examples, test, length):
    def body(state, round_index):
      round_key = jax.random.fold_in(key, round_index)
      batch_key, step_key = jax.random.split(round_key)
      batch = federated.sample_batch(batch_key, train_data, batch_size,
                                     num_examples)
      return algorithm.step(state, batch, step_key)
    rounds = first_round + jnp.arange(length, dtype=jnp.int32)
    state, metrics = lax.scan(body, state, rounds)
    return state, metrics, evaluate(state, test)

  if donate:  # Own the state, so that donating it never deletes the caller's.
    state = jax.tree.map(
        lambda x: x.copy() if isinstance(x, jax.Array) else x, state)
  run_chunk = jax.jit(chunk, static_argnums=5,
                      donate_argnums=0 if donate else ())
  run_eval = jax.jit(evaluate)

  def run(state, first_round, length):
    state, metrics, ev = run_chunk(state, np.int32(first_round), data.train,
                                   data.num_examples, data.test, length)
    return state, metrics, ev

  runner = driver.Runner(state, run, lambda s: run_eval(s, data.test),
                         lambda s: s)
  return _loop(runner, num_rounds=num_rounds, eval_every=eval_every,
               checkpoint_path=checkpoint_path,
               fresh=initial_state is None, verbose=verbose, log=log)


def _loop(runner, *, num_rounds: int, eval_every: int,
          checkpoint_path: Optional[str], fresh: bool, verbose: bool,
          log: Callable[[str], None]) -> TrainResult:
  """Runs the chunks, evaluates, checkpoints and logs; builds the history."""
  state = runner.state
  start_round = int(sharding.to_host(runner.result(state).round))
  if checkpoint_path is not None:
    checkpoint.check_writable(checkpoint_path)
    saved_rounds = checkpoint.rounds(checkpoint_path)
    if fresh and saved_rounds:
      raise ValueError(
          f"`checkpoint_path` {checkpoint_path!r} already holds checkpoints "
          f"of rounds {saved_rounds}: resume that run with `initial_state="
          "prfl.checkpoint.restore(path, target)`, or use another directory.")
  num_chunks = math.ceil(num_rounds / eval_every)
  start = time.perf_counter()
  evals = [sharding.to_host(runner.evaluate(state))]
  elapsed = [0.0]
  eval_rounds = [start_round]
  train_metrics = []
  done = 0
  for _ in range(num_chunks):
    length = min(eval_every, num_rounds - done)
    out = runner.run_chunk(state, start_round + done, length)
    state, metrics = out[:2]
    ev = out[2] if len(out) > 2 else runner.evaluate(state)
    metrics, ev = sharding.to_host((metrics, ev))
    done += length
    train_metrics.append(metrics)
    evals.append(ev)
    eval_rounds.append(start_round + done)
    if checkpoint_path is not None:
      checkpoint.save(checkpoint_path, runner.result(state))
    now = time.perf_counter() - start
    elapsed.append(now)
    if verbose:
      left = now / done * (num_rounds - done)
      last = {f"train/{k}": v[-1] for k, v in metrics.items()}
      last.update({f"eval/{k}": v for k, v in ev.items()})
      log(f"[round {start_round + done}/{start_round + num_rounds}] "
          f"{_format(last)} | {now:.1f}s elapsed, ~{left:.1f}s left")

  history = {"round": np.arange(start_round + 1,
                               start_round + num_rounds + 1)}
  for name in (train_metrics[0] if train_metrics else {}):
    history[f"train/{name}"] = np.concatenate(
        [np.asarray(m[name]) for m in train_metrics])
  history["eval_round"] = np.asarray(eval_rounds)
  history["elapsed_s"] = np.asarray(elapsed)
  for name in evals[0]:
    history[f"eval/{name}"] = np.stack([np.asarray(e[name]) for e in evals])
  return TrainResult(runner.result(state), history)
