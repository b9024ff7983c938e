"""Presets of the library beyond the core: aggregators, attacks, partitions,
train + checkpoint, every algorithm.

Each module is mutated whole (`*`: every top-level function and module
constant), against the test files that guard it. Each preset ends with the
edits of issue 21's mutation audit that fall in it: changes at edges, defaults
and wiring that survived every test when the audit was made.
"""

from tools.mutation.preset_types import Edit
from tools.mutation.preset_types import Lines

_AGG = "prfl_jax/aggregators/"
_EDGES = ("tests/test_robust_edges.py",)
_AGG_TESTS = (_EDGES, ("tests/test_aggregators.py",),
              ("tests/test_robust_aggregators.py",))
_ROBUST_TESTS = (_EDGES, ("tests/test_robust_aggregators.py",),
                 ("tests/test_aggregators.py",))

AGGREGATORS = [
    Lines((_AGG + "base.py",), ("*",), _AGG_TESTS),
    Lines((_AGG + "coordinate.py",), ("*",), _AGG_TESTS),
    Lines((_AGG + "iterative.py",), ("*",), _AGG_TESTS),
    Lines((_AGG + "selection.py",), ("*",), _AGG_TESTS),
    Lines((_AGG + "neighbours.py",), ("*",), _ROBUST_TESTS),
    Lines((_AGG + "segments.py",), ("*",), _AGG_TESTS),
    Lines((_AGG + "pre.py",), ("*",), _ROBUST_TESTS),
    Lines((_AGG + "signs.py",), ("*",), _ROBUST_TESTS),
    Lines((_AGG + "spectral.py",), ("*",), _ROBUST_TESTS),
    Lines((_AGG + "subsets.py",), ("*",), _ROBUST_TESTS),
    Edit((_AGG + "iterative.py",), "geometric_median",
         "lax.fori_loop(0, num_iters,", "lax.fori_loop(1, num_iters,",
         "geometric median runs one Weiszfeld iteration fewer", _AGG_TESTS),
    Edit((_AGG + "selection.py",), "krum_scores",
         "jnp.maximum(jnp.sum(present) - num_byzantine - 2, 1)",
         "jnp.sum(present) - num_byzantine - 2",
         "Krum's one-neighbour floor removed", _AGG_TESTS),
]

_ATT = "prfl_jax/attacks/"
_ATT_TESTS = (("tests/test_attacks.py",), ("tests/test_attacks_optimised.py",))
_ATT_EDGES = (("tests/test_attack_edges.py",),)
ATTACKS = [
    Lines((_ATT + "base.py",), ("*",), _ATT_TESTS),
    Lines((_ATT + "simple.py",), ("*",), _ATT_EDGES + _ATT_TESTS),
    Lines((_ATT + "adaptive.py",), ("*",), _ATT_EDGES + _ATT_TESTS[::-1]),
    Lines((_ATT + "edge.py",), ("*",), _ATT_TESTS),
    Lines((_ATT + "fang.py",), ("*",), _ATT_EDGES + _ATT_TESTS[::-1]),
    Lines((_ATT + "optimised.py",), ("*",), _ATT_EDGES + _ATT_TESTS[::-1]),
    Edit((_ATT + "simple.py",), "alie", "s = jnp.floor(n / 2 + 1) - f",
         "s = jnp.ceil(n / 2 + 1) - f",
         "ALIE's default z rounded the other way", _ATT_EDGES + _ATT_TESTS),
]

_DATA = "prfl_jax/data/"
_PART_TESTS = (("tests/test_partition_defaults.py",),
               ("tests/test_data_partition.py",))
PARTITIONS = [
    Lines((_DATA + "partition.py",), ("*",), _PART_TESTS),
    Lines((_DATA + "partitioners.py",), ("*",), _PART_TESTS),
    Edit((_DATA + "partition.py",), "federate",
         "      yt[members] = private_label(yt[members], k, num_classes)\n",
         "", "the private-label permutation not applied to the test labels",
         _PART_TESTS),
    Edit((_DATA + "partition.py",), "federate",
         "int(np.floor(byzantine_fraction * n + 1e-9))",
         "int(np.round(byzantine_fraction * n))",
         "the Byzantine count per cluster rounded instead of floored",
         _PART_TESTS),
    Edit((_DATA + "partition.py",), None, "DEFAULT_TEST_FRACTION = 0.2",
         "DEFAULT_TEST_FRACTION = 0.25",
         "the default train/test split changed", _PART_TESTS),
]

_TRAIN_TESTS = (("tests/test_train_inputs.py",), ("tests/test_checkpoint.py",),
                ("tests/test_checkpoint_resume.py",))
