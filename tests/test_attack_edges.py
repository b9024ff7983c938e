"""Edges of the attacks that every test passed through when changed: ALIE's
default z for an odd N (issue 21's mutation audit), Fang-Krum's scale, and
Min-Max's unit and sign directions, threshold_objective's one radius,
`concentrated`'s share (the mutation presets' samples)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import prfl_jax as prfl
from tests import test_attacks_optimised as opt_tests


def test_threshold_objective_takes_one_radius_for_every_start():
  """Threshold-Clustering is started at every client (their number is
  known only at the call), so the objective takes one radius (a number or
  a rule): an array of two radii is refused when the objective is built,
  before anything is traced, naming `radius`. Seen to fail when the check
  expects two centres (`check_radius(radius, 2)`: the pair then passes):
  session 5's sample, attacks #217."""
  with pytest.raises(ValueError, match="`radius` must be a scalar"):
    prfl.attacks.threshold_objective(jnp.array([0.5, 1.0]), 3)
  prfl.attacks.threshold_objective(0.5, 3)
  prfl.attacks.threshold_objective(prfl.quantile_radius(0.3), 3)


@pytest.mark.parametrize("target_norm, attacked", [(2.0, True), (4.5, False)])
def test_concentrated_counts_the_share_of_benign_clients(target_norm,
                                                         attacked):
  """Four benign clients, the target (the first) and norms 1, 4 and 5:
  with norm 2 the target is second smallest (rank 1 < 0.5 x 4 benign), so
  the Byzantine row is the attack's; with norm 4.5 (rank 2, not < 2) it is
  NaN. Seen to fail when the share multiplies the benign clients' mean
  instead of their count (`jnp.mean(benign)`: 0.8, so rank 1 no longer
  counts): session 5's sample, attacks #64."""
  messages = jnp.array([[target_norm], [1.0], [4.0], [5.0], [0.5]])
  byzantine = jnp.array([False, False, False, False, True])
  inner = lambda m, b, k: jnp.where(b[:, None], 100.0, m)
  out = prfl.attacks.concentrated(inner, share=0.5)(messages, byzantine,
                                                    jax.random.key(0))
  np.testing.assert_array_equal(out[:4], messages[:4])
  if attacked:
    np.testing.assert_array_equal(out[4], [100.0])
  else:
    assert np.isnan(out[4, 0])


def test_concentrated_share_is_at_most_one():
  """A share of 1 (every benign client counts as near) is allowed, 1.5 is
  refused naming `share`. Seen to fail when the upper bound is 2 (`share
  <= 1` -> `<= 2`, session 7's mutant #56 of `--preset attacks`)."""
  prfl.attacks.concentrated(prfl.attacks.alie(), share=1.0)
  with pytest.raises(ValueError, match=r"`share` must be a number in \(0, 1\]"):
    prfl.attacks.concentrated(prfl.attacks.alie(), share=1.5)


def test_alie_default_z_floors_half_n_plus_one_for_odd_n():
  """N = 5, f = 1: s = floor(5/2 + 1) - 1 = 2, z = Phi^{-1}(3/5) = 0.2533
  (Baruch et al.). Seen to fail with `ceil` (s = 3, z = -0.2533)."""
  messages = jnp.array([[1.0], [2.0], [4.0], [5.0], [0.0]])
  byzantine = jnp.array([False, False, False, False, True])
  out = prfl.attacks.alie()(messages, byzantine, jax.random.key(0))
  z = stats.norm.ppf(0.6)  # 0.2533
  np.testing.assert_allclose(out[4], [3.0 - z * np.sqrt(2.5)], rtol=1e-5)


def test_fang_krum_is_scale_equivariant():
  """Every term of Fang et al.'s Krum attack (the distances, the norms, the
  halving search's stop) scales with the messages, so messages shrunk 100x
  (every norm below 1) give the attack shrunk 100x. Seen to fail with the
  largest-norm term's mask value 0 made 1 (then the bound starts at 1 for
  short messages), a change `test_fang_krum_gets_a_byzantine_row_picked`
  let through (a Byzantine row is still picked)."""
  msgs = opt_tests._messages(3)  # pylint: disable=protected-access
  attack = prfl.attacks.fang_krum(opt_tests.F)
  out = attack(msgs, opt_tests.BYZ, jax.random.key(0))
  small = attack(jax.tree.map(lambda v: v / 100, msgs), opt_tests.BYZ,
                 jax.random.key(0))
  for name in msgs:
    np.testing.assert_allclose(small[name], out[name] / 100, rtol=1e-4,
                               atol=1e-7)


