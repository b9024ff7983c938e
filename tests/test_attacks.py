"""Tests of the Byzantine attacks against hand-computed messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import prfl_jax as prfl

MESSAGES = {"w": jnp.array([[1.0, 2.0], [3.0, 6.0], [5.0, 10.0], [7.0, 0.0]]),
            "b": jnp.array([[1.0], [2.0], [3.0], [4.0]])}
BYZ = jnp.array([False, False, True, True])
KEY = jax.random.key(0)


def _benign_unchanged(out):
  for name in MESSAGES:
    np.testing.assert_array_equal(out[name][:2], MESSAGES[name][:2])


def test_none_changes_nothing():
  out = prfl.attacks.none()(MESSAGES, BYZ, KEY)
  for name in MESSAGES:
    np.testing.assert_array_equal(out[name], MESSAGES[name])


def test_large_and_bit_flip_scale_own_message():
  out = prfl.attacks.large(100.0)(MESSAGES, BYZ, KEY)
  _benign_unchanged(out)
  np.testing.assert_array_equal(out["w"][2:], 100 * MESSAGES["w"][2:])
  out = prfl.attacks.bit_flip()(MESSAGES, BYZ, KEY)
  _benign_unchanged(out)
  np.testing.assert_array_equal(out["b"][2:], -MESSAGES["b"][2:])


def test_ipm_and_mimic_use_benign_messages():
  out = prfl.attacks.ipm(0.5)(MESSAGES, BYZ, KEY)
  _benign_unchanged(out)
  np.testing.assert_allclose(out["w"][2:], [[-1.0, -2.0]] * 2)  # -0.5 * (2, 4)
  np.testing.assert_allclose(out["b"][3], [-0.75])
  out = prfl.attacks.mimic()(MESSAGES, jnp.array([True, False, True, False]),
                             KEY)
  np.testing.assert_array_equal(np.asarray(out["w"])[[0, 2]],
                                np.asarray(MESSAGES["w"])[[1, 1]])


def test_alie_is_mean_minus_z_std_of_benign():
  out = prfl.attacks.alie(z=2.0)(MESSAGES, BYZ, KEY)
  _benign_unchanged(out)
  # Benign w: (1, 2), (3, 6): mean (2, 4), std (1, 2).
  np.testing.assert_allclose(out["w"][2:], [[0.0, 0.0]] * 2, atol=1e-6)
  # Default z (Baruch et al.): n=4, f=2, s = floor(4/2 + 1) - 2 = 1,
  # z = Phi^{-1}((4 - 1) / 4).
  z = stats.norm.ppf(0.75)
  out = prfl.attacks.alie()(MESSAGES, BYZ, KEY)
  np.testing.assert_allclose(out["b"][2], [1.5 - z * 0.5], rtol=1e-5)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite(value):
  out = prfl.attacks.non_finite(value)(MESSAGES, BYZ, KEY)
  _benign_unchanged(out)
  assert np.all(~np.isfinite(out["w"][2:]))


def test_gaussian_is_random_but_seeded():
  a = prfl.attacks.gaussian(10.0)(MESSAGES, BYZ, KEY)
  b = prfl.attacks.gaussian(10.0)(MESSAGES, BYZ, KEY)
  c = prfl.attacks.gaussian(10.0)(MESSAGES, BYZ, jax.random.key(1))
  _benign_unchanged(a)
  np.testing.assert_array_equal(a["w"], b["w"])
  assert not np.array_equal(a["w"][2:], c["w"][2:])


def test_flip_labels():
  labels = jnp.array([[0, 9], [3, 4]])
  out = prfl.attacks.flip_labels(labels, jnp.array([False, True]), 10)
  np.testing.assert_array_equal(out, [[0, 9], [6, 5]])


def test_attacks_are_jittable():
  for attack in [prfl.attacks.alie(), prfl.attacks.gaussian(),
                 prfl.attacks.mimic(), prfl.attacks.ipm()]:
    out = jax.jit(attack)(MESSAGES, BYZ, KEY)
    _benign_unchanged(out)
