"""The all-pairs engine: clustering every client's gradient at every model.

Notation (Werner et al., 2023, Algorithm 1): client `j`'s stochastic gradient
at client `i`'s model is `g_j(x_i)`. Federated-Clustering needs, for every
model `i`, the N gradients `{g_j(x_i)}_j`, clustered with one centre started at
the owner's own gradient `g_i(x_i)`. `cluster_at_models` does that for all
models of a round, under an `ExecutionPlan` (how many models at once, which
kernel); every plan gives the same result.

Layout (adding a kernel or a layer rule is one module):
  plan.py     `ExecutionPlan`, its check and the default from the backend.
  resolve.py  `resolve_plan`: the plan's "auto" fields made concrete, the
              loss traced once (`ResolvedPlan` carries the analysis).
  engine.py   `cluster_at_models`: the kernel mapped over the models.
  base.py     the kernel interface (`Kernel`, `Problem`, `PairsOutput`) and
              registry.
  gram.py     materialised gradients, Threshold-Clustering on their Gram matrix.
  direct.py   materialised gradients, distances from the gradients.
  ghost.py    Gram matrices from layer tokens, no per-client weight gradients.
  trace.py    finds a loss's layers in its jaxpr.
  interpret.py  the tapped interpreter: the loss run again with taps.
  rules.py    the layer-rule protocol; dense.py and conv.py implement it;
              pool.py and conv_cpu.py register faster max-pooling and
              convolutions for the interpreter on XLA:CPU.

`loss_fn(params, batch) -> scalar` is written for ONE client: unstacked params
and that client's batch (leaves `[B, ...]`); any Flax, Equinox or plain-JAX
loss works, and the ghost kernel finds its dense and convolution layers.
"""

from prfl_jax.kernels import base
from prfl_jax.kernels import conv  # noqa: F401  (registers its rule)
from prfl_jax.kernels import conv_cpu  # noqa: F401  (XLA:CPU convolutions)
from prfl_jax.kernels import dense  # noqa: F401  (registers its rule)
from prfl_jax.kernels import direct  # noqa: F401  (registers its kernel)
from prfl_jax.kernels import engine
from prfl_jax.kernels import ghost  # noqa: F401  (registers its kernel)
from prfl_jax.kernels import gram  # noqa: F401  (registers its kernel)
from prfl_jax.kernels import interpret  # noqa: F401
from prfl_jax.kernels import plan as plan_lib
from prfl_jax.kernels import pool  # noqa: F401  (registers max-pooling)
from prfl_jax.kernels import resolve
from prfl_jax.kernels import rules  # noqa: F401
from prfl_jax.kernels import trace  # noqa: F401

ExecutionPlan = plan_lib.ExecutionPlan
ResolvedPlan = resolve.ResolvedPlan
Kernel = base.Kernel
PairsOutput = base.PairsOutput
KERNELS = base.KERNELS
MessageFn = base.MessageFn
cluster_at_models = engine.cluster_at_models
estimate_model_bytes = resolve.estimate_model_bytes
resolve_plan = resolve.resolve_plan


def check_plan(plan: ExecutionPlan, *, messages: bool = False):
  """Raises TypeError / ValueError unless `plan` is a valid `ExecutionPlan`.

  With `messages` (an attack replaces the messages), a kernel that never
  builds them is refused as well.
  """
  plan_lib.check_plan(plan, KERNELS, messages=messages)


__all__ = [
    "ExecutionPlan", "KERNELS", "Kernel", "PairsOutput", "ResolvedPlan",
    "check_plan", "cluster_at_models", "estimate_model_bytes", "resolve_plan",
    "base", "conv", "conv_cpu", "dense", "direct", "engine", "ghost", "gram",
    "interpret",
    "plan",
    "pool", "resolve", "rules", "trace",
]