def _fang_krum_bound(benign, c=1):
  """Fang et al.'s lam0 for the benign rows and c Byzantine ones (NumPy)."""
  n, d = len(benign) + c, benign.shape[1]
  dist = np.linalg.norm(benign[:, None] - benign[None], axis=-1)
  sums = [np.sort(np.delete(row, i))[:n - c - 2].sum()
          for i, row in enumerate(dist)]
  return (min(sums) / ((n - 2 * c - 1) * np.sqrt(d)) +
          np.linalg.norm(benign, axis=1).max() / np.sqrt(d))


@pytest.mark.parametrize("benign, found_at", [
    ([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0], [0.2, 0.2]], 2),
    ([[1.0, 2.0], [2.0, 1.0], [0.0, 3.0], [3.0, 3.0], [1.0, 1.0]], 3)])
def test_fang_krum_keeps_the_first_lambda_that_gets_its_row_picked(
    benign, found_at):
  """The search halves lam from lam0 and keeps the first (largest) lam at
  which Krum (f = 1) picks the Byzantine row; if none does, the last lam
  tried (2 * lam0 / 2^halvings); here 4 halvings. First rows: Krum picks
  the Byzantine row at lam0 / 4 and lam0 / 8 (not at lam0, lam0 / 2), so
  lam0 / 4 is sent. Second rows (those of `test_fang_krum_starts_its_search_at_fangs_bound`):
  no lam gets it picked, so the fourth, lam0 / 8. Both checked in NumPy.
  Seen to fail when a lam is taken while `picks | (found < 0)` (session 11's
  sampled survivor attacks #200: the first lam is taken whatever Krum
  picks, then the last that gets the row picked: lam0 / 8, and lam0)."""
  benign = np.asarray(benign)
  msgs = jnp.asarray(np.vstack([benign, [[9.0, 9.0]]]))
  byz = jnp.array([False] * 5 + [True])
  out = prfl.attacks.fang_krum(1, halvings=4)(msgs, byz, jax.random.key(0))
  lam = _fang_krum_bound(benign) / 2 ** found_at
  np.testing.assert_allclose(out[5], -lam * np.sign(benign.mean(0)),
                             rtol=1e-5)
  np.testing.assert_allclose(out[:5], benign, rtol=1e-6)


@pytest.mark.parametrize("perturbation", ["unit", "sign"])
def test_min_max_moves_along_its_unit_or_sign_perturbation(perturbation):
  """Min-Max's other two directions (only "std" was tested):
  `-mu / ||mu||` or `-sign(mu)`, as far as the largest benign distance
  allows. The benign mean is made short (0.28, coordinates -0.05 to 0.2):
  the search spans gamma in (0, 20), so a unit direction reaches the bound
  (2.7 from the mean). Seen to fail with `-mu * ||mu||` for the unit
  direction (the search stopped 0.25 from the mean), with `+mu / ||mu||`
  (gamma < 0: session 7's mutant #270 of `--preset attacks`), and with the
  two directions swapped (session 14's sampled survivor attacks #277,
  `kind == 'sign'` -> `!=`), which the mean's coordinates, all 0.05 before,
  hid: the two directions were then parallel."""
  msgs = opt_tests._messages(1)  # pylint: disable=protected-access
  benign = ~np.asarray(opt_tests.BYZ)
  shift = {"a": jnp.array([0.05, 0.1, 0.2]), "b": jnp.array([-0.05, 0.15])}
  msgs = {k: v - v[benign].mean(0) + shift[k] for k, v in msgs.items()}
  out = opt_tests._flat(jax.jit(prfl.attacks.min_max(perturbation))(  # pylint: disable=protected-access
      msgs, opt_tests.BYZ, jax.random.key(0)))
  honest = opt_tests._flat(msgs)[~np.asarray(opt_tests.BYZ)]  # pylint: disable=protected-access
  mu = honest.mean(0)
  p = -mu / np.linalg.norm(mu) if perturbation == "unit" else -np.sign(mu)
  gamma = np.dot(out[-1] - mu, p) / np.dot(p, p)
  assert gamma > 0
  np.testing.assert_allclose(out[-1], mu + gamma * p, rtol=1e-4, atol=1e-4)
  bound = ((honest[:, None] - honest[None]) ** 2).sum(-1).max()
  gap = lambda g: ((honest - (mu + g * p)) ** 2).sum(1).max()
  assert gap(gamma * (1 - 1e-4)) <= bound < gap(gamma * (1 + 1e-3))


