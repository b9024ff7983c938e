"""Robust aggregators and pre-aggregators: what a server may use in place of
the mean.

Each factory returns a pure function

  agg(messages, weights=None) -> aggregate

where `messages` is a pytree whose leaves are `[N, ...]` (one row per client)
and the aggregate is one message (leaves `[...]`). `weights` is an optional
`[N]` array of non-negative weights; a row of weight 0 is absent (padding, a
client outside an IFCA cluster) and never reaches the output, whatever it
holds. The functions are jit- and vmap-compatible; arguments are checked when
the factory is called, and the ones that need N (Krum) when `agg` is traced.

Non-finite rows. Every rule except `mean` treats a row with any NaN or Inf
entry as absent, so a Byzantine client sending NaN/Inf cannot reach the
output (the median of the remaining rows, etc.). `mean` is the plain mean:
one non-finite row makes it non-finite, as in every FedAvg implementation.

Weights other than 0/1. Positive weights scale each row's share of every
average: the weighted mean, the mean of the values a trimmed mean keeps,
Multi-Krum's mean of the selected rows, RFA's weighted Weiszfeld iteration
(Pillutla et al., 2022, with `alpha_i = w_i`) and the clipped mean of
centered clipping. In the median they are multiplicities: an integer weight w
gives the same result as w copies of the row (the weighted median, mean of the
lower and upper weighted medians, which is NumPy's median for equal weights).
Counts (how many values a trimmed mean drops, how many neighbours Krum sums)
count present rows, not weight.

Where a rule needs distances (Krum, geometric median, centered clipping) the
whole pytree is one flattened vector: `||x|| = sqrt(sum over leaves of
||leaf||^2)`. With no present row the aggregate is 0.

Rules that need a random draw (DnC's and SignGuard's coordinate samples
when asked for, `bucketing`) take it as `agg(messages, weights, key=key)`.
Pre-aggregators (`pre.py`: NNM, bucketing, static clipping, ARC) transform
the rows in front of any rule (`compose`) or of Threshold-Clustering.

Modules, one family each:
  coordinate.py  mean, median, trimmed mean, Meamed.
  selection.py   Krum, Multi-Krum, Bulyan.
  iterative.py   geometric median (RFA), centered clipping.
  neighbours.py  MoNNA.
  subsets.py     MDA, SMEA (exact, over all subsets).
  spectral.py    CAF, DnC.
  signs.py       SignGuard.
  pre.py         NNM, bucketing, clipping, ARC, cap_duplicates, compose.
  segments.py    one rule per segment of rows (IFCA).

Each rule's docstring gives its paper's definition and reference;
`benchmarks/check_byzfl.py` compares them with ByzFL's implementations.
"""

from prfl_jax.aggregators.base import Aggregator
from prfl_jax.aggregators.base import pairwise_sq_distances
from prfl_jax.aggregators.base import PyTree
from prfl_jax.aggregators.coordinate import mean
from prfl_jax.aggregators.coordinate import meamed
from prfl_jax.aggregators.coordinate import median
from prfl_jax.aggregators.coordinate import trimmed_mean
from prfl_jax.aggregators.iterative import centered_clipping
from prfl_jax.aggregators.iterative import geometric_median
from prfl_jax.aggregators.selection import bulyan
from prfl_jax.aggregators.selection import check_krum
from prfl_jax.aggregators.selection import krum
from prfl_jax.aggregators.neighbours import monna
from prfl_jax.aggregators.pre import arc
from prfl_jax.aggregators.pre import bucket_means
from prfl_jax.aggregators.pre import bucketing
from prfl_jax.aggregators.pre import cap_duplicates
from prfl_jax.aggregators.pre import clipping
from prfl_jax.aggregators.pre import compose
from prfl_jax.aggregators.pre import nnm
from prfl_jax.aggregators.pre import PreAggregator
from prfl_jax.aggregators.segments import per_segment
from prfl_jax.aggregators.signs import signguard
from prfl_jax.aggregators.spectral import caf
from prfl_jax.aggregators.spectral import dnc
from prfl_jax.aggregators.subsets import mda
from prfl_jax.aggregators.subsets import smea
