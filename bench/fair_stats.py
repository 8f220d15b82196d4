"""Statistics for comparing training arms that were run at the same seeds, so that the design is paired over seeds.

Paired tests (Student's t, exact Wilcoxon signed-rank), a paired bootstrap over seeds, Holm's correction for many
comparisons, bootstraps over test classes for one run or for the difference of two runs, and the wording a report
uses for p-values and verdicts. Pure functions on numpy arrays or lists of floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "PairedTest",
    "RankTest",
    "paired_t",
    "wilcoxon_signed_rank",
    "paired_bootstrap_ci",
    "holm",
    "class_bootstrap_ci",
    "paired_class_bootstrap_ci",
    "format_p",
    "verdict",
]

# Above this many non-zero differences, tied |d| make an exact enumeration (2**n sign patterns) too costly and the
# normal approximation is used instead.
_MAX_EXACT_WITH_TIES = 16
# Bound on the (resamples x classes) count matrix built at once by the class bootstrap, to cap its memory.
_MAX_CELLS = 4_000_000


@dataclass(frozen=True)
class PairedTest:
    """A paired t-test: mean of a - b, its t statistic, the two-sided p, and the number of pairs."""

    mean_diff: float
    t: float
    p: float
    n: int


@dataclass(frozen=True)
class RankTest:
    """A Wilcoxon signed-rank test.

    mean_diff is the mean of a - b over all n pairs; statistic is scipy's two-sided one, min(W+, W-), over the
    n_nonzero pairs whose difference is not zero (the others are dropped before ranking).
    """

    mean_diff: float
    statistic: float
    p: float
    n: int
    n_nonzero: int


def _as_finite(x: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _differences(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, min_n: int) -> np.ndarray:
    a_arr = _as_finite(a, "a")
    b_arr = _as_finite(b, "b")
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"a and b must have the same length (one value per seed), got {a_arr.size} and {b_arr.size}")
    if a_arr.size < min_n:
        raise ValueError(f"need at least {min_n} pairs, got {a_arr.size}")
    return a_arr - b_arr


def _check_bootstrap(level: float, resamples: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")


def _percentile_ci(stat: np.ndarray, level: float, lo: float, hi: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(stat, [tail, 1.0 - tail])
    # Every resampled statistic is a mean of values in [lo, hi]; rounding can step just outside, which would turn a
    # constant difference's interval into something other than (c, c).
    return float(np.clip(low, lo, hi)), float(np.clip(high, lo, hi))


def paired_t(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> PairedTest:
    """Paired Student's t-test of a - b, two-sided.

    Args:
        a, b: per-seed values of two arms, in the same seed order; equal length n >= 2, finite.

    Returns:
        PairedTest with t = mean(d) / (sd(d) / sqrt(n)) and p from Student's t with n - 1 degrees of freedom. When
        every difference is the same, t is +-inf with p = 0.0 (or t = 0.0 with p = 1.0 if they are all zero).

    Raises:
        ValueError: unequal lengths, fewer than 2 pairs, or NaN / infinite values.
    """
    d = _differences(a, b, min_n=2)
    n = d.size
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    # With no spread the t statistic is a division by zero; report the limit rather than NaN so tables stay sortable.
    if sd == 0.0:
        if mean == 0.0:
            return PairedTest(mean_diff=0.0, t=0.0, p=1.0, n=n)
        return PairedTest(mean_diff=mean, t=math.copysign(math.inf, mean), p=0.0, n=n)
    t = mean / (sd / math.sqrt(n))
    p = float(min(1.0, 2.0 * stats.t.sf(abs(t), df=n - 1)))
    return PairedTest(mean_diff=mean, t=float(t), p=p, n=n)


def wilcoxon_signed_rank(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> RankTest:
    """Two-sided Wilcoxon signed-rank test of a - b, exact wherever that is affordable.

    Zero differences are dropped (scipy's "wilcox" zero method); if all are zero, p = 1.0. Without ties among the
    remaining |d|, scipy's exact null distribution is used. With ties, the p is an exact enumeration of all sign
    patterns of the mid-ranks for up to 16 non-zero pairs, and the normal approximation beyond.

    The test is coarse at the seed counts a study affords: with n = 5 seeds the smallest possible two-sided p is
    2 / 2**5 = 0.0625 (all differences of one sign), so it can never reach 0.05 - which is why a report gives the
    paired t next to it.

    Args:
        a, b: per-seed values of two arms, in the same seed order; equal length n >= 1, finite.
    """
    d = _differences(a, b, min_n=1)
    mean = float(d.mean())
    nonzero = d[d != 0.0]
    m = nonzero.size
    if m == 0:
        return RankTest(mean_diff=mean, statistic=0.0, p=1.0, n=d.size, n_nonzero=0)
    magnitudes = np.abs(nonzero)
    has_ties = np.unique(magnitudes).size < m
    if not has_ties:
        method: str | stats.PermutationMethod = "exact"
    elif m <= _MAX_EXACT_WITH_TIES:
        # scipy's "exact" distribution assumes integer ranks; with mid-ranks an enumeration of all 2**m sign flips is
        # the exact conditional test (n_resamples=inf makes permutation_test enumerate rather than sample).
        method = stats.PermutationMethod(n_resamples=np.inf)
    else:
        method = "asymptotic"
    res = stats.wilcoxon(nonzero, zero_method="wilcox", alternative="two-sided", method=method)
    p = float(min(1.0, res.pvalue))
    return RankTest(mean_diff=mean, statistic=float(res.statistic), p=p, n=d.size, n_nonzero=m)


def paired_bootstrap_ci(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    level: float = 0.95,
    resamples: int = 10000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of mean(a - b), resampling seeds (the pairs) with replacement.

    Args:
        a, b: per-seed values of two arms, same seed order, equal length n >= 1.
        level: coverage of the interval, in (0, 1).
        resamples: number of bootstrap resamples.
        seed: seed of the numpy Generator that draws them; the result is deterministic for a given seed.

    Returns:
        (low, high).
    """
    _check_bootstrap(level, resamples)
    d = _differences(a, b, min_n=1)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(resamples, d.size))
    means = d[idx].mean(axis=1)
    return _percentile_ci(means, level, float(d.min()), float(d.max()))


