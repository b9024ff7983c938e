"""The execution plan and its default from the backend (prfl_jax.kernels.plan)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import prfl_jax as prfl
from prfl_jax import kernels
from prfl_jax.kernels import ghost
from prfl_jax.kernels import plan as plan_lib
from prfl_jax.kernels import trace
from tests import tolerances

N, B, D, K = 6, 3, 5, 3


class _Device:
  """A stand-in for an accelerator `jax.Device`."""

  def __init__(self, limit=None, platform="gpu", fails=False):
    self.platform, self.limit, self.fails = platform, limit, fails

  def memory_stats(self):
    if self.fails:
      raise RuntimeError("no stats")
    return None if self.limit is None else {"bytes_limit": self.limit,
                                            "bytes_in_use": 123}


def test_default_chunk_size_from_the_backend():
  """CPU: 1 with convolutions, else 4 models (fewer if they do not fit, all
  if N <= 4); accelerator: the full vmap if it fits, else the largest power
  of two that fits. Mutations: `chunk *= 2` -> `chunk += 1` fails the 32;
  the CPU's `chunk //= 2` -> `chunk -= 1` fails the 2."""
  cpu = _Device(platform="cpu", limit=10**12)  # Budget 4e11 bytes.
  assert plan_lib.default_chunk_size(1, 64, cpu, convolutions=True) == 1
  assert plan_lib.default_chunk_size(1, 64, cpu) == 4
  assert plan_lib.default_chunk_size(10**11, 64, cpu) == 4  # 4e11 fits.
  assert plan_lib.default_chunk_size(13 * 10**10, 64, cpu) == 2
  assert plan_lib.default_chunk_size(10**12, 64, cpu) == 1
  assert plan_lib.default_chunk_size(1, 4, cpu) is None
  assert plan_lib.default_chunk_size(1, 3, cpu) is None
  gpu = _Device(limit=1000)  # Budget 400 bytes.
  assert plan_lib.memory_budget(gpu) == 400
  assert plan_lib.default_chunk_size(10, 40, gpu) is None  # 400 <= 400.
  assert plan_lib.default_chunk_size(10, 41, gpu) == 32
  assert plan_lib.default_chunk_size(45, 64, gpu) == 8
  assert plan_lib.default_chunk_size(500, 64, gpu) == 1  # Never below 1.
  assert plan_lib.default_chunk_size(10, 3, gpu) is None
  # No memory statistics: the documented conservative default.
  for device in (_Device(), _Device(fails=True)):
    assert (plan_lib.memory_budget(device) ==
            plan_lib.DEFAULT_BUDGET_BYTES)
  per_model = plan_lib.DEFAULT_BUDGET_BYTES // 5
  assert plan_lib.default_chunk_size(per_model, 16, _Device()) == 4


def _loss(p, batch):
  x, y = batch
  h = jnp.tanh(x @ p["w1"] + p["b1"])
  return optax.softmax_cross_entropy_with_integer_labels(
      h @ p["w2"], y).mean()


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  f32 = lambda *s: rng.normal(size=s).astype(np.float32)
  params = {"w1": f32(N, D, 4), "b1": f32(N, 4), "w2": f32(N, 4, K)}
  x = f32(N, B, D)
  x[N // 2:] += 2.0
  return params, (x, rng.integers(0, K, (N, B)).astype(np.int32))


def test_resolve_plan_on_this_backend_and_memory_estimate():
  """Chunks of 4 on CPU (dense layers, N = 6); on an accelerator this small
  problem fits: full vmap."""
  params, batch = _problem()
  assert kernels.resolve_plan(kernels.ExecutionPlan(), _loss, params,
                              batch).plan == kernels.ExecutionPlan(
                                  tolerances.default_chunk(N), "ghost")
  concrete = kernels.ExecutionPlan(None, "direct")
  resolved = kernels.resolve_plan(concrete, _loss, params, batch)
  assert resolved.plan == concrete and resolved.analysis is None
  one = lambda t: jax.tree.map(lambda a: a[0], t)
  analysis = trace.analyse(_loss, one(params), one(batch))
  small = kernels.estimate_model_bytes(analysis, "gram", 4)
  assert 0 < small < kernels.estimate_model_bytes(analysis, "gram", 8)
  assert kernels.estimate_model_bytes(analysis, "ghost", 4) > 0


def test_a_loss_with_a_convolution_runs_one_model_at_a_time_on_cpu():
  """The automatic chunk sees the convolution in the loss's jaxpr (inside
  the jitted call that `lax.conv` is): 1 model at a time on CPU, where
  a vmap over models would make it a grouped convolution.

  Seen to fail when the analysis was not searched below call equations.
  """
  def loss(p, batch):
    x, y = batch
    h = jax.jit(lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC")))(
            x, p["w"])
    return jnp.mean(jnp.square(h.sum(-1) - y))

  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(N, 3, 2, 4)).astype(np.float32)}
  batch = (rng.normal(size=(N, B, 5, 2)).astype(np.float32),
           rng.normal(size=(N, B, 5)).astype(np.float32))
  resolved = kernels.resolve_plan(kernels.ExecutionPlan(), loss, params,
                                  batch)
  assert resolved.plan == kernels.ExecutionPlan(
      tolerances.default_chunk(N, convolutions=True), "ghost")


