"""Intervals for accuracies (topo_attn.lm.intervals): coverage of the bootstrap on simulated Bernoulli data,
agreement with Wilson (itself checked against the closed form written here) and with scipy's own bootstrap,
the paired interval against the unpaired one for correlated pairs, edge cases and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from topo_attn.lm import intervals


def bernoulli(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    return rng.random(n) < p


def wilson_closed_form(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    z = stats.norm.ppf((1 + confidence) / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize("p, n", [(0.3, 60), (0.8, 40)])
def test_bootstrap_covers_the_true_accuracy_about_95_percent_of_the_time(p, n):
    rng = np.random.default_rng(int(p * 100) + n)
    trials = 600
    hits = 0
    for t in range(trials):
        ci = intervals.bootstrap_interval(bernoulli(rng, n, p), resamples=2000, seed=t)
        hits += ci.ci_low <= p <= ci.ci_high
    assert 0.90 <= hits / trials <= 0.985


def test_wilson_matches_the_closed_form_and_covers():
    rng = np.random.default_rng(11)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        correct = bernoulli(rng, n, rng.random())
        ci = intervals.wilson_interval(correct)
        low, high = wilson_closed_form(int(correct.sum()), n)
        assert ci.accuracy == correct.mean() and ci.n == n
        assert ci.ci_low == pytest.approx(max(0.0, low), abs=1e-9)
        assert ci.ci_high == pytest.approx(min(1.0, high), abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bootstrap_agrees_with_wilson_for_moderate_n(seed):
    rng = np.random.default_rng(100 + seed)
    p, n = rng.uniform(0.3, 0.7), 400
    correct = bernoulli(rng, n, p)
    boot, wilson = intervals.bootstrap_interval(correct, seed=seed), intervals.wilson_interval(correct)
    assert boot.accuracy == wilson.accuracy == correct.mean()
    assert abs(boot.ci_low - wilson.ci_low) < 0.015 and abs(boot.ci_high - wilson.ci_high) < 0.015
    assert boot.ci_low < boot.accuracy < boot.ci_high


def test_bootstrap_agrees_with_scipys_resampling_of_probes():
    """The binomial shortcut is the distribution of the resampled mean: scipy's percentile bootstrap, which
    resamples indices, gives the same interval up to Monte-Carlo error."""
    rng = np.random.default_rng(5)
    correct = bernoulli(rng, 120, 0.65)
    ours = intervals.bootstrap_interval(correct, resamples=20000, seed=1)
    ref = stats.bootstrap((correct.astype(float),), np.mean, method="percentile", n_resamples=20000,
                          random_state=np.random.default_rng(2)).confidence_interval
    assert abs(ours.ci_low - ref.low) < 0.02 and abs(ours.ci_high - ref.high) < 0.02


def test_paired_difference_agrees_with_scipys_paired_bootstrap():
    rng = np.random.default_rng(6)
    a = bernoulli(rng, 150, 0.7)
    b = np.where(rng.random(150) < 0.2, ~a, a)
    ours = intervals.paired_difference(a, b, resamples=20000, seed=3)
    ref = stats.bootstrap((a.astype(float), b.astype(float)), lambda x, y, axis: x.mean(axis) - y.mean(axis),
                          paired=True, vectorized=True, method="percentile", n_resamples=20000,
                          random_state=np.random.default_rng(4)).confidence_interval
    assert ours.difference == pytest.approx(a.mean() - b.mean())
    assert abs(ours.ci_low - ref.low) < 0.015 and abs(ours.ci_high - ref.high) < 0.015


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paired_interval_is_narrower_than_unpaired_for_correlated_pairs(seed):
    rng = np.random.default_rng(200 + seed)
    n = 200
    a = bernoulli(rng, n, rng.uniform(0.5, 0.8))
    b = np.where(rng.random(n) < 0.1, ~a, a)  # the same probe is mostly hard or easy for both
    paired = intervals.paired_difference(a, b, seed=seed)
    unpaired = intervals.unpaired_difference(a, b, seed=seed)
    assert paired.difference == pytest.approx(unpaired.difference) == pytest.approx(a.mean() - b.mean())
    assert paired.n == n and unpaired.n == 2 * n
    assert paired.ci_high - paired.ci_low < 0.75 * (unpaired.ci_high - unpaired.ci_low)
    # for independent pairs the two agree
    c = bernoulli(rng, n, 0.6)
    p2, u2 = intervals.paired_difference(a, c, seed=seed), intervals.unpaired_difference(a, c, seed=seed)
    assert abs((p2.ci_high - p2.ci_low) - (u2.ci_high - u2.ci_low)) < 0.03


def test_paired_difference_covers_the_true_difference():
    rng = np.random.default_rng(7)
    trials, n, hits = 400, 80, 0
    for t in range(trials):
        a = bernoulli(rng, n, 0.7)
        b = np.where(rng.random(n) < 0.3, bernoulli(rng, n, 0.5), a)  # true accuracy of b: 0.7 * 0.7 + 0.15
        ci = intervals.paired_difference(a, b, resamples=2000, seed=t)
        hits += ci.ci_low <= 0.7 - (0.49 + 0.15) <= ci.ci_high
    assert 0.89 <= hits / trials <= 0.99


@pytest.mark.parametrize("n", [1, 2, 7, 50])
def test_edge_cases_have_no_nan_and_stay_in_bounds(n):
    rng = np.random.default_rng(n)
    for correct in (np.ones(n, bool), np.zeros(n, bool), bernoulli(rng, n, 0.5)):
        k = int(correct.sum())
        for ci in (intervals.bootstrap_interval(correct, seed=n), intervals.wilson_interval(correct)):
            assert not any(math.isnan(x) for x in ci)
            assert 0 <= ci.ci_low <= ci.accuracy <= ci.ci_high <= 1 and ci.n == n and ci.accuracy == k / n
        boot, wilson = intervals.bootstrap_interval(correct, seed=n), intervals.wilson_interval(correct)
        if k in (0, n):  # every resample equal: a point; Wilson keeps a width
            assert boot.ci_low == boot.ci_high == k / n
            assert wilson.ci_high - wilson.ci_low > 0
            assert (wilson.ci_high == 1.0) if k == n else (wilson.ci_low == 0.0)
    same = intervals.paired_difference(np.ones(n, bool), np.ones(n, bool), seed=n)
    assert tuple(same) == (0.0, n, 0.0, 0.0)
    flipped = intervals.paired_difference(np.ones(n, bool), np.zeros(n, bool), seed=n)
    assert tuple(flipped) == (1.0, n, 1.0, 1.0)


def test_seeded_and_accepts_ints():
    rng = np.random.default_rng(9)
    correct = bernoulli(rng, 30, 0.5)
    a = intervals.bootstrap_interval(correct, resamples=500, seed=3)
    assert a == intervals.bootstrap_interval(correct.astype(int).tolist(), resamples=500, seed=3)
    assert a == intervals.bootstrap_interval(correct.astype(float), resamples=500, seed=np.random.default_rng(3))
    assert a != intervals.bootstrap_interval(correct, resamples=500, seed=4)
    assert set(a._asdict()) == {"accuracy", "n", "ci_low", "ci_high"}
    x, y = bernoulli(rng, 30, 0.5), bernoulli(rng, 30, 0.5)
    assert intervals.paired_difference(x, y, seed=1) == intervals.paired_difference(x, y, seed=1)


def test_a_higher_confidence_gives_a_wider_interval():
    correct = bernoulli(np.random.default_rng(12), 100, 0.6)
    narrow = intervals.bootstrap_interval(correct, confidence=0.5, seed=0)
    wide = intervals.bootstrap_interval(correct, confidence=0.99, seed=0)
    assert wide.ci_low < narrow.ci_low and narrow.ci_high < wide.ci_high


@pytest.mark.parametrize("call, error, name", [
    (lambda: intervals.bootstrap_interval([]), ValueError, "correct"),
    (lambda: intervals.bootstrap_interval([0, 1, 2]), ValueError, "correct"),
    (lambda: intervals.bootstrap_interval([[0, 1]]), ValueError, "correct"),
    (lambda: intervals.bootstrap_interval("0101"), TypeError, "correct"),
    (lambda: intervals.bootstrap_interval(np.array(["a"])), TypeError, "correct"),
    (lambda: intervals.bootstrap_interval([1, 0], confidence=1.5), ValueError, "confidence"),
    (lambda: intervals.bootstrap_interval([1, 0], confidence="high"), TypeError, "confidence"),
    (lambda: intervals.bootstrap_interval([1, 0], resamples=0), ValueError, "resamples"),
    (lambda: intervals.bootstrap_interval([1, 0], seed="x"), TypeError, "seed"),
    (lambda: intervals.wilson_interval([0.5]), ValueError, "correct"),
    (lambda: intervals.paired_difference([1, 0], [1, 0, 1]), ValueError, "b"),
    (lambda: intervals.paired_difference([1, 0], []), ValueError, "b"),
    (lambda: intervals.unpaired_difference([], [1]), ValueError, "a"),
])
def test_errors_name_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_accuracy_text_shows_the_interval():
    assert intervals.accuracy_text({"accuracy": 0.75, "ci_low": 0.5, "ci_high": 1.0}) == "75% [50%, 100%]"
    assert intervals.accuracy_text({"accuracy": 0.0, "ci_low": 0.0, "ci_high": 0.125}) == "0% [0%, 12%]"


def test_paired_mean_difference_agrees_with_a_paired_resampling_of_items():
    """Real-valued pairs (a document's bits per byte under two attentions): the mean difference, and an interval
    that agrees with resampling the items' index by hand, both values of an item together."""
    rng = np.random.default_rng(21)
    difficulty = rng.gamma(4.0, 0.25, 64)  # shared by both measurements of a document
    a = difficulty + rng.normal(0.05, 0.02, 64)
    b = difficulty + rng.normal(0.0, 0.02, 64)
    ours = intervals.paired_mean_difference(a, b, resamples=20000, seed=3)
    picks = np.random.default_rng(4).integers(0, 64, (20000, 64))
    ref = np.quantile(a[picks].mean(axis=1) - b[picks].mean(axis=1), [0.025, 0.975])
    assert ours.difference == pytest.approx(float((a - b).mean())) and ours.n == 64
    assert abs(ours.ci_low - ref[0]) < 0.002 and abs(ours.ci_high - ref[1]) < 0.002
    assert 0 < ours.ci_low < ours.difference < ours.ci_high  # the shared difficulty cancels: a clear gap
    unpaired = stats.bootstrap((a, b), lambda x, y, axis: x.mean(axis) - y.mean(axis), method="percentile",
                               n_resamples=5000, vectorized=True, random_state=np.random.default_rng(5))
    assert ours.ci_high - ours.ci_low < 0.5 * (unpaired.confidence_interval.high - unpaired.confidence_interval.low)


def test_paired_mean_difference_covers_the_true_difference():
    rng = np.random.default_rng(22)
    trials, hits = 300, 0
    for t in range(trials):
        base = rng.normal(1.0, 0.3, 40)
        ci = intervals.paired_mean_difference(base + rng.normal(0.1, 0.05, 40), base, resamples=2000, seed=t)
        hits += ci.ci_low <= 0.1 <= ci.ci_high
    assert 0.88 <= hits / trials <= 0.99


def test_paired_mean_difference_of_equal_differences_is_a_point():
    rng = np.random.default_rng(23)
    a = rng.normal(size=9)
    assert intervals.paired_mean_difference(a + 0.25, a) == pytest.approx((0.25, 9, 0.25, 0.25))
    one = intervals.paired_mean_difference([1.5], [1.0])
    assert one == pytest.approx((0.5, 1, 0.5, 0.5))


@pytest.mark.parametrize("a, b, error, name", [
    ([1.0, 2.0], [1.0], ValueError, "b"),
    ([], [], ValueError, "a"),
    ([1.0, float("nan")], [1.0, 2.0], ValueError, "a"),
    ([[1.0]], [[1.0]], ValueError, "a"),
    ([True, False], [1.0, 2.0], TypeError, "a"),
    ([1.0, 2.0], ["x", "y"], TypeError, "b"),
])
def test_paired_mean_difference_errors_name_the_argument(a, b, error, name):
    with pytest.raises(error, match=f"^{name} "):
        intervals.paired_mean_difference(a, b)
