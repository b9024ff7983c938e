"""Byzantine attacks: what malicious clients send instead of honest messages.

An attack is a pure function

  attack(messages, byzantine, key) -> messages

where `messages` is a pytree whose leaves are `[N, ...]` (the honest message
every client would send: a gradient in Federated-Clustering, a momentum in
Momentum-Clustering), `byzantine` is the `[N]` bool mask of malicious clients
and `key` a PRNG key. Rows of benign clients are returned unchanged; attacks
may use every honest message (omniscient attacker, Werner et al., 2023,
Section 5.4). Statistics are taken over benign clients only.

Modules:
  simple.py     noise, large, bit flip, ALIE, IPM, mimic, NaN/Inf, label flip.
  edge.py       the ball-edge attacks on Threshold-Clustering: one tied
                point (`threshold_edge`) or spread out (`spread_edge`, the
                adaptive attack on Federated-Clustering).
  optimised.py  ALIE and IPM with a line search over their strength
                (ByzFL's), Min-Max and Min-Sum (Shejwalkar and Houmansadr).
  fang.py       Fang et al.'s attacks on Krum and the trimmed mean.
  adaptive.py   attacks adapted to Federated-Clustering's defences
                (`jittered`: any attack, untied; `concentrated`: on one
                cluster's models only).

References:
  Baruch et al., 2019 (ALIE); Xie et al., 2020 (IPM); Karimireddy et al., 2022
  (mimic); Werner et al., 2023, Section 5.4 (large gradients, bit flipping),
  Section 3.1.1 (threat model of Threshold-Clustering: `threshold_edge`);
  Shejwalkar and Houmansadr, 2021 (Min-Max, Min-Sum); Fang et al., 2020.
"""

from prfl_jax.attacks.adaptive import concentrated
from prfl_jax.attacks.adaptive import jittered
from prfl_jax.attacks.base import Attack
from prfl_jax.attacks.base import PyTree
from prfl_jax.attacks.edge import edge_radius
from prfl_jax.attacks.edge import spread_edge
from prfl_jax.attacks.edge import threshold_edge
from prfl_jax.attacks.fang import fang_krum
from prfl_jax.attacks.fang import fang_trimmed_mean
from prfl_jax.attacks.optimised import aggregator_objective
from prfl_jax.attacks.optimised import line_search
from prfl_jax.attacks.optimised import min_max
from prfl_jax.attacks.optimised import min_sum
from prfl_jax.attacks.optimised import Objective
from prfl_jax.attacks.optimised import optimised_alie
from prfl_jax.attacks.optimised import optimised_ipm
from prfl_jax.attacks.optimised import span_coordinates
from prfl_jax.attacks.optimised import threshold_objective
from prfl_jax.attacks.simple import alie
from prfl_jax.attacks.simple import bit_flip
from prfl_jax.attacks.simple import flip_labels
from prfl_jax.attacks.simple import gaussian
from prfl_jax.attacks.simple import ipm
from prfl_jax.attacks.simple import large
from prfl_jax.attacks.simple import mimic
from prfl_jax.attacks.simple import non_finite
from prfl_jax.attacks.simple import none
