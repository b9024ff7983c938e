"""experiments/byzantine/cells.py: grid cells trained as one vmapped program.

Mutations seen to fail these tests: each cell given the first cell's
Byzantine mask (`init` closing over `byzantine[0]`), the round index counted
from 0 in every chunk (`first_round` dropped), `first_round` made static
(`static_argnums`: one compile per chunk), the cells stacked in another
order than the federations given.
"""

import jax
import jax.numpy as jnp
from jax import monitoring
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from experiments.byzantine import cells
from tests import tolerances

N, M, D = 8, 6, 3


def _federation(seed, byzantine, flip=False):
  """Two clusters of linear-regression clients; `flip` negates the targets
  of the Byzantine clients (a data attack)."""
  a = np.random.default_rng(seed).normal(size=(N, M, D)).astype(np.float32)
  w = np.repeat(np.array([[1., -1., 2.], [-2., 0.5, 1.]], np.float32), N // 2,
                axis=0)
  y = np.einsum("nmd,nd->nm", a, w)
  if flip:
    y = np.where(np.asarray(byzantine)[:, None], -y, y)
  data = prfl.data.FederatedData(train=(a, y), test=(a, y),
                                 clusters=np.repeat(np.arange(2), N // 2))
  return prfl.data.Federation(data, np.asarray(byzantine), 0, "toy")


def _loss(w, batch):
  return 0.5 * jnp.mean((batch[0] @ w - batch[1]) ** 2)


def _eval(w, test):
  return {"loss": _loss(w, test)}


def _alg():
  """FedAvg under Gaussian noise from the Byzantine clients (reads the mask
  and the step key); quick to compile (the runner does not depend on the
  algorithm)."""
  return prfl.algorithms.fedavg(_loss, optax.sgd(0.1, momentum=0.9),
                                attack=prfl.attacks.gaussian(0.3))


def _feds():
  """Cells apart in the mask, in the data (a second seed, flipped targets)
  and, in the tests, in the key."""
  return [_federation(0, np.arange(N) % 4 == 0),
          _federation(1, np.arange(N) % 4 == 3, flip=True)]


def test_cells_repeat_their_separate_runs():
  """The second cell of the vmapped program (its own mask, data and key)
  gives `prfl.train`'s numbers for its federation alone."""
  feds = _feds()
  keys = jax.random.split(jax.random.key(3), len(feds))
  data, byzantine = cells.stack(feds)
  params = jnp.zeros((N, D))
  got = cells.train_cells(_alg(), params, data, byzantine, num_rounds=4,
                          keys=keys, batch_size=None, eval_fn=_eval,
                          num_clusters=2, eval_every=2)
  alone = prfl.train(_alg(), params, feds[1].data, num_rounds=4, key=keys[1],
                     batch_size=None, eval_fn=_eval, eval_every=2,
                     byzantine=feds[1].byzantine, verbose=False)
  cell = got[1]
  np.testing.assert_array_equal(cell.history["eval_round"],
                                alone.history["eval_round"])
  for name in ("eval/loss", "eval/loss/per_cluster", "train/loss"):
    np.testing.assert_allclose(cell.history[name], alone.history[name],
                               **tolerances.LIBRARY)
  np.testing.assert_allclose(cell.state.params, alone.state.params,
                             **tolerances.LIBRARY)
  np.testing.assert_array_equal(cell.state.byzantine, feds[1].byzantine)
  # The cells differ (otherwise the comparison above proves little).
  assert abs(got[0].history["eval/loss"][-1] -
             got[1].history["eval/loss"][-1]) > 1e-3


def test_cells_and_chunks_compile_once():
  """The round chunk is traced (hence compiled) once for 2 cells of 3
  chunks: no cell (mask, data, key) and no chunk recompiles. Counted as
  jit traces, which a persistent compilation cache does not skip."""
  feds = _feds()
  data, byzantine = cells.stack(feds)
  keys = jax.random.split(jax.random.key(0), len(feds))
  traced = []
  monitoring.register_event_duration_secs_listener(
      lambda event, secs, fun_name=None, **kw: traced.append(fun_name)
      if event == "/jax/core/compile/jaxpr_trace_duration" else None)
  cells.train_cells(_alg(), jnp.zeros((N, D)), data, byzantine,
                    num_rounds=6, keys=keys, batch_size=None, eval_fn=_eval,
                    num_clusters=2, eval_every=2)
  assert traced.count("chunk") == 1 and traced.count("init") == 1


def test_cells_of_other_shapes_are_refused():
  small = _federation(0, np.zeros(N, bool))
  other = small._replace(data=small.data._replace(
      train=(small.data.train[0][:, :4], small.data.train[1][:, :4])))
  with pytest.raises(ValueError, match="federation 1 differs"):
    cells.stack([small, other])
  data, byzantine = cells.stack([small])
  with pytest.raises(ValueError, match="multiple of `eval_every`"):
    cells.train_cells(_alg(), jnp.zeros((N, D)), data, byzantine,
                      num_rounds=5, keys=jax.random.split(jax.random.key(0),
                                                          1),
                      batch_size=None, eval_fn=_eval, num_clusters=2,
                      eval_every=2)