def test_fang_krum_starts_its_search_at_fangs_bound():
  """With one halving the search ends where it starts (lam0, or 2 * lam0 / 2),
  so the Byzantine row is Fang et al.'s bound lam0 = min_i (sum of benign row
  i's n - c - 2 nearest benign distances) / ((n - 2c - 1) sqrt(d)) + max
  benign norm / sqrt(d), times -sign(benign mean), checked in NumPy. Seen to
  fail with `n + 2 * c - 1` in the bound (only the scale was tested)."""
  benign = np.array([[1.0, 2.0], [2.0, 1.0], [0.0, 3.0], [3.0, 3.0],
                     [1.0, 1.0]])
  msgs = jnp.asarray(np.vstack([benign, [[9.0, 9.0]]]))
  byz = jnp.array([False] * 5 + [True])
  out = prfl.attacks.fang_krum(1, halvings=1)(msgs, byz, jax.random.key(0))
  n, c, d = 6, 1, 2
  dist = np.linalg.norm(benign[:, None] - benign[None], axis=-1)
  sums = [np.sort(np.delete(row, i))[:n - c - 2].sum()
          for i, row in enumerate(dist)]
  lam0 = (min(sums) / ((n - 2 * c - 1) * np.sqrt(d)) +
          np.linalg.norm(benign, axis=1).max() / np.sqrt(d))
  np.testing.assert_allclose(out[5], -lam0 * np.sign(benign.mean(0)),
                             rtol=1e-5)
  np.testing.assert_array_equal(out[:5], benign)


def test_fang_trimmed_mean_draws_beyond_each_benign_extreme():
  """The four cases of Fang et al.'s Section 4.3 on one coordinate each, b =
  2: mean > 0 and min 1 > 0: [0.5, 1]; mean > 0, min -1: [-2, -1]; mean < 0,
  max 0.5 > 0: [0.5, 1]; mean < 0, max -1: [-1, -0.5]. 60 Byzantine rows
  fill each interval. Seen to fail with `b / hi` for `b * hi` (a case no
  test had: [0.5, 4])."""
  benign = np.array([[1.0, -1.0, -3.0, -3.0], [2.0, 2.0, -1.0, -2.0],
                     [3.0, 3.0, 0.5, -1.0]])
  msgs = jnp.asarray(np.vstack([benign, np.zeros((60, 4))]))
  byz = jnp.arange(63) >= 3
  out = np.asarray(prfl.attacks.fang_trimmed_mean(2.0)(msgs, byz,
                                                       jax.random.key(0)))
  lo, hi = out[3:].min(0), out[3:].max(0)
  start, end = np.array([0.5, -2.0, 0.5, -1.0]), np.array([1, -1, 1, -0.5])
  assert np.all(lo >= start - 1e-6) and np.all(hi <= end + 1e-6)
  assert np.all(hi - lo > 0.9 * (end - start))
  np.testing.assert_array_equal(out[:3], benign)



def test_gaussian_sends_normal_noise_of_the_given_scale():
  """Byzantine rows are N(0, scale^2) noise: with scale 2 and 3,000 values,
  their standard deviation is within 10 % of 2 (a sample's std is off by
  about 1 / sqrt(2 * 3000) = 1.3 %) and the honest row is kept. Seen to
  fail when the noise is `scale / normal` (mutant #9 of session 8's
  `--preset attacks` run: heavy-tailed, its std far from 2)."""
  messages = jnp.ones((4, 1000))
  byzantine = jnp.arange(4) >= 1
  out = np.asarray(prfl.attacks.gaussian(2.0)(messages, byzantine,
                                              jax.random.key(0)))
  np.testing.assert_array_equal(out[0], 1.0)
  assert abs(np.std(out[1:]) - 2.0) < 0.2 and abs(np.mean(out[1:])) < 0.2


def test_fang_krum_accepts_a_krum_told_no_byzantine_clients():
  """A defender may run Krum told f = 0 (plain Krum), so the attack accepts
  `num_byzantine=0` (checked when it is built; running it is the other
  tests' job); -1 is refused naming `num_byzantine`. Seen to fail when the
  check's minimum is 1 (mutant #162 of session 9's `--preset attacks` run:
  f = 0 was refused)."""
  assert callable(prfl.attacks.fang_krum(0))
  with pytest.raises(ValueError, match="`num_byzantine` must be an integer"):
    prfl.attacks.fang_krum(-1)


