"""Padding is explicit (issue 21): never read off the values of the data.

The defects these tests guard: `sample_batch` drew every example whose integer
label was negative last (a +-1 label's -1 class vanished from mini-batches),
and `prfl.models.mlp_classifier_loss` trained on `federate`'s padding rows.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import models
from tests import tolerances


def _pm1_federation(n=4, m=64, dim=5, seed=0):
  """Linearly separable +-1 labels (int32), about half of them -1."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=dim)
  x = rng.normal(size=(n, m, dim)).astype(np.float32)
  x[..., 0] = 1.0  # An intercept: with only +1 labels it grows for ever.
  w[0] = 0.0
  y = np.where(x @ w > 0, 1, -1).astype(np.int32)
  test = (x[:, :32], y[:, :32])
  return prfl.data.FederatedData(train=(x, y), test=test,
                                 clusters=np.zeros(n, np.int32))


def _logistic_loss(w, batch):
  x, y = batch
  return jnp.mean(jnp.logaddexp(0.0, -y * (x @ w)))


def _logistic_eval(w, batch):
  x, y = batch
  return {"accuracy": jnp.mean(jnp.sign(x @ w) == y)}


def test_pm1_labels_are_drawn_in_proportion():
  """Failed before the fix: mini-batches held 0% of the -1 class."""
  data = _pm1_federation()
  share = np.mean(data.train[1] == -1)
  draw = jax.jit(lambda k: prfl.data.sample_batch(k, data.train, 8)[1])
  drawn = np.concatenate([np.asarray(draw(jax.random.key(s))).ravel()
                          for s in range(50)])
  assert 0.4 < share < 0.6
  assert abs(np.mean(drawn == -1) - share) < 0.05


def test_pm1_logistic_regression_with_minibatches_learns():
  """Failed before the fix: 0.53 accuracy with batches of 8 (0.99 full).

  Seen to fail when `sample_batch` orders rows by `label >= 0` again.
  """
  data = _pm1_federation()
  alg = prfl.algorithms.fedavg(_logistic_loss, optax.sgd(0.5))
  accuracy = {}
  for b in (None, 8):
    r = prfl.train(alg, jnp.zeros((4, 5)), data, num_rounds=100, batch_size=b,
                   key=jax.random.key(0), eval_fn=_logistic_eval,
                   verbose=False)
    accuracy[b] = float(r.history["eval/accuracy"][-1])
  assert accuracy[None] > 0.95
  assert accuracy[8] > 0.95


def test_mlp_loss_ignores_federate_padding():
  """Failed before: 2.2958 with the padding rows against 2.2668 without.

  The mask alone decides: padding rows given a real-looking label 3 still
  do not count. Seen to fail when `softmax_cross_entropy` ignores the mask.
  """
  rng = np.random.default_rng(0)
  params = models.mlp_init(jax.random.key(0), (16, 8, 4))
  x = rng.normal(size=(6, 16)).astype(np.float32)
  y = np.array([0, 1, 2, 3, 3, 3], np.int32)
  mask = np.array([True, True, True, True, False, False])
  loss = models.mlp_classifier_loss(2)
  real = loss(params, (x[:4], y[:4]))
  np.testing.assert_allclose(loss(params, prfl.data.Padded((x, y), mask)),
                             real, rtol=1e-6)
  assert abs(float(loss(params, (x, y))) - float(real)) > 1e-3
  for helper in (models.classifier_loss, ):
    fn = helper(models.mlp_apply)
    np.testing.assert_allclose(fn(params, prfl.data.Padded((x, y), mask)),
                               real, rtol=1e-5)
  ev = models.classifier_eval(models.mlp_apply)
  np.testing.assert_allclose(
      ev(params, prfl.data.Padded((x, y), mask))["loss"], real, rtol=1e-5)


def test_train_on_padded_federation_uses_the_mask():
  """A federate()d ragged federation trains on real rows only.

  Seen to fail when `train` stops passing `data.num_examples` to the
  sampler (the loss then sees the padding rows as examples of class 0).
  """
  rng = np.random.default_rng(1)
  x = rng.normal(size=(3, 6, 4)).astype(np.float32)
  y = rng.integers(0, 3, (3, 6)).astype(np.int32)
  counts = np.array([6, 2, 1], np.int32)
  y_garbage = np.where(np.arange(6) < counts[:, None], y, 0).astype(np.int32)
  x_garbage = np.where((np.arange(6) < counts[:, None])[..., None], x, 50.0)
  loss = models.classifier_loss(lambda p, v: v @ p)
  alg = prfl.algorithms.local(loss, optax.sgd(0.1))
  runs = []
  for xs, ys in ((x, y), (x_garbage.astype(np.float32), y_garbage)):
    data = prfl.data.FederatedData((xs, ys), (xs, ys), np.zeros(3, np.int32),
                                   num_examples=counts)
    runs.append(prfl.train(alg, jnp.zeros((3, 4, 3)), data, num_rounds=4,
                           batch_size=4, key=jax.random.key(0),
                           verbose=False).state.params)
  np.testing.assert_array_equal(runs[0], runs[1])


def test_padded_batch_refuses_tuple_unpacking():
  with pytest.raises(TypeError, match="prfl.data.unpad"):
    x, y = prfl.data.Padded((1.0, 2.0), np.ones(2, bool))
    del x, y


@pytest.mark.parametrize("counts,match", [
    (np.array([3, 0, 2]), "no training example"),
    (np.array([3, 7, 2]), "larger than the 6 rows"),
    (np.array([3, 2]), r"integer array \[3\]"),
    (np.array([3.0, 2.0, 1.0]), r"integer array \[3\]"),
])
def test_bad_num_examples_is_refused_before_training(counts, match):
  x = np.zeros((3, 6, 2), np.float32)
  data = prfl.data.FederatedData((x, np.zeros((3, 6), np.int32)), x,
                                 np.zeros(3, np.int32), num_examples=counts)
  with pytest.raises(ValueError, match=match):
    prfl.data.check_data(data)


def test_federated_clustering_kernels_take_padded_batches():
  """The ghost kernel traces a loss through a `Padded` batch: same models
  as the Gram kernel, which materialises the gradients."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(6, 10, 16)).astype(np.float32)
  y = rng.integers(0, 4, (6, 10)).astype(np.int32)
  data = prfl.data.FederatedData(
      (x, y), (x, y), np.zeros(6, np.int32),
      num_examples=np.array([10, 3, 7, 10, 2, 5], np.int32))
  params = prfl.tree.broadcast(models.mlp_init(jax.random.key(0), (16, 8, 4)),
                               6)
  out = []
  for kernel in ("ghost", "gram"):
    alg = prfl.algorithms.federated_clustering(
        models.mlp_classifier_loss(2), optax.sgd(0.1),
        radius=prfl.quantile_radius(0.5), num_groups=2,
        plan=prfl.ExecutionPlan(2, kernel))
    out.append(prfl.train(alg, params, data, num_rounds=2, batch_size=4,
                          key=jax.random.key(0), verbose=False).state.params)
  # The models pass through the user's matmuls: TF32 on a GPU at JAX's
  # default precision (an H200 read 9.8e-4 relative).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, **tolerances.model(1e-4, 1e-5)), *out)
