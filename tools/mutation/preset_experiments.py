"""The experiments preset: how Table 1's runs are built (tasks, algorithms,
the oracle's clusters) and how the paper's table is printed beside ours.

The tests are `tests/test_mnist_experiment.py`'s fast ones (no training
run: the smoke and rerun tests take minutes per mutant) and the algorithm
wiring tests of `tests/test_experiment_wiring.py`.
"""

from tools.mutation.preset_types import Edit
from tools.mutation.preset_types import Lines

_MNIST = "tests/test_mnist_experiment.py::"
_FAST = (("tests/test_experiment_wiring.py",),) + tuple(
    (_MNIST + name,) for name in (
    "test_tasks_are_built_as_themselves_and_the_oracle_gets_k_clusters",
    "test_paper_numbers_are_the_papers",
    "test_ordering_checks_and_table_by_hand",
    "test_defaults_resolve_to_the_papers_settings",
    "test_per_algorithm_settings_reach_the_runs",
    "test_every_algorithm_builds_and_unknown_names_fail",
    "test_summary_rows_by_hand",
    "test_federation_sizes_by_hand",
))

EXPERIMENTS = [
    Lines(("experiments/registry.py",), ("*",), _FAST),
    Lines(("experiments/training.py",),
          ("federation_sizes", "context", "eval_every", "summary_rows",
           "check_batches_are_valid"), _FAST),
    Lines(("experiments/mnist/run.py",), ("prepare", "train_one"), _FAST),
    Lines(("experiments/mnist/report.py",), ("*",), _FAST),
    Lines(("experiments/mnist/config.py",), ("*",), _FAST),
    Edit(("experiments/mnist/run.py",), "prepare", "ds, task=task,",
         "ds, task=\"rotation\",",
         "Table 1 building every task as the rotation task", _FAST),
    Edit(("experiments/training.py",), "context",
         "registry.Context(loss_fn, clusters=clusters,",
         "registry.Context(loss_fn, clusters=np.zeros_like(clusters),",
         "the experiments' oracle given one cluster (training.context)", _FAST),
    Edit(("experiments/registry.py",), "_oracle", "clusters=ctx.clusters)",
         "clusters=np.zeros_like(ctx.clusters))",
         "the experiments' oracle given one cluster (registry)", _FAST),
    Edit(("experiments/mnist/report.py",), "markdown_table",
         "f\"{paper[0]:.1f}\" if paper", "f\"{paper[1]:.1f}\" if paper",
         "a paper number printed wrong (the loss as the accuracy)", _FAST),
    Edit(("experiments/mnist/config.py",), None,
         "\"fc\": (75.4, 0.475)", "\"fc\": (75.4, 0.457)",
         "a paper number printed wrong (two digits swapped)", _FAST),
]

PRESETS = {"experiments": EXPERIMENTS}