def test_threshold_objective_is_the_mean_gap_over_byzantine_starts():
  """A radius (100) that holds every row: one step from any start moves the
  estimate to the weighted mean, the benign rows' (1) without the attack and
  all rows' (0 + 2 + 10) / 3 = 4 with it, so every start's gap is 3 and so
  is their mean over the Byzantine starts (one here). Seen to fail when the
  gaps are averaged over all N starts before the division by the Byzantine
  count (`jnp.mean` for `jnp.sum`, mutant #220 of session 9's `--preset
  attacks` run: 1 for 3; the line search, which only compares values, did
  not see it)."""
  # Jitted: one compile (0.9 s of CPU) for the eager run's many (4 s).
  objective = jax.jit(prfl.attacks.threshold_objective(100.0, 1))
  honest = jnp.array([[0.0], [2.0], [4.0]])
  attacked = jnp.array([[0.0], [2.0], [10.0]])
  byzantine = jnp.array([False, False, True])
  np.testing.assert_allclose(objective(attacked, honest, byzantine), 3.0,
                             rtol=1e-6)


def test_flip_labels_flips_label_zero_and_keeps_padding():
  """Label 0 is a class like any other: a Byzantine client's 0 becomes
  num_classes - 1 (and 9 becomes 0), its padding -1 stays, and a benign
  client's labels are kept. Seen to fail when only labels >= 1 flip (mutant
  #33 of session 9's `--preset attacks` run: 0 stayed 0)."""
  labels = jnp.array([[0, 9, -1], [0, 9, -1]])
  out = prfl.attacks.flip_labels(labels, jnp.array([True, False]), 10)
  np.testing.assert_array_equal(out, [[9, 0, -1], [0, 9, -1]])


def test_threshold_objective_divides_by_the_byzantine_count():
  """Two Byzantine starts, a radius (100) that holds every row: one step
  from any start gives the weighted mean, the benign rows' (0 + 2) / 2 = 1
  without the attack and all rows' (0 + 2 + 10 + 12) / 4 = 6 with it, so
  each Byzantine start's gap is 5 and so is their mean. Seen to fail when
  the count is the Byzantine share (`jnp.mean(byzantine)`, floored at 1:
  10, session 15's sampled survivor attacks #234) or multiplies (20,
  attacks #229); with one Byzantine row, as in the test above, the three
  agree, and the line search only compares values."""
  objective = jax.jit(prfl.attacks.threshold_objective(100.0, 1))
  honest = jnp.array([[0.0], [2.0], [4.0], [6.0]])
  attacked = jnp.array([[0.0], [2.0], [10.0], [12.0]])
  byzantine = jnp.array([False, False, True, True])
  np.testing.assert_allclose(objective(attacked, honest, byzantine), 5.0,
                             rtol=1e-6)


def test_fang_krum_takes_its_first_lambda_at_a_tiny_scale():
  """Benign rows (+-1, +-1) and (3, 3) over 10,000 coordinates (the rest
  0), one Byzantine row: Krum (f = 1) picks the Byzantine row at the first
  lam tried, Fang's bound lam0 (NumPy), so -lam0 * sign(mu) is sent, and
  at 1e-18 times the scale 1e-18 times that: lam0 is then 6.5e-20, whose
  square (4e-39) float32 flushes to 0 on CPU, while every squared distance
  the attack and Krum use (about 1e-36 and up) is kept. Seen to fail when
  the search's "not found" start is `-1.0 * lam0 * lam0` (session 15's
  sampled survivor attacks #217): it is then -0.0, `found < 0` never
  holds and the last lam, lam0 / 8, is sent; `-1.0 * lam0 / lam0` is -1
  at every positive finite lam0."""
  d = 10_000
  benign = np.zeros((5, d))
  benign[:, :2] = [[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0],
                   [3.0, 3.0]]
  msgs = np.zeros((6, d))
  msgs[:5] = benign
  msgs[5, :2] = 9.0
  byz = jnp.array([False] * 5 + [True])
  attack = jax.jit(prfl.attacks.fang_krum(1, halvings=4))
  want = -_fang_krum_bound(benign) * np.sign(benign.mean(0))
  for scale in (1.0, 1e-18):
    out = attack(jnp.asarray(msgs * scale, jnp.float32), byz,
                 jax.random.key(0))
    np.testing.assert_allclose(out[5], want * scale, rtol=1e-5,
                               atol=1e-7 * scale)


