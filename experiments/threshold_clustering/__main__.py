"""`python -m experiments.threshold_clustering` (see the package docstring)."""

from experiments.threshold_clustering import main

main()