@pytest.mark.parametrize("chunk", [None, 2])
def test_auto_plan_equals_the_plan_it_resolves_to(chunk, monkeypatch):
  """On an accelerator `"auto"` may resolve to the full vmap or a chunk; its
  results are exactly those of that plan, and close to every other plan's."""
  monkeypatch.setattr(plan_lib, "default_chunk_size",
                      lambda per_model, num_models, device=None, **kw: chunk)
  params, batch = _problem(1)
  run = lambda plan: jax.jit(lambda p, b: kernels.cluster_at_models(
      _loss, p, b, radius=prfl.quantile_radius(0.5), num_iters=5,
      plan=plan))(params, batch)
  auto = run(kernels.ExecutionPlan())
  same = run(kernels.ExecutionPlan(chunk, "ghost"))
  jax.tree.map(np.testing.assert_array_equal, auto, same)
  other = run(kernels.ExecutionPlan(1, "gram"))
  jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=1e-4,
                                                       atol=1e-6),
               auto.centers, other.centers)
  np.testing.assert_array_equal(auto.inside, other.inside)


def test_federated_clustering_resolves_the_plan_per_round(monkeypatch):
  """FC with the default plan: groups in a scan on CPU (chunk 1), in one
  vmap where the plan resolves to None; the same params either way."""
  params, batch = _problem(2)
  states = {}
  for chunk in (1, None):
    monkeypatch.setattr(
        plan_lib, "default_chunk_size",
        lambda per_model, num_models, device=None, c=chunk, **kw: c)
    alg = prfl.algorithms.federated_clustering(
        _loss, optax.sgd(0.1), radius=prfl.quantile_radius(0.5), num_iters=3,
        num_groups=2)
    state = alg.init(params)
    step = jax.jit(alg.step)
    for r in range(2):
      state, _ = step(state, batch, jax.random.PRNGKey(r))
    states[chunk] = state.params
  jax.tree.map(lambda a, r: np.testing.assert_allclose(
      a, r, **tolerances.model(1e-5, 1e-6, scale=np.abs(r).max())),
               states[1], states[None])


def test_a_round_traces_the_loss_once(monkeypatch):
  """FC's round resolves its plan once (for the group size) and hands the
  `ResolvedPlan`, with the loss's analysis, down to the ghost kernel's
  `prepare`: one `trace.analyse` per traced step. A `ResolvedPlan` given to
  `cluster_at_models` is used as it is.

  Seen to fail when `cluster_at_models` resolved the plan again (2
  analyses per step).
  """
  calls = []
  analyse = trace.analyse
  monkeypatch.setattr(trace, "analyse",
                      lambda *args: calls.append(1) or analyse(*args))
  params, batch = _problem(3)
  alg = prfl.algorithms.federated_clustering(
      _loss, optax.sgd(0.1), radius=prfl.quantile_radius(0.5), num_iters=2,
      num_groups=2)
  jax.jit(alg.step).lower(alg.init(params), batch, jax.random.PRNGKey(0))
  assert len(calls) == 1
  resolved = kernels.resolve_plan(kernels.ExecutionPlan(), _loss, params,
                                  batch)
  assert resolved.analysis is not None and len(calls) == 2
  assert kernels.resolve_plan(resolved, None, None, None) is resolved
  jax.jit(lambda p, b: kernels.cluster_at_models(
      _loss, p, b, radius=1.0, num_iters=2, plan=resolved)).lower(
          params, batch)
  assert len(calls) == 2


def test_check_plan_refuses_attacks_on_the_ghost_kernel_and_bad_kernels():
  """One check serves the factory and the resolver: a kernel that never
  builds the messages is refused with an attack, by name or as a `Kernel`.
  """
  kernels.check_plan(kernels.ExecutionPlan(1, "ghost"))
  kernels.check_plan(kernels.ExecutionPlan(1, ghost.kernel(split=False)))
  kernels.check_plan(kernels.ExecutionPlan(1, "gram"), messages=True)
  for kernel in ("ghost", ghost.kernel(always=True)):
    with pytest.raises(ValueError, match="needs the materialised messages"):
      kernels.check_plan(kernels.ExecutionPlan(1, kernel), messages=True)
  with pytest.raises(ValueError, match="plan.kernel"):
    kernels.check_plan(kernels.ExecutionPlan(1, len))
