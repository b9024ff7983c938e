"""An aggregator per segment of rows (e.g. IFCA's cluster members)."""

from typing import Optional

import jax
import jax.numpy as jnp

from prfl_jax import tree as tree_lib
from prfl_jax.aggregators import base


def per_segment(aggregator: base.Aggregator, messages: base.PyTree,
                segment_ids: jax.Array, num_segments: int,
                weights: Optional[jax.Array] = None):
  """`aggregator` over each segment's rows (e.g. IFCA's cluster members).

  Args:
    aggregator: an `agg(messages, weights)` of this module.
    messages: leaves `[N, ...]`.
    segment_ids: `[N]` int, segment of each row.
    num_segments: K.
    weights: optional `[N]` row weights.

  Returns:
    `(aggregates, sizes)`: leaves `[K, ...]` and `[K]` summed weights
    (0 for an empty segment, whose aggregate is 0).
  """
  n = tree_lib.num_leading(messages, "messages")
  w = jnp.ones((n,), jnp.float32) if weights is None else jnp.asarray(
      weights, jnp.float32)
  member = (segment_ids[None, :] == jnp.arange(num_segments)[:, None])
  seg_w = jnp.where(member, w[None, :], 0.0)  # [K, N]
  out = jax.vmap(lambda sw: aggregator(messages, sw))(seg_w)
  return out, jnp.sum(seg_w, axis=1)
