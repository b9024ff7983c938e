"""Saving and restoring algorithm states (checkpoint / resume) with orbax.

A checkpoint directory holds one orbax step per saved round:

  <directory>/<round>/state/...         the state's arrays (orbax, OCDBT)
  <directory>/<round>/meta/metadata     JSON: algorithm state type, round,
                                        tree structure, every leaf's path,
                                        shape and dtype, versions, and what
                                        a resume must repeat (`run`)
  <directory>/<round>/prfl_sha256.json  SHA-256 of every file above

orbax writes every array (also a sharded one, from every process of a
`jax.distributed` run) and makes each step appear atomically; on top of it,
`save` records the SHA-256 of every file of the step once orbax has finished,
and `restore` verifies them before reading: a flipped byte, a truncated or a
missing file, or a step directory renamed to another round is found and
named. The newest `keep` rounds are kept; when the newest is corrupt or
incomplete, `restore` warns, naming it, and falls back to the newest intact
one. A full disk is an `OSError` (ENOSPC) that leaves the earlier rounds
intact; steps half-written by a killed save are removed by the next save.

  prfl.checkpoint.save("runs/fc", state)            # after any round
  state = prfl.checkpoint.restore("runs/fc", alg.init(params))

`restore` refuses a target of another algorithm, structure, shape or dtype,
naming the checkpoint and the leaf. `prfl.train(checkpoint_path=...)` records
the run (key, batch size, data shapes, the algorithm and its settings, see
`describe_run`) with every round, and a resume into the same directory that
does not repeat it is refused, naming what differs.
"""

from prfl_jax.checkpoint.manifest import CheckpointError
from prfl_jax.checkpoint.manifest import FORMAT
from prfl_jax.checkpoint.manifest import MANIFEST
from prfl_jax.checkpoint.manifest import verify
from prfl_jax.checkpoint.run import check_same_run
from prfl_jax.checkpoint.run import describe_run
from prfl_jax.checkpoint.run import recorded_run
from prfl_jax.checkpoint.store import check_target
from prfl_jax.checkpoint.store import check_writable
from prfl_jax.checkpoint.store import describe
from prfl_jax.checkpoint.store import restore
from prfl_jax.checkpoint.store import rounds
from prfl_jax.checkpoint.store import save
from prfl_jax.checkpoint.store import state_type

__all__ = ["CheckpointError", "FORMAT", "MANIFEST", "check_same_run",
           "check_target", "check_writable", "describe", "describe_run",
           "recorded_run", "restore", "rounds", "save", "state_type",
           "verify"]
