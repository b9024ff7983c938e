"""`python -m experiments.mnist`: Table 1 (see the package docstring)."""

from experiments.mnist import main

main()
