"""Tests of the test helper tests/tolerances.py."""

import jax
import jax.numpy as jnp
import pytest

from tests import tolerances


@pytest.mark.parametrize("backend, setting, expected", [
    ("cpu", None, "float32"),
    ("cpu", "bfloat16", "float32"),  # XLA:CPU always computes float32.
    ("gpu", None, "tensorfloat32"),
    ("gpu", "highest", "float32"),
    ("gpu", "bfloat16", "bfloat16"),
    ("tpu", None, "bfloat16"),
    ("tpu", "float32", "float32"),
    ("tpu", "tensorfloat32", "tensorfloat32"),
])
def test_matmul_precision_per_backend_and_setting(backend, setting, expected):
  with jax.default_matmul_precision(setting):
    assert tolerances.matmul_precision(backend) == expected


def test_model_tolerance_widens_only_below_float32():
  assert tolerances.model(1e-6, 1e-7, backend="cpu") == {"rtol": 1e-6,
                                                         "atol": 1e-7}
  gpu = tolerances.model(1e-6, 0.0, scale=10.0, backend="gpu")
  assert gpu["rtol"] == 5e-3 and gpu["atol"] == pytest.approx(5e-2)
  assert tolerances.model(0.1, backend="tpu")["rtol"] == 0.1


def test_dot_precisions_reads_the_lowered_program():
  a = jnp.ones((3, 3))
  both = lambda x: (x @ x, jnp.matmul(x, x, precision="highest"))
  assert tolerances.dot_precisions(both, a) == ["DEFAULT, DEFAULT",
                                                "HIGHEST, HIGHEST"]
  assert not tolerances.all_highest(both, a)
  assert tolerances.all_highest(lambda x: jnp.matmul(
      x, x, precision="highest"), a)
  assert not tolerances.all_highest(lambda x: x + 1, a)  # No dot at all.