def holm(pvalues: Sequence[float] | np.ndarray) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order.

    Step-down: with the p sorted ascending, the j-th (0-based) is multiplied by m - j, a running maximum keeps the
    adjusted values monotone, and each is capped at 1. An empty input gives [].

    Raises:
        ValueError: a p-value that is NaN or outside [0, 1].
    """
    p = np.asarray(pvalues, dtype=float).ravel()
    if p.size == 0:
        return []
    if np.any(np.isnan(p)):
        raise ValueError("p-values contain NaN")
    if np.any((p < 0.0) | (p > 1.0)):
        raise ValueError("p-values must lie in [0, 1]")
    m = p.size
    # A stable sort keeps tied p-values in input order, so equal inputs get equal adjusted values either way.
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted_sorted = np.maximum.accumulate(scaled)
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return [float(x) for x in adjusted]


def _class_bootstrap(
    values: np.ndarray, classes: Sequence | np.ndarray, level: float, resamples: int, seed: int
) -> tuple[float, float]:
    _check_bootstrap(level, resamples)
    labels = np.asarray(classes)
    if labels.shape != values.shape:
        raise ValueError(f"classes must give one label per query: {labels.size} labels for {values.size} values")
    if values.size == 0:
        raise ValueError("need at least one query")
    _, inverse = np.unique(labels, return_inverse=True)
    inverse = inverse.ravel()
    class_sums = np.bincount(inverse, weights=values)
    class_sizes = np.bincount(inverse).astype(float)
    k = class_sums.size
    class_means = class_sums / class_sizes
    rng = np.random.default_rng(seed)
    stat = np.empty(resamples)
    chunk = max(1, _MAX_CELLS // k)
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        # Draw k classes per resample (indices into the sorted distinct labels) and count how often each is drawn;
        # the drawn queries' mean is then two dot products, with no per-query gather.
        draws = rng.integers(0, k, size=(rows, k))
        offsets = (np.arange(rows) * k)[:, None]
        counts = np.bincount((draws + offsets).ravel(), minlength=rows * k).reshape(rows, k).astype(float)
        stat[start : start + rows] = (counts @ class_sums) / (counts @ class_sizes)
    return _percentile_ci(stat, level, float(class_means.min()), float(class_means.max()))


def class_bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    classes: Sequence | np.ndarray,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of one run's mean per-query metric, resampling test classes.

    Queries of one class are not independent (they share a class's difficulty), so the distinct classes are drawn
    with replacement and each drawn class brings all its queries (a class drawn twice counts twice); the statistic is
    the mean over the drawn queries.

    Args:
        values: per-query metric values of one run (e.g. the AP@R of each test query), finite.
        classes: the class label of each query, same length as values; any sortable labels.
        level: coverage of the interval, in (0, 1).
        resamples: number of bootstrap resamples.
        seed: seed of the numpy Generator; resample r draws its classes as row r of
            rng.integers(0, k, size=(resamples, k)), indices into the k distinct labels in sorted order.

    Returns:
        (low, high).
    """
    return _class_bootstrap(_as_finite(values, "values"), classes, level, resamples, seed)


def paired_class_bootstrap_ci(
    values_a: Sequence[float] | np.ndarray,
    values_b: Sequence[float] | np.ndarray,
    classes: Sequence | np.ndarray,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Class bootstrap confidence interval of mean(a) - mean(b) for two runs evaluated on the same queries.

    Both runs see the same class draws, so the interval reflects the difference rather than the two runs' separate
    spreads; this equals class_bootstrap_ci of the per-query differences.

    Args:
        values_a, values_b: per-query metric values of the two runs, same queries in the same order.
        classes: the class label of each query.
        level, resamples, seed: as in class_bootstrap_ci.

    Returns:
        (low, high).
    """
    a = _as_finite(values_a, "values_a")
    b = _as_finite(values_b, "values_b")
    if a.shape != b.shape:
        raise ValueError(f"values_a and values_b must cover the same queries, got {a.size} and {b.size} values")
    # Over the same drawn queries, mean(a) - mean(b) is the mean of the per-query differences.
    return _class_bootstrap(a - b, classes, level, resamples, seed)


def format_p(p: float) -> str:
    """A p-value as a report writes it: "p < 0.001", "p 0.012" (3 decimals below 0.1), "p 0.43", "p 1.00".

    Raises:
        ValueError: p is NaN or outside [0, 1].
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    if p < 0.001:
        return "p < 0.001"
    if p < 0.1:
        return f"p {p:.3f}"
    return f"p {p:.2f}"


def verdict(diff: float, p_adjusted: float, alpha: float = 0.05) -> str:
    """The report's word for a comparison: "gain" or "loss" (by the sign of diff) when p_adjusted < alpha, else
    "no difference shown"."""
    if p_adjusted < alpha and diff > 0:
        return "gain"
    if p_adjusted < alpha and diff < 0:
        return "loss"
    return "no difference shown"
