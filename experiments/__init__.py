"""Runnable experiments, one module per table or figure of the paper."""