@pytest.mark.parametrize("byzantine_rows", [
    [[9.0, 9.0], [8.0, 7.0]], [[1.0, 2.0], [1.0, 1.0]]],
                         ids=["far", "on-benign-rows"])
def test_fang_krum_bound_counts_two_byzantine_rows(byzantine_rows):
  """Fang et al.'s bound with c = 2 Byzantine rows of n = 7: each benign
  row's n - c - 2 = 3 nearest benign distances over (n - 2c - 1) sqrt(d) =
  2 sqrt(2), plus the largest benign norm over sqrt(2) (NumPy: 4.354);
  with one halving the search returns it. Seen to fail when the
  denominator's 2c is 2 / c (session 15's sampled survivor attacks #200:
  5 sqrt(2) in the denominator, 3.541); every other test had c = 1, where
  2 * c = 2 / c. The Byzantine rows' own messages never enter the bound:
  the same 4.354 when they sit on benign rows. Seen to fail when the
  neighbour mask selects rows, not columns, by benignity (`benign[None,
  :]` -> `benign[:, None]`, session 15's sampled survivor attacks #184:
  distances 0 to the copies shrink the bound; far copies are never among
  the 3 nearest, so the far case alone passes)."""
  benign = np.array([[1.0, 2.0], [2.0, 1.0], [0.0, 3.0], [3.0, 3.0],
                     [1.0, 1.0]])
  msgs = jnp.asarray(np.vstack([benign, byzantine_rows]))
  byz = jnp.array([False] * 5 + [True] * 2)
  out = jax.jit(prfl.attacks.fang_krum(2, halvings=1))(msgs, byz,
                                                       jax.random.key(0))
  want = -_fang_krum_bound(benign, c=2) * np.sign(benign.mean(0))
  np.testing.assert_allclose(out[5:], [want, want], rtol=1e-5)
  np.testing.assert_array_equal(out[:5], benign)


@pytest.mark.parametrize("f", [3, 4])
def test_alie_default_z_stays_finite_for_a_byzantine_majority(f):
  """N = 5 and f = 3 or 4 Byzantine clients: s = floor(5/2 + 1) - f is 0
  or -1, so (N - s) / N is 1 or 1.2 and is clipped to 1 - 1e-6: z =
  Phi^{-1}(1 - 1e-6) = 4.75, and the Byzantine rows are mu - z sd of the
  benign rows (1 and 3: 2 - 4.75; one benign row: sd 0, the row itself).
  Seen to fail when the clip's upper end is 2 - 1e-6 (session 15's sampled
  survivor attacks #23: z = Phi^{-1}(1) = inf, or NaN past 1) and when it
  is 1 + 1e-6 (session 16's census survivor attacks #22, at 9158dc9: the
  same inf and NaN); every other test had a benign majority."""
  messages = jnp.array([[1.0], [3.0], [0.0], [0.0], [0.0]])
  if f == 4:
    messages = messages.at[1].set(0.0)
  byzantine = jnp.arange(5) >= 5 - f
  out = np.asarray(jax.jit(prfl.attacks.alie())(messages, byzantine,
                                                jax.random.key(0)))
  z = stats.norm.ppf(np.float32(1 - 1e-6))  # 4.7508 at float32's 1 - 1e-6
  want = 2.0 - z if f == 3 else 1.0
  np.testing.assert_allclose(out[5 - f:, 0], want, rtol=1e-4)
  np.testing.assert_array_equal(out[:5 - f], messages[:5 - f])


def test_min_max_unit_direction_has_length_one_for_a_short_mean():
  """Benign rows (3.1, 0) and (-2.9, 0): mean (0.1, 0), of norm 0.1, and
  largest squared distance 36; along the unit direction -mu / ||mu|| =
  (-1, 0) the bad row's farthest benign row, (3.1, 0), is 3 + gamma away,
  so gamma = 3 (inside the search's (0, 20)) and the row is (-2.9, 0).
  Seen to fail when the norm is floored at 1 instead of 1e-30 (session
  15's sampled survivor attacks #282: the direction is -mu, of length 0.1,
  and gamma stops near 20: (-1.9, 0)); the other test's mean had norm
  0.28, where the bound's gamma, 9.6, was still inside the search."""
  messages = jnp.array([[3.1, 0.0], [-2.9, 0.0], [7.0, 7.0]])
  byzantine = jnp.array([False, False, True])
  out = jax.jit(prfl.attacks.min_max("unit"))(messages, byzantine,
                                              jax.random.key(0))
  np.testing.assert_allclose(out[2], [-2.9, 0.0], atol=1e-5)
  np.testing.assert_array_equal(out[:2], messages[:2])


