"""Grid cells that share one compiled program: one vmapped run per attack.

The protocol's runs of one algorithm under one attack differ only in their
arrays: the Byzantine mask (the fraction), the clients' data (label-flipped
or not) and the true clusters. `train_cells` stacks C such federations and
trains them as one XLA program, `jax.vmap` over the cells of the same round
loop `prfl.train` runs, so a grid compiles once per (algorithm, attack)
instead of once per run, and each small operation does C cells' work.

Cell c draws exactly `prfl.train`'s random stream with key `keys[c]` (round
r: `fold_in(key, r)` split into the batch and the step keys), so each cell
repeats its separate run up to float rounding of the batched operations.
"""

import time
from typing import Callable, Optional, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from prfl_jax.train import personalized_eval


def stack(feds: Sequence[prfl.data.Federation]):
  """`(data, byzantine)`: the federations' arrays with a leading cell axis.

  Returns:
    `prfl.data.FederatedData` with leaves `[C, N, ...]` and the masks
    `[C, N]` bool.

  Raises:
    ValueError: if the federations' arrays differ in shape or dtype, or
      only some carry `num_examples` (they could not share a program).
  """
  if not feds:
    raise ValueError("`feds` must hold at least one federation.")
  trees = [(f.data, np.asarray(f.byzantine, bool)) for f in feds]
  first = jax.tree.structure(trees[0])
  spec = lambda t: [(np.shape(x), np.asarray(x).dtype)
                    for x in jax.tree.leaves(t)]
  for i, t in enumerate(trees[1:], 1):
    if jax.tree.structure(t) != first or spec(t) != spec(trees[0]):
      raise ValueError(
          f"federation {i} differs from federation 0 in its arrays' shapes "
          "or dtypes (or in carrying `num_examples`): cells of one program "
          "need the same shapes.")
  return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]),
                      *trees)


def train_cells(algorithm: prfl.algorithms.Algorithm, params, data, byzantine,
                *, num_rounds: int, keys: jax.Array,
                batch_size: Optional[int], eval_fn: Callable,
                num_clusters: int, eval_every: int,
                log: Callable[[str], None] = lambda s: None) -> list:
  """Trains C federations at once, one vmapped program per chunk of rounds.

  Args:
    algorithm: an `Algorithm(init, step)` every cell runs.
    params: initial models shared by every cell, leaves `[N, ...]`.
    data: `FederatedData` with leaves `[C, N, ...]` (`stack`).
    byzantine: `[C, N]` bool masks.
    num_rounds: rounds T of every cell.
    keys: `[C]` PRNG keys, `prfl.train`'s `key` of each cell.
    batch_size: examples per client per round (None: all).
    eval_fn: `eval_fn(params, test) -> {name: scalar}` for one client.
    num_clusters: K of the true clusters (`data.clusters` in `[0, K)`).
    eval_every: rounds per chunk; T must be a multiple of it.
    log: where one line per chunk goes.

  Returns:
    one `prfl.TrainResult` per cell, its history with `prfl.train`'s keys
    (`"round"`, `"train/<metric>"`, `"eval_round"`, `"eval/<name>"`,
    `"eval/<name>/per_cluster"`, `"elapsed_s"`: the shared wall clock).

  Raises:
    ValueError: on counts that do not fit, before compiling.
  """
  prfl.algorithms.base.check_positive_int(num_rounds, "num_rounds")
  prfl.algorithms.base.check_positive_int(eval_every, "eval_every")
  if num_rounds % eval_every:
    raise ValueError(f"`num_rounds` {num_rounds} must be a multiple of "
                     f"`eval_every` {eval_every}.")
  c = np.shape(byzantine)[0]
  if np.shape(keys)[:1] != (c,):
    raise ValueError(f"`keys` must hold one key per cell ({c}), got shape "
                     f"{np.shape(keys)}.")

  def evaluate(state, test, clusters):
    return personalized_eval(
        eval_fn, state.params, test, clusters, state.byzantine, num_clusters)

  def init(mask, test, clusters):
    state = algorithm.init(params, byzantine=mask)
    return state, evaluate(state, test, clusters)

  def chunk(state, key, cell, first_round):
    def body(state, round_index):
      batch_key, step_key = jax.random.split(jax.random.fold_in(key,
                                                                round_index))
      batch = prfl.data.sample_batch(batch_key, cell.train, batch_size,
                                     cell.num_examples)
      return algorithm.step(state, batch, step_key)
    state, metrics = lax.scan(body, state,
                              first_round + jnp.arange(eval_every))
    return state, metrics, evaluate(state, cell.test, cell.clusters)

  run_init = jax.jit(jax.vmap(init))
  run_chunk = jax.jit(jax.vmap(chunk, in_axes=(0, 0, 0, None)),
                      donate_argnums=0)
  data = jax.device_put(data)
  start = time.perf_counter()
  state, first = run_init(jax.device_put(np.asarray(byzantine, bool)),
                         data.test, data.clusters)
  evals, metrics, elapsed = [first], [], [0.0]
  for done in range(0, num_rounds, eval_every):
    state, m, ev = run_chunk(state, keys, data, np.int32(done))
    metrics.append(m)
    evals.append(ev)
    elapsed.append(time.perf_counter() - start)
    shown = " ".join(f"eval/{k}=" + ",".join(f"{v:.4g}" for v in x)
                     for k, x in sorted(jax.device_get(ev).items())
                     if np.ndim(x) == 1)
    log(f"[round {done + eval_every}/{num_rounds}] {c} cells: {shown} | "
        f"{elapsed[-1]:.1f}s elapsed")
  metrics, evals, state = jax.device_get((metrics, evals, state))
  results = []
  for i in range(c):
    history = {"round": np.arange(1, num_rounds + 1),
               "eval_round": np.arange(0, num_rounds + 1, eval_every),
               "elapsed_s": np.asarray(elapsed)}
    for name in metrics[0]:
      history[f"train/{name}"] = np.concatenate([m[name][i] for m in metrics])
    for name in evals[0]:
      history[f"eval/{name}"] = np.stack([e[name][i] for e in evals])
    results.append(prfl.TrainResult(jax.tree.map(lambda x: x[i], state),
                                    history))
  return results
