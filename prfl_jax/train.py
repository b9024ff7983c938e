"""`train`: a federated run as jitted `lax.scan` chunks between evaluations.

Rounds are grouped into chunks of `eval_every` rounds; each chunk is one XLA
program (a `lax.while_loop` over rounds, batches sampled inside it) that ends
with a personalized evaluation: every client's model on its own test data,
averaged over benign clients and per true cluster. Between chunks the host
prints progress (round, metrics, time left) and may save a checkpoint. The
chunk compiles once; a shorter last chunk runs the same program.

Round r (counted from 0 over the whole run, i.e. `state.round` before it)
draws all its randomness (mini-batches, FC's groups, attack noise) from
`jax.random.fold_in(key, r)`, and the number of rounds a chunk runs is known
only at run time, so every round runs the same compiled loop body whatever
the chunk length (a one-round `lax.scan` is inlined and fused differently,
which moved results in the last bit): results depend neither on `eval_every`
nor on where a run was stopped and resumed.
"""

import math
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
from jax.extend import core as jax_core
from jax import lax
import jax.numpy as jnp
import numpy as np

from prfl_jax import checkpoint
from prfl_jax import sharding
from prfl_jax import train_checks as checks
from prfl_jax import validation
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
    eval_every: rounds per compiled chunk / between evaluations; does not
      change the results. Default: `ceil(R / 20)` where R counts the rounds
      from round 0 to the end of this call (`initial_state.round +
      num_rounds`), so a run evaluates about 20 times, and a resume keeps the
      chunk length of the run it continues.
    byzantine: optional `[N]` bool mask of malicious clients. It is part of
      the state: with `initial_state`, it may only repeat the state's mask.
    initial_state: resume from this state (e.g. `prfl.checkpoint.restore`d)
      instead of `algorithm.init(params, byzantine=byzantine)`; `num_rounds`
      more rounds are run and the history's rounds continue its count.
    checkpoint_path: if set, a directory where `prfl.checkpoint.save` stores
      the state after every chunk (orbax, with checksums), so an interrupted
      run can resume; checked writable before the first round. A fresh run
      (no `initial_state`) needs a directory without checkpoints. Every
      checkpoint records what a resume must repeat (`key`, `batch_size`, the
      training data's shapes, the algorithm and its settings); a resume into
      the same directory that differs in any of them is refused, naming it.
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
      `initial_state`'s, an `initial_state` that is not `algorithm`'s or
      not of `data`'s clients, clients without training examples, NaN or
      Inf in the real rows of a `FederatedData`), before compiling. Streamed
      `HostData` (possibly larger than memory) is checked for empty clients
      but not read for NaN.
    OSError: if `checkpoint_path` is not writable, before the first round.
  """
  if not isinstance(algorithm, (base.Algorithm, participation.Cohort)):
    raise TypeError(f"`algorithm` must be a prfl_jax Algorithm, got "
                    f"{type(algorithm)}.")
  base.check_positive_int(num_rounds, "num_rounds")
  validation.check_key(key)
  if eval_every is not None:
    base.check_positive_int(eval_every, "eval_every")
  if eval_fn is not None and not callable(eval_fn):
    raise TypeError(f"`eval_fn` must be callable, got {type(eval_fn)}.")
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  on_host_data = isinstance(data, ragged.HostData)
  if on_host_data:
    n = ragged.check_host_data(data)
  else:
    n = federated.check_data(data)
    checks.check_examples(data)
  if initial_state is not None:
    checks.check_resume(algorithm, initial_state, byzantine, n)
  clusters = sharding.to_host(data.clusters)
  checks.check_clusters(clusters)
  num_clusters = int(clusters.max()) + 1 if clusters.size else 1
  record = lambda: checkpoint.describe_run(
      algorithm, key=key, batch_size=batch_size, train=data.train,
      counts=data.train.counts if on_host_data else data.num_examples)
  if (isinstance(algorithm, participation.Cohort) or on_host_data or
      state_on_host):
    if not isinstance(algorithm, participation.Cohort):
      raise TypeError(
          "host data and `state_on_host` need a cohort algorithm, "
          "prfl.participation.cohort(algorithm, cohort_size=C).")
    base.check_positive_int(eval_block, "eval_block")
    runner = driver.setup(
        algorithm, params, data, key=key, batch_size=batch_size,
        eval_fn=eval_fn, byzantine=byzantine, initial_state=initial_state,
        state_on_host=state_on_host, donate=donate, eval_block=eval_block,
        clusters=clusters, num_clusters=num_clusters)
    start_round = int(sharding.to_host(runner.result(runner.state).round))
    return _loop(runner, num_rounds=num_rounds, start_round=start_round,
                 eval_every=checks.resolve_eval_every(
                     eval_every, start_round, num_rounds),
                 checkpoint_path=checkpoint_path,
                 run_record=record(), fresh=initial_state is None,
                 verbose=verbose, log=log)
  if params is None and initial_state is not None:
    params = initial_state.params
  n_params = base.init_params(params)
  if n_params != n:
    raise ValueError(f"`params` has {n_params} clients but `data` has {n}.")
  federated.check_batch_size(batch_size, data.train)
  if eval_fn is not None:
    check_eval_fn(eval_fn, params, data.test)

  if initial_state is None:
    state = algorithm.init(params, byzantine=byzantine)
  else:
    state = initial_state
  start_round = int(sharding.to_host(state.round))
  eval_every = checks.resolve_eval_every(eval_every, start_round, num_rounds)

  def evaluate(state, test, clusters):
    if eval_fn is None:
      return {}
    return personalized_eval(eval_fn, state.params, test, clusters,
                             state.byzantine, num_clusters)

  # The key and the true clusters are arguments, not constants: runs that
  # differ only in them (seeds, tasks) share one program, which JAX's
  # persistent compilation cache then compiles once.
  def chunk(state, key, first_round, num, train_data, num_examples, test,
            clusters, length):
    # Rounds first_round .. first_round + num - 1 (num <= length, a runtime
    # value); metrics `[length, ...]`, rows past num unused.
    def body(state, round_index):
      round_key = jax.random.fold_in(key, round_index)
      batch_key, step_key = jax.random.split(round_key)
      batch = federated.sample_batch(batch_key, train_data, batch_size,
                                     num_examples)
      return algorithm.step(state, batch, step_key)

    # `step` is traced once: its jaxpr gives the metrics' shapes (for the
    # buffer the loop writes into) and is what the loop runs.
    jaxpr, out_shapes = jax.make_jaxpr(body, return_shape=True)(state,
                                                                first_round)
    run_body = jax_core.jaxpr_as_fun(jaxpr)
    out_tree = jax.tree.structure(out_shapes)

    def one_round(carry):
      round_index, state, metrics = carry
      state, values = jax.tree.unflatten(
          out_tree, run_body(*jax.tree.leaves((state, round_index))))
      metrics = jax.tree.map(lambda m, v: m.at[round_index - first_round].set(v),
                             metrics, values)
      return round_index + 1, state, metrics

    shapes = out_shapes[1]
    metrics = jax.tree.map(lambda s: jnp.zeros((length,) + s.shape, s.dtype),
                           shapes)
    _, state, metrics = lax.while_loop(
        lambda carry: carry[0] < first_round + num, one_round,
        (first_round, state, metrics))
    return state, metrics, evaluate(state, test, clusters)

  # On a mesh, the state starts and stays where its layout puts it: client
  # leaves split like the data, the rest replicated. Left to XLA, an
  # uncommitted first state and a replicated output (the momentum) made the
  # second chunk compile again.
  state, layout = sharding.place_like(state, data.train, n)
  if donate:  # Own the state, so that donating it never deletes the caller's.
    state = jax.tree.map(
        lambda x: x.copy() if isinstance(x, jax.Array) else x, state)
  run_chunk = jax.jit(
      chunk, static_argnums=8, donate_argnums=0 if donate else (),
      out_shardings=None if layout is None else (layout, None, None))
  run_eval = jax.jit(evaluate)
  clusters = clusters.astype(np.int32)

  def run(state, first_round, length):
    return run_chunk(state, key, np.int32(first_round), np.int32(length),
                     data.train, data.num_examples, data.test, clusters,
                     eval_every)

  runner = driver.Runner(state, run,
                         lambda s: run_eval(s, data.test, clusters),
                         lambda s: s)
  return _loop(runner, num_rounds=num_rounds, start_round=start_round,
               eval_every=eval_every, checkpoint_path=checkpoint_path,
               run_record=record(), fresh=initial_state is None,
               verbose=verbose, log=log)


def _loop(runner, *, num_rounds: int, start_round: int,
          eval_every: int, checkpoint_path: Optional[str],
          run_record: dict, fresh: bool, verbose: bool,
          log: Callable[[str], None]) -> TrainResult:
  """Runs the chunks, evaluates, checkpoints and logs; builds the history.

  `eval_every` is the resolved chunk length
  (`train_checks.resolve_eval_every`), which the dense path also compiles in.
  """
  if checkpoint_path is not None:
    checkpoint.check_writable(checkpoint_path)
    saved_rounds = checkpoint.rounds(checkpoint_path)
    if fresh and saved_rounds:
      raise ValueError(
          f"`checkpoint_path` {checkpoint_path!r} already holds checkpoints "
          f"of rounds {saved_rounds}: resume that run with `initial_state="
          "prfl.checkpoint.restore(path, target)`, or use another directory.")
    checkpoint.check_same_run(
        checkpoint.recorded_run(checkpoint_path, start_round), run_record,
        f"{checkpoint_path}/{start_round}")
  state = runner.state
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
    metrics = {name: m[:length] for name, m in metrics.items()}
    done += length
    train_metrics.append(metrics)
    evals.append(ev)
    eval_rounds.append(start_round + done)
    if checkpoint_path is not None:
      checkpoint.save(checkpoint_path, runner.result(state), run=run_record)
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