@pytest.mark.parametrize("use_sum", [False, True])
def test_min_max_sends_the_benign_mean_when_no_gamma_fits(use_sum):
  """Benign rows -1 and 1 (mean 0, sd 1; largest squared distance and
  largest row sum of them both 4), one search step at gamma_init 10: the
  bad row 0 - 10 * 1 is 9 and 11 from the benign rows (81 and 121 squared),
  past either bound, so no gamma is accepted and gamma stays 0: the
  Byzantine row is the benign mean, 0.
  Seen to fail when the accepted gamma starts at gamma_init instead of 0
  (session 15's sampled survivor attacks #325: -10 sent) and when the
  search keeps the rejected gamma instead of the accepted one (session 16's
  census survivor attacks #313, at 9158dc9, where(ok, gamma, good) ->
  where(ok, good, gamma): 10 kept, -10 sent); in every other test some
  gamma was accepted, which overwrites the start, and after 30 halvings
  the last rejected gamma is within 2^-30 gamma_init of the accepted one."""
  attack = prfl.attacks.min_sum if use_sum else prfl.attacks.min_max
  messages = jnp.array([[-1.0], [1.0], [5.0]])
  byzantine = jnp.array([False, False, True])
  out = jax.jit(attack(gamma_init=10.0, steps=1))(messages, byzantine,
                                                  jax.random.key(0))
  np.testing.assert_array_equal(out, [[-1.0], [1.0], [0.0]])


@pytest.mark.parametrize("use_sum", [False, True])
def test_min_max_accepts_a_gamma_exactly_at_the_bound(use_sum):
  """Benign rows -1 and 1 (mean 0, sd 1, p = -1), one search step at
  gamma_init 1: the bad row -1 is 0 and 2 from the benign rows, squared
  0 and 4, so its largest squared gap (Min-Max) and their sum (Min-Sum)
  are 4, exactly the bound (the largest squared benign distance, and the
  largest benign row sum of them, both 4): the condition is `<=`, gamma 1
  is accepted and -1 sent. Seen to fail when the condition is `<`
  (session 16's census survivor attacks #310, at 9158dc9: gamma 1
  rejected, the mean 0 sent); no other test put a gamma on the bound.
  Also seen to fail when gamma_init must exceed 1 (census survivor #288,
  `base_check <= 0` -> `<= 1`: ValueError) and when the search runs one
  step fewer (#323, `fori_loop(0, ...)` -> `fori_loop(1, ...)`: no step,
  the mean 0 sent); the other tests' gamma_init was 10, and one step
  fewer of 30 moves gamma by 2^-30 gamma_init."""
  attack = prfl.attacks.min_sum if use_sum else prfl.attacks.min_max
  messages = jnp.array([[-1.0], [1.0], [5.0]])
  byzantine = jnp.array([False, False, True])
  out = jax.jit(attack(gamma_init=1.0, steps=1))(messages, byzantine,
                                                 jax.random.key(0))
  np.testing.assert_array_equal(out, [[-1.0], [1.0], [-1.0]])


def test_fang_trimmed_mean_counts_a_zero_mean_as_not_positive():
  """Fang et al.'s Section 4.3 draws below the benign minimum where
  `s_k = sign(mu_k) > 0` and above the maximum elsewhere, so a coordinate
  whose benign mean is exactly 0 (benign values -1 and 1) gets values in
  [hi, b hi] = [1, 2] at b = 2; the second coordinate (values 1 and 3,
  mean 2 > 0) gets [lo / b, lo] = [0.5, 1]. 40 Byzantine rows fill each
  interval. Seen to fail when the test is `mu >= 0` (session 16's census
  survivor attacks #165, at 9158dc9: the zero-mean coordinate drawn in
  [b lo, lo] = [-2, -1]); no other test had a zero benign mean."""
  benign = np.array([[-1.0, 1.0], [1.0, 3.0]])
  msgs = jnp.asarray(np.vstack([benign, np.zeros((40, 2))]), jnp.float32)
  byz = jnp.arange(42) >= 2
  out = np.asarray(jax.jit(prfl.attacks.fang_trimmed_mean(2.0))(
      msgs, byz, jax.random.key(0)))
  lo, hi = out[2:].min(0), out[2:].max(0)
  start, end = np.array([1.0, 0.5]), np.array([2.0, 1.0])
  assert np.all(lo >= start - 1e-6) and np.all(hi <= end + 1e-6)
  assert np.all(hi - lo > 0.9 * (end - start))
  np.testing.assert_array_equal(out[:2], benign)