TRAIN = [
    Lines(("prfl_jax/train.py",), ("*",), (("tests/test_train_inputs.py",),
                                           ("tests/test_train.py",))),
    Lines(("prfl_jax/train_checks.py",), ("*",), _TRAIN_TESTS),
    Lines(("prfl_jax/checkpoint/store.py",), ("*",), _TRAIN_TESTS[1:]),
    Lines(("prfl_jax/checkpoint/run.py",), ("*",), _TRAIN_TESTS[::-1]),
    Lines(("prfl_jax/checkpoint/manifest.py",), ("*",), _TRAIN_TESTS[1:]),
    Edit(("prfl_jax/train_checks.py",), "resolve_eval_every",
         "math.ceil((start_round + num_rounds) / 20)",
         "math.ceil((start_round + num_rounds) / 40)",
         "the default evaluation schedule halved", _TRAIN_TESTS),
    Edit(("prfl_jax/checkpoint/store.py",), "save", "if old >= step:",
         "if old > step:", "`save` keeping an existing round",
         _TRAIN_TESTS[1:]),
]

_ALG = "prfl_jax/algorithms/"


def _alg(module, *tests):
  return Lines((_ALG + module,), ("*",), tuple((t,) for t in tests))


_ALG_EDGES = "tests/test_algorithm_edges.py"
_IFCA = (_ALG_EDGES, "tests/test_ifca.py", "tests/test_hypcluster.py")
ALGORITHMS = [
    _alg("base.py", "tests/test_baselines_core.py", "tests/test_train_inputs.py"),
    _alg("cluster_models.py", *_IFCA, "tests/test_cfl.py"),
    _alg("fedavg.py", "tests/test_baselines_core.py",
         "tests/test_fedavg_aggregators.py",
         "tests/test_fedavg_mesh.py::test_bad_mesh_is_named",
         "tests/test_fedavg_mesh.py::test_one_device_mesh_is_the_plain_run"),
    _alg("local.py", "tests/test_baselines_core.py"),
    _alg("oracle.py", "tests/test_baselines_core.py"),
    _alg("ditto.py", _ALG_EDGES, "tests/test_ditto.py"),
    _alg("ifca.py", *_IFCA),
    _alg("hypcluster.py", "tests/test_hypcluster.py"),
    _alg("knn_per.py", _ALG_EDGES, "tests/test_knn_per.py"),
    _alg("cfl.py", "tests/test_cfl.py"),
    _alg("myopic_clustering.py", _ALG_EDGES,
         "tests/test_myopic_clustering.py"),
    _alg("momentum_clustering.py", _ALG_EDGES,
         "tests/test_momentum_clustering.py"),
    _alg("mc_reseed.py", _ALG_EDGES, "tests/test_momentum_clustering.py"),
    _alg("fc_groups.py", "tests/test_fc_groups.py"),
    _alg("fc_defence.py", "tests/test_fc_defence.py"),
    Edit((_ALG + "momentum_clustering.py",), "momentum_clustering",
         "alpha * g + (1.0 - alpha) * m", "alpha * g + alpha * m",
         "Momentum-Clustering's momentum update a g + a m",
         ((_ALG_EDGES,), ("tests/test_momentum_clustering.py",))),
    Edit((_ALG + "ditto.py",), "ditto",
         "local_updates(loss_fn, global_optimizer,",
         "local_updates(loss_fn, optimizer,",
         "Ditto's global part stepping with the personal optimizer",
         ((_ALG_EDGES,), ("tests/test_ditto.py",))),
    Edit((_ALG + "ifca.py",), "ifca",
         "opt_state = cluster_models.keep_where_empty(nonempty, opt_state,\n"
         "                                                  state.opt_state)",
         "opt_state = opt_state",
         "IFCA dropping an empty cluster's optimizer state",
         ((_ALG_EDGES,), ("tests/test_ifca.py",))),
    Edit((_ALG + "cluster_models.py",), "loss_assignment",
         "losses = jnp.where(jnp.isfinite(losses), losses, jnp.inf)",
         "losses = losses", "IFCA/HypCluster letting a NaN loss win the argmin",
         tuple((t,) for t in _IFCA)),
    Edit((_ALG + "knn_per.py",), "knn_per_evaluate",
         "vg, vk = parts(val[0])\n  val_acc, val_nll = jax.vmap(lambda lam: "
         "scores(vg, vk, val[1], lam))(grid)",
         "vg, vk = parts(test[0])\n  val_acc, val_nll = jax.vmap(lambda lam: "
         "scores(vg, vk, test[1], lam))(grid)",
         "kNN-Per choosing its lambda on the test set",
         ((_ALG_EDGES,), ("tests/test_knn_per.py",))),
    Edit((_ALG + "knn_per.py",), "knn_per_evaluate",
         "best = jnp.lexsort((val_nll, -val_acc))[0]",
         "best = grid.shape[0] - 1 - jnp.lexsort((val_nll[::-1], "
         "-val_acc[::-1]))[0]",
         "kNN-Per breaking lambda ties towards the last grid value",
         ((_ALG_EDGES,), ("tests/test_knn_per.py",))),
    Edit((_ALG + "myopic_clustering.py",), "myopic_clustering",
         "separation = float(radius) if scalar else 0.0", "separation = 0.0",
         "Myopic-Clustering's default separation set to 0",
         ((_ALG_EDGES,), ("tests/test_myopic_clustering.py",))),
]

PRESETS = {"aggregators": AGGREGATORS, "attacks": ATTACKS,
           "partitions": PARTITIONS, "train": TRAIN, "algorithms": ALGORITHMS}
