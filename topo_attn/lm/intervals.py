"""95% intervals for accuracies over probes: a percentile bootstrap per cell, a paired bootstrap for the
difference between two selectors scored on the same probes, and the Wilson score interval as a closed-form
cross-check.

Every function takes outcomes, one per probe (``bool`` or ``0``/``1`` numbers, 1-D, at least one), and returns a
named tuple whose fields are the columns of a results row (``row._asdict()``): :class:`Interval`
``(accuracy, n, ci_low, ci_high)`` or :class:`Difference` ``(difference, n, ci_low, ci_high)``.

The bootstraps resample probes with replacement ``resamples`` times, seeded, in one vectorised draw: the mean
of ``n`` outcomes resampled from 0/1 data with ``k`` ones is ``Binomial(n, k / n) / n`` exactly, and a
resampled set of pairs is ``Multinomial(n, cell shares)`` over the four cells ``(a, b)`` of the pairs, so no
``resamples x n`` index array is built. The interval is the ``(1 - confidence) / 2`` and
``(1 + confidence) / 2`` quantiles of the resampled statistic (the percentile method).

Pairing: two selectors scored on the same probes share the probes' difficulty; the paired bootstrap resamples
probes (both outcomes of a probe together), so that shared difficulty cancels and the interval of the
difference is narrower than that of independent samples (:func:`unpaired_difference`) when the outcomes are
positively correlated.

Losses are paired too: :func:`paired_mean_difference` takes two real values per item (a document's bits per
byte under two attentions) and gives the mean difference with a paired percentile bootstrap over the items
(``scipy.stats.bootstrap``), so that the documents' own difficulty cancels.

Edge cases: when every outcome is equal (all correct, all wrong, ``n == 1``) every resample is equal, so the
bootstrap interval is the single point ``[accuracy, accuracy]``; the Wilson interval still has width (for 16 of
16 correct, about ``[0.81, 1]``) and is the one to quote for such cells. No function returns NaN; bounds lie in
``[0, 1]`` (``[-1, 1]`` for differences).
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import NamedTuple

import numpy as np
from scipy import stats

from .._checks import check_int

CONFIDENCE = 0.95
RESAMPLES = 10_000


class Interval(NamedTuple):
    """An accuracy over ``n`` probes and its interval ``[ci_low, ci_high]``."""

    accuracy: float
    n: int
    ci_low: float
    ci_high: float


class Difference(NamedTuple):
    """A difference of accuracies (``a`` minus ``b``), over ``n`` outcomes, and its interval."""

    difference: float
    n: int
    ci_low: float
    ci_high: float


def outcomes(name: str, values: object) -> np.ndarray:
    """``values`` as a ``bool [n]`` array, ``n >= 1``.

    Raises
    ------
    TypeError
        Not an array-like of booleans or numbers.
    ValueError
        Not 1-D, empty, or a value other than 0 and 1.
    """
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be booleans or 0/1 numbers, got {type(values).__name__}")
    array = np.asarray(values)
    if array.dtype != bool and not np.issubdtype(array.dtype, np.number):
        raise TypeError(f"{name} must be booleans or 0/1 numbers, got dtype {array.dtype}")
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of outcomes, got shape {array.shape}")
    if array.dtype != bool:
        if not np.isin(array, (0, 1)).all():
            raise ValueError(f"{name} must hold only 0 and 1 (or booleans)")
        array = array.astype(bool)
    return array


def measurements(name: str, values: object) -> np.ndarray:
    """``values`` as a ``float64 [n]`` array, ``n >= 1``: the real-valued twin of :func:`outcomes`.

    Raises
    ------
    TypeError
        Not an array-like of real numbers (booleans are outcomes, not measurements).
    ValueError
        Not 1-D, empty, or a value that is not finite.
    """
    array = np.asarray(values)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.number):
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if array.ndim != 1 or array.size < 1 or not np.isfinite(array).all():
        raise ValueError(f"{name} must be 1-D with at least one value, all finite; got shape {array.shape}")
    return array.astype(np.float64)


def _confidence(confidence: object) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, Real):
        raise TypeError(f"confidence must be a number, got {type(confidence).__name__}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return float(confidence)


def _rng(seed: object) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (Integral, np.random.Generator)):
        raise TypeError(f"seed must be an int or a numpy.random.Generator, got {type(seed).__name__}")
    return np.random.default_rng(seed)


def _percentiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    low, high = np.quantile(samples, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def bootstrap_interval(correct: object, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                       seed: int | np.random.Generator = 0) -> Interval:
    """The accuracy of ``correct`` and its percentile bootstrap interval.

    Parameters
    ----------
    correct : array-like of bool or 0/1, shape ``[n]``
        One outcome per probe.
    confidence : float
        The interval's coverage, in ``(0, 1)``.
    resamples : int
        Bootstrap resamples (``>= 1``).
    seed : int or numpy.random.Generator
        Seeds the resampling.

    Returns
    -------
    Interval
        ``(accuracy, n, ci_low, ci_high)``, ``0 <= ci_low <= ci_high <= 1``; a single point when every
        outcome is equal (see the module's notes).
    """
    correct = outcomes("correct", correct)
    confidence, resamples = _confidence(confidence), check_int("resamples", resamples, 1)
    n, k = correct.size, int(correct.sum())
    means = _rng(seed).binomial(n, k / n, resamples) / n
    return Interval(k / n, n, *_percentiles(means, confidence))


def wilson_interval(correct: object, confidence: float = CONFIDENCE) -> Interval:
    """The accuracy of ``correct`` and its Wilson score interval (closed form, via
    ``scipy.stats.binomtest(...).proportion_ci(method="wilson")``): ``(p + z^2/2n -+ z sqrt(p(1-p)/n +
    z^2/4n^2)) / (1 + z^2/n)`` with ``z`` the normal quantile of ``(1 + confidence) / 2``.

    Returns
    -------
    Interval
        ``(accuracy, n, ci_low, ci_high)``, within ``[0, 1]``; of positive width for every ``n``.
    """
    correct = outcomes("correct", correct)
    confidence = _confidence(confidence)
    n, k = correct.size, int(correct.sum())
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(k / n, n, max(0.0, float(ci.low)), min(1.0, float(ci.high)))


def paired_difference(a: object, b: object, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                      seed: int | np.random.Generator = 0) -> Difference:
    """The accuracy of ``a`` minus that of ``b``, scored on the same probes (``a[i]`` and ``b[i]`` are the
    outcomes of probe ``i``), and its paired percentile bootstrap interval (probes resampled, both outcomes of
    a probe together).

    Parameters
    ----------
    a, b : array-like of bool or 0/1, shape ``[n]``
        Outcomes of two selectors on the same ``n`` probes, in the same order.
    confidence, resamples, seed
        As :func:`bootstrap_interval`.

    Returns
    -------
    Difference
        ``(difference, n, ci_low, ci_high)``, ``-1 <= ci_low <= ci_high <= 1``; ``(0, n, 0, 0)`` when the
        outcomes agree on every probe.

    Raises
    ------
    ValueError
        ``a`` and ``b`` differ in length (or as :func:`outcomes`).
    """
    a, b = outcomes("a", a), outcomes("b", b)
    if a.size != b.size:
        raise ValueError(f"b must score the same probes as a: a has {a.size} outcomes, b has {b.size}")
    confidence, resamples = _confidence(confidence), check_int("resamples", resamples, 1)
    n = a.size
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    cells = _rng(seed).multinomial(n, [only_a / n, only_b / n, (n - only_a - only_b) / n], resamples)
    differences = (cells[:, 0] - cells[:, 1]) / n
    return Difference((only_a - only_b) / n, n, *_percentiles(differences, confidence))


def unpaired_difference(a: object, b: object, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                        seed: int | np.random.Generator = 0) -> Difference:
    """The accuracy of ``a`` minus that of ``b`` for independent probe sets (lengths may differ), with each
    set resampled on its own; ``n`` is ``len(a) + len(b)``. For selectors scored on the same probes use
    :func:`paired_difference`."""
    a, b = outcomes("a", a), outcomes("b", b)
    confidence, resamples = _confidence(confidence), check_int("resamples", resamples, 1)
    rng = _rng(seed)
    pa, pb = a.mean(), b.mean()
    differences = rng.binomial(a.size, pa, resamples) / a.size - rng.binomial(b.size, pb, resamples) / b.size
    return Difference(float(pa - pb), a.size + b.size, *_percentiles(differences, confidence))


def accuracy_text(cell: dict) -> str:
    """A table cell for a result row's ``accuracy`` with its interval ``ci_low`` .. ``ci_high``, as percentages:
    ``"75% [50%, 100%]"``."""
    return f"{cell['accuracy']:.0%} [{cell['ci_low']:.0%}, {cell['ci_high']:.0%}]"


def paired_mean_difference(a: object, b: object, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                           seed: int | np.random.Generator = 0) -> Difference:
    """The mean of ``a - b`` over items measured both ways (``a[i]`` and ``b[i]``: item ``i``, e.g. one document's
    bits per byte under two attentions) and its paired percentile bootstrap interval (items resampled, both
    values of an item together; ``scipy.stats.bootstrap``).

    Parameters
    ----------
    a, b : array-like of finite real numbers, shape ``[n]``, ``n >= 1``
        The two measurements of the same ``n`` items, in the same order.
    confidence, resamples, seed
        As :func:`bootstrap_interval`.

    Returns
    -------
    Difference
        ``(difference, n, ci_low, ci_high)``; the single point ``[difference, difference]`` when every item's
        difference is the same (``n == 1`` included).

    Raises
    ------
    TypeError
        ``a`` or ``b`` is not numeric.
    ValueError
        ``a`` or ``b`` is not 1-D with at least one finite value each, or their lengths differ.
    """
    a, b = measurements("a", a), measurements("b", b)
    if a.size != b.size:
        raise ValueError(f"b must measure the same items as a: a has {a.size} values, b has {b.size}")
    confidence, resamples = _confidence(confidence), check_int("resamples", resamples, 1)
    differences = a - b
    mean = float(differences.mean())
    if np.ptp(differences) == 0:
        return Difference(mean, differences.size, mean, mean)
    found = stats.bootstrap((differences,), np.mean, confidence_level=confidence, n_resamples=resamples,
                            method="percentile", random_state=_rng(seed))
    interval = found.confidence_interval
    return Difference(mean, differences.size, float(interval.low), float(interval.high))