def test_jittered_moves_one_coordinate_rows_by_scale_times_their_norm():
  """One coordinate, 8 Byzantine rows of 10 (messages 1, ..., 10): the
  bit flip sends -x_j, and `jittered` adds `0.1 |x_j| e_j / |e_j|`, so
  each Byzantine row is -0.9 x_j or -1.1 x_j (by the sign of its normal
  draw e_j): moved by exactly 0.1 of its norm, however small |e_j|.
  Seen to fail when the noise's squared norm is floored at 1 instead of
  1e-30 (session 16's census survivor attacks #48, at 9158dc9: rows whose
  draw has |e_j| < 1, two in three in one dimension, move by only
  0.1 |x_j| |e_j|); the other jitter test has 5 coordinates, where
  |e_j|^2 is rarely below 1."""
  x = jnp.arange(1.0, 11.0)[:, None]
  byzantine = jnp.arange(10) >= 2
  out = np.asarray(jax.jit(prfl.attacks.jittered(prfl.attacks.bit_flip(),
                                                 0.1))(x, byzantine,
                                                       jax.random.key(4)))
  want = np.arange(1.0, 11.0)
  np.testing.assert_array_equal(out[:2, 0], want[:2])
  np.testing.assert_allclose(np.abs(out[2:, 0] + want[2:]), 0.1 * want[2:],
                             rtol=1e-5)


