"""kNN-Per (Marfoq, Neglia, Vidal, Kameni and Vacher, 2022).

Training is plain FedAvg: `knn_per` returns `prfl_jax.algorithms.fedavg`'s
algorithm, so `state.params` is the global model copied to every client.
Personalization happens only at inference: client i keeps a datastore of
`(feature_fn(w, x), y)` over its own training data, and predicts

  p_i(y | x) = lam_i * p_kNN(y | x) + (1 - lam_i) * softmax(logits_fn(w, x)),
  p_kNN(y | x) ∝ sum_{(x', y') in kNN_k(x)} 1[y' = y] exp(-d(x, x') / T),

with `d` the squared Euclidean distance between features, the k nearest
neighbours found by exact search in JAX (`lax.top_k`, no faiss), and `lam_i`
chosen per client on held-out data from a grid (`knn_per_evaluate`).
"""

from typing import Any, Callable, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax

from prfl_jax.algorithms import base
from prfl_jax.algorithms import cluster_models
from prfl_jax.algorithms.fedavg import fedavg

PyTree = Any


def knn_per(loss_fn, optimizer: optax.GradientTransformation, *,
            local_steps: int = 1, attack=None) -> base.Algorithm:
  """kNN-Per's training phase: FedAvg of one global model.

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` for one client.
    optimizer: as in `fedavg`.
    local_steps: as in `fedavg`.
    attack: what Byzantine clients send, or None.

  Returns:
    `fedavg`'s `Algorithm(init, step)`; evaluate the personalized
    predictions with `knn_per_evaluate`.

  References:
    Marfoq et al., 2022, "Personalized Federated Learning through Local
    Memorization", Section 3 (kNN-Per).
  """
  cluster_models.check_callable(loss_fn, "loss_fn")
  return fedavg(loss_fn, optimizer, local_steps=local_steps, attack=attack)


def knn_probs(query: jax.Array, store: jax.Array, store_labels: jax.Array, *,
              k: int, num_classes: int, temperature=1.0,
              store_mask=None) -> jax.Array:
  """kNN class distribution of every query over a datastore.

  Args:
    query: `[M, F]` query features.
    store: `[S, F]` datastore features (S >= k).
    store_labels: `[S]` int labels.
    k: number of neighbours.
    num_classes: C.
    temperature: T of the kernel `exp(-d / T)`.
    store_mask: optional `[S]` bool, False for padding entries (never
      neighbours).

  Returns:
    `[M, C]` probabilities.
  """
  # HIGHEST: the expansion cancels, and TF32/bf16 would reorder neighbours.
  cross = jnp.matmul(query, store.T, precision=lax.Precision.HIGHEST)
  d2 = (jnp.sum(query ** 2, 1)[:, None] - 2 * cross +
        jnp.sum(store ** 2, 1)[None, :])
  d2 = jnp.maximum(d2, 0.0)
  if store_mask is not None:
    d2 = jnp.where(store_mask[None, :], d2, jnp.inf)
  neg, idx = lax.top_k(-d2, k)  # [M, k]
  weights = jax.nn.softmax(neg / temperature, axis=-1)
  onehot = jax.nn.one_hot(store_labels[idx], num_classes, dtype=query.dtype)
  return jnp.einsum("mk,mkc->mc", weights, onehot)


def knn_per_predict(global_probs: jax.Array, query: jax.Array,
                    store: jax.Array, store_labels: jax.Array, *, lam,
                    k: int, num_classes: int, temperature=1.0,
                    store_mask=None) -> jax.Array:
  """`lam * p_kNN + (1 - lam) * p_global` for every query, `[M, C]`.

  Args:
    global_probs: `[M, C]` the global model's softmax on the queries.
    query, store, store_labels, k, num_classes, temperature, store_mask: as
      in `knn_probs`.
    lam: interpolation weight of the kNN distribution, in [0, 1].
  """
  p_knn = knn_probs(query, store, store_labels, k=k, num_classes=num_classes,
                    temperature=temperature, store_mask=store_mask)
  return lam * p_knn + (1.0 - lam) * global_probs


def _check_grid(lambdas) -> jax.Array:
  grid = np.asarray(lambdas, np.float64)
  if grid.ndim != 1 or grid.size == 0 or np.any(~np.isfinite(grid)) or np.any(
      (grid < 0) | (grid > 1)):
    raise ValueError(
        f"`lambdas` must be a non-empty 1-D grid of values in [0, 1], got "
        f"{lambdas!r}.")
  return jnp.asarray(grid, jnp.float32)


def knn_per_evaluate(logits_fn: Callable, feature_fn: Callable, params: PyTree,
                     train: tuple, val: tuple, test: tuple, *, k: int,
                     num_classes: int,
                     lambdas: Sequence[float] = tuple(np.linspace(0, 1, 11)),
                     temperature=1.0) -> dict:
  """kNN-Per accuracy and loss of ONE client, `lam` chosen on `val`.

  Vmap it over clients (params, train, val, test with a leading client axis)
  for the whole federation.

  Args:
    logits_fn: `logits_fn(params, x [M, ...]) -> [M, C]`, the global model.
    feature_fn: `feature_fn(params, x [M, ...]) -> [M, F]` (e.g. the global
      model's penultimate layer).
    params: the global model (unstacked).
    train: `(x [S, ...], y [S])`, the client's datastore (its training data).
    val: `(x [V, ...], y [V])` held-out data choosing `lam`.
    test: `(x [M, ...], y [M])`.
    k: neighbours (<= S).
    num_classes: C.
    lambdas: grid of `lam` values in [0, 1]; the first best one on `val`
      (accuracy, ties broken by the lower loss) is used.
    temperature: kernel temperature.

  Returns:
    `{"accuracy", "loss", "lambda", "global_accuracy"}` scalars on `test`
    (`loss` is the negative log-likelihood of the interpolated distribution).

  Raises:
    ValueError: on a bad `k`, `num_classes` or `lambdas` grid.
  """
  base.check_positive_int(k, "k")
  base.check_positive_int(num_classes, "num_classes", minimum=2)
  grid = _check_grid(lambdas)
  if k > np.shape(train[1])[0]:
    raise ValueError(
        f"`k`={k} exceeds the datastore size {np.shape(train[1])[0]}.")
  store = feature_fn(params, train[0])

  def parts(x):
    p_global = jax.nn.softmax(logits_fn(params, x), axis=-1)
    p_knn = knn_probs(feature_fn(params, x), store, train[1], k=k,
                      num_classes=num_classes, temperature=temperature)
    return p_global, p_knn

  def scores(p_global, p_knn, y, lam):
    p = lam * p_knn + (1.0 - lam) * p_global
    acc = jnp.mean(jnp.argmax(p, -1) == y)
    nll = -jnp.mean(jnp.log(jnp.take_along_axis(p, y[:, None], 1)[:, 0]
                            + 1e-12))
    return acc, nll

  vg, vk = parts(val[0])
  val_acc, val_nll = jax.vmap(lambda lam: scores(vg, vk, val[1], lam))(grid)
  best = jnp.lexsort((val_nll, -val_acc))[0]
  lam = grid[best]
  tg, tk = parts(test[0])
  acc, nll = scores(tg, tk, test[1], lam)
  global_acc = jnp.mean(jnp.argmax(tg, -1) == test[1])
  return {"accuracy": acc, "loss": nll, "lambda": lam,
          "global_accuracy": global_acc}
