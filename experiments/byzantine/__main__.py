"""`python -m experiments.byzantine` (see the package docstring)."""

from experiments.byzantine import main

main()