def test_fang_krum_bound_floors_its_counts_at_one_for_few_benign_rows():
  """c = 2 Byzantine rows of n = 5, benign rows (0, 0), (3, 4), (6, 8)
  (distances 5, 5, 10; norms up to 10): each benign row's n - c - 2 = 1
  nearest benign distance is 5, and the denominator's n - 2c - 1 = 0 is
  floored at 1, so lam0 = 5 / sqrt(2) + 10 / sqrt(2) = 15 / sqrt(2) by
  hand, sent with one halving as -lam0 sign(mu) = -(10.61, 10.61).
  Seen to fail when either floor is 2 (session 16's census survivors
  attacks #181, the neighbour count's: 2 nearest, 10 / sqrt(2) + ...,
  14.14; and #203, the denominator's: 8.84); the other tests' counts were
  all at least 2."""
  msgs = jnp.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [1.0, 1.0],
                    [2.0, 0.0]])
  byz = jnp.arange(5) >= 3
  out = np.asarray(jax.jit(prfl.attacks.fang_krum(1, halvings=1))(
      msgs, byz, jax.random.key(0)))
  lam0 = 15.0 / np.sqrt(2.0)
  np.testing.assert_allclose(out[3:], -lam0 * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_array_equal(out[:3], msgs[:3])


def test_fang_krum_search_sees_a_zero_mean_coordinate_as_zero():
  """Benign rows (1, +-1), (3, +-1): mean (2, 0), so the attack's
  direction -sign(mu) is (-1, 0) and its second coordinate is 0 at every
  lambda. c = 2 Byzantine rows of 6, Krum told f = 1: lam0 = 4 /
  sqrt(2) + sqrt(10) / sqrt(2) = 5.064 (each benign row's 2 nearest
  benign distances 2 and 2), and Krum's scores (3 nearest squared
  distances, NumPy by hand) pick a benign row at lam0 and lam0 / 2
  (16 < 75.6, 26.95) and a Byzantine one at lam0 / 4 (12.27 < 14.14):
  with 4 halvings (lam0 / 8 if none is picked) the row -lam0 / 4
  (1, 0) = (-1.266, 0) is sent. Seen to fail when the search's rows are
  `lam / s` instead of `lam * s` (session 16's census survivor attacks
  #208, at 9158dc9: lam / -0 puts -inf in the zero coordinate, Krum
  never picks a Byzantine row and lam0 / 8 is sent); with every
  coordinate of the mean nonzero, `s` is +-1 and the two agree."""
  benign = np.array([[1.0, 1.0], [1.0, -1.0], [3.0, 1.0], [3.0, -1.0]])
  msgs = jnp.asarray(np.vstack([benign, [[2.0, 0.5], [2.0, -0.5]]]),
                     jnp.float32)
  byz = jnp.arange(6) >= 4
  out = np.asarray(jax.jit(prfl.attacks.fang_krum(1, halvings=4))(
      msgs, byz, jax.random.key(0)))
  lam0 = (4.0 + np.sqrt(10.0)) / np.sqrt(2.0)
  np.testing.assert_allclose(out[4:], [[-lam0 / 4, 0.0]] * 2, rtol=1e-6)
  np.testing.assert_array_equal(out[:4], benign)


@pytest.mark.parametrize("scale", [1e19, 1e-22])
def test_fang_krum_bound_and_search_at_scales_whose_squares_overflow_or_underflow(
    scale):
  """The zero-mean-coordinate case above times c: Fang's bound and Krum's
  choices are scale-equivariant, so -c lam0 / 4 (1, 0) is sent, lam0 = (4
  + sqrt(10)) / sqrt(2) by hand. At c = 1e19 the benign rows' squares
  overflow float32 and at c = 1e-22 they underflow to 0. Seen to fail
  before the distances and norms were taken on the rows times a power of
  two (`sqrt(pairwise_sq_distances(messages))`: lam0 inf at 1e19, every
  row sent inf or NaN; lam0 0 at 1e-22, zero rows sent)."""
  benign = np.array([[1.0, 1.0], [1.0, -1.0], [3.0, 1.0], [3.0, -1.0]])
  msgs = jnp.asarray(scale * np.vstack([benign, [[2.0, 0.5], [2.0, -0.5]]]),
                     jnp.float32)
  byz = jnp.arange(6) >= 4
  out = np.asarray(jax.jit(prfl.attacks.fang_krum(1, halvings=4))(
      msgs, byz, jax.random.key(0)))
  lam0 = (4.0 + np.sqrt(10.0)) / np.sqrt(2.0)
  np.testing.assert_allclose(out[4:], [[-scale * lam0 / 4, 0.0]] * 2,
                             rtol=1e-6)
  np.testing.assert_array_equal(out[:4], msgs[:4])


@pytest.mark.parametrize("use_sum", [False, True])
@pytest.mark.parametrize("scale", [1e19, 1e-22])
def test_min_max_bound_at_scales_whose_squares_overflow_or_underflow(
    use_sum, scale):
  """Benign -c and c, a Byzantine row 5 c, gamma_init 1, 3 steps: p = -std
  = -c, and gamma 1 fits (squared gaps 0 and 4 c^2 against the bound 4 c^2,
  sum and max alike) while 1.5 (0.25, 6.25) and 1.25 (0.0625, 5.0625) do
  not, so -c is sent, by hand. At c = 1e19 the squares overflow float32
  and at c = 1e-22 they underflow to 0. Seen to fail with the distances
  taken on the rows as given (main at bbd1ebb: bound and gaps inf, or all
  0, so every gamma fits and -1.75 c is sent)."""
  attack = prfl.attacks.min_sum if use_sum else prfl.attacks.min_max
  messages = jnp.asarray(scale * np.array([[-1.0], [1.0], [5.0]]),
                         jnp.float32)
  byzantine = jnp.array([False, False, True])
  out = jax.jit(attack(gamma_init=1.0, steps=3))(messages, byzantine,
                                                 jax.random.key(0))
  np.testing.assert_allclose(np.asarray(out)[:, 0] / scale, [-1.0, 1.0, -1.0],
                             rtol=1e-6)


@pytest.mark.parametrize("scale", [1e19, 1e-22])
def test_jittered_moves_rows_whose_squares_overflow_or_underflow(scale):
  """The one-coordinate jitter case above times c: every Byzantine row is
  -0.9 x_j or -1.1 x_j times c, moved by exactly 0.1 of its norm. At c =
  1e19 the rows' squares overflow float32 (ratio inf: rows inf on
  main at 5dfdd1f) and at c = 1e-22 they underflow (ratio 0: rows left at
  -x_j c); seen to fail there."""
  x = jnp.asarray(scale * np.arange(1.0, 11.0)[:, None], jnp.float32)
  byzantine = jnp.arange(10) >= 2
  out = np.asarray(jax.jit(prfl.attacks.jittered(prfl.attacks.bit_flip(),
                                                 0.1))(x, byzantine,
                                                       jax.random.key(4)))
  want = np.arange(1.0, 11.0)
  np.testing.assert_allclose(out[:2, 0] / scale, want[:2], rtol=1e-7)
  np.testing.assert_allclose(np.abs(out[2:, 0] / scale + want[2:]),
                             0.1 * want[2:], rtol=1e-5)
