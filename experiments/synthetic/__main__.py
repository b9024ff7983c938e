"""`python -m experiments.synthetic` (see the package docstring)."""

from experiments.synthetic import main

main()
