"""`python -m experiments.failure_modes` (see the package docstring)."""

from experiments.failure_modes import main

main()
