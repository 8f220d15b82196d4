"""Tests of bench/fair_stats.py against hand-written reference computations."""

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import fair_stats  # noqa: E402
from fair_stats import (  # noqa: E402
    PairedTest,
    class_bootstrap_ci,
    format_p,
    holm,
    paired_bootstrap_ci,
    paired_class_bootstrap_ci,
    paired_t,
    verdict,
    wilcoxon_signed_rank,
)

# ---------------------------------------------------------------------------------------------------------- paired t


def test_paired_t_hand_example():
    # d = a - b = [1, 2, 3, 4, 5]: mean 3; squared deviations 4 + 1 + 0 + 1 + 4 = 10, so var = 10 / 4 = 2.5;
    # se = sqrt(2.5) / sqrt(5) = sqrt(0.5); t = 3 / sqrt(0.5) = 3 * sqrt(2).
    a = [2.0, 4.0, 6.0, 8.0, 10.0]
    b = [1.0, 2.0, 3.0, 4.0, 5.0]
    res = paired_t(a, b)
    assert isinstance(res, PairedTest)
    assert res.n == 5
    assert res.mean_diff == pytest.approx(3.0, abs=1e-12)
    assert res.t == pytest.approx(3.0 * math.sqrt(2.0), rel=1e-12)
    # Two-sided p: twice the upper tail of Student's t with 4 degrees of freedom.
    assert res.p == pytest.approx(2.0 * stats.t.sf(3.0 * math.sqrt(2.0), 4), rel=1e-12)
    ref = stats.ttest_rel(a, b)
    assert res.p == pytest.approx(ref.pvalue, rel=1e-10)
    # Swapping the arms flips the sign and keeps p.
    swapped = paired_t(b, a)
    assert swapped.t == pytest.approx(-res.t, rel=1e-12)
    assert swapped.p == pytest.approx(res.p, rel=1e-12)


def test_paired_t_matches_ttest_rel_on_random_data():
    rng = np.random.default_rng(3)
    for n in (2, 3, 5, 10):
        a = rng.normal(size=n)
        b = a + rng.normal(0.3, 1.0, size=n)
        res = paired_t(a, b)
        ref = stats.ttest_rel(a, b)
        assert res.t == pytest.approx(ref.statistic, rel=1e-10)
        assert res.p == pytest.approx(ref.pvalue, rel=1e-10)
        assert res.mean_diff == pytest.approx(float(np.mean(a - b)), abs=1e-12)


def test_paired_t_zero_spread():
    pos = paired_t([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])
    assert pos.t == math.inf and pos.p == 0.0 and pos.mean_diff == pytest.approx(0.5)
    neg = paired_t([1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
    assert neg.t == -math.inf and neg.p == 0.0 and neg.mean_diff == pytest.approx(-2.0)
    same = paired_t([0.7, 0.8, 0.9], [0.7, 0.8, 0.9])
    assert same.t == 0.0 and same.p == 1.0 and same.mean_diff == 0.0
    for res in (pos, neg, same):
        assert not math.isnan(res.t) and not math.isnan(res.p)


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        ([1.0, 2.0, 3.0], [1.0, 2.0], "same length"),
        ([1.0], [2.0], "at least 2"),
        ([], [], "at least 2"),
        ([1.0, float("nan")], [1.0, 2.0], "NaN"),
        ([1.0, 2.0], [1.0, float("inf")], "NaN or infinite"),
    ],
)
def test_paired_t_errors(a, b, match):
    with pytest.raises(ValueError, match=match):
        paired_t(a, b)


# ---------------------------------------------------------------------------------------------------------- wilcoxon


def _brute_force_wilcoxon_p(d, ranks):
    """Exact two-sided p of the signed-rank test: all 2**n sign patterns of the given ranks are equally likely."""
    observed = sum(r for x, r in zip(d, ranks, strict=True) if x > 0)
    patterns = itertools.product((0, 1), repeat=len(d))
    w_plus = [sum(r for s, r in zip(signs, ranks, strict=True) if s) for signs in patterns]
    total = len(w_plus)
    eps = 1e-9
    low = sum(1 for w in w_plus if w <= observed + eps) / total
    high = sum(1 for w in w_plus if w >= observed - eps) / total
    return min(1.0, 2.0 * min(low, high))


def _ranks_no_ties(d):
    order = sorted(range(len(d)), key=lambda i: abs(d[i]))
    ranks = [0] * len(d)
    for r, i in enumerate(order, start=1):
        ranks[i] = r
    return ranks


@pytest.mark.parametrize(
    "d",
    [
        [0.3, -0.1, 0.5, 0.2, 0.45],  # n = 5
        [1.0, -2.0, 3.0, 4.0, -5.0, 6.0, 7.0],  # n = 7
        [-0.01, 0.02, -0.03, -0.04, 0.05, -0.06, -0.07],  # n = 7, mostly negative
    ],
)
def test_wilcoxon_exact_against_enumeration(d):
    b = np.linspace(0.5, 0.9, len(d))
    a = b + np.asarray(d)
    res = wilcoxon_signed_rank(a, b)
    # Recompute the differences as the function sees them (a - b), so that rounding cannot change the ranking.
    d_seen = list(a - b)
    assert res.p == pytest.approx(_brute_force_wilcoxon_p(d_seen, _ranks_no_ties(d_seen)), abs=1e-12)
    assert res.n == len(d) and res.n_nonzero == len(d)
    ranks = _ranks_no_ties(d_seen)
    w_plus = sum(r for x, r in zip(d_seen, ranks, strict=True) if x > 0)
    w_minus = sum(ranks) - w_plus
    assert res.statistic == pytest.approx(min(w_plus, w_minus))
    assert res.mean_diff == pytest.approx(float(np.mean(d)), abs=1e-12)


def test_wilcoxon_floor_for_five_seeds():
    # All five differences positive: only 1 of 32 sign patterns is as extreme on each side, so p = 2 / 32.
    res = wilcoxon_signed_rank([1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.0, 0.0, 0.0, 0.0])
    assert res.p == pytest.approx(0.0625, abs=1e-12)
    assert res.statistic == 0.0
    assert wilcoxon_signed_rank([0.0] * 5, [1.0, 2.0, 3.0, 4.0, 5.0]).p == pytest.approx(0.0625, abs=1e-12)


def test_wilcoxon_drops_zero_differences():
    # The zero difference is dropped, leaving four positive ones: p = 2 / 16.
    res = wilcoxon_signed_rank([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 1.5, 2.0, 2.5, 3.0])
    assert res.n == 5 and res.n_nonzero == 4
    assert res.p == pytest.approx(0.125, abs=1e-12)
    assert res.mean_diff == pytest.approx(np.mean([0.0, 0.5, 1.0, 1.5, 2.0]))


def test_wilcoxon_all_zero_differences():
    res = wilcoxon_signed_rank([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
    assert res.p == 1.0 and res.n_nonzero == 0 and res.mean_diff == 0.0


def test_wilcoxon_ties_use_midrank_enumeration():
    # |d| = 1, 2, 2, 4, 5: the tied pair shares the mid-rank 2.5.
    d = [1.0, 2.0, -2.0, 4.0, 5.0]
    ranks = [1.0, 2.5, 2.5, 4.0, 5.0]
    res = wilcoxon_signed_rank(d, [0.0] * 5)
    assert res.p == pytest.approx(_brute_force_wilcoxon_p(d, ranks), abs=1e-12)


def test_wilcoxon_errors():
    with pytest.raises(ValueError, match="same length"):
        wilcoxon_signed_rank([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        wilcoxon_signed_rank([1.0, float("nan")], [1.0, 2.0])


# ---------------------------------------------------------------------------------------------- paired bootstrap CI


def test_paired_bootstrap_contains_mean_and_is_deterministic():
    rng = np.random.default_rng(1)
    b = rng.normal(0.6, 0.02, size=5)
    a = b + rng.normal(0.01, 0.005, size=5)
    low, high = paired_bootstrap_ci(a, b)
    mean = float(np.mean(a - b))
    assert low <= mean <= high
    assert low < high
    assert (low, high) == paired_bootstrap_ci(a, b)
    assert (low, high) == paired_bootstrap_ci(a, b, seed=0)
    assert (low, high) != paired_bootstrap_ci(a, b, seed=1)
    # A wider level gives a wider (or equal) interval from the same draws.
    low99, high99 = paired_bootstrap_ci(a, b, level=0.99)
    assert low99 <= low and high <= high99


def test_paired_bootstrap_two_pairs_by_hand():
    # d = [0, 1]: a resample's mean is 0 (prob 1/4), 0.5 (1/2) or 1 (1/4); the 2.5 % and 97.5 % points are 0 and 1.
    assert paired_bootstrap_ci([0.0, 1.0], [0.0, 0.0]) == (0.0, 1.0)
    # At the 40 % level the 30 % and 70 % points both fall in the middle mass at 0.5.
    assert paired_bootstrap_ci([0.0, 1.0], [0.0, 0.0], level=0.4) == (0.5, 0.5)


def test_paired_bootstrap_constant_difference():
    b = [0.61, 0.62, 0.6, 0.63, 0.64]
    a = [x + 0.1 for x in b]
    c = float(np.asarray(a)[0] - np.asarray(b)[0])
    low, high = paired_bootstrap_ci(a, b)
    assert low == pytest.approx(c, abs=1e-12) and high == pytest.approx(c, abs=1e-12)
    assert paired_bootstrap_ci([3.0, 3.0, 3.0], [1.0, 1.0, 1.0]) == (2.0, 2.0)


def test_paired_bootstrap_errors():
    with pytest.raises(ValueError):
        paired_bootstrap_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_bootstrap_ci([1.0, 2.0], [1.0, 2.0], level=1.0)


# -------------------------------------------------------------------------------------------------------------- holm


def test_holm_hand_example():
    # Sorted: 0.005 (4th) x 4 = 0.02; 0.01 (1st) x 3 = 0.03; 0.03 (3rd) x 2 = 0.06; 0.04 (2nd) x 1 = 0.04, raised to
    # the running maximum 0.06. In input order: [0.03, 0.06, 0.06, 0.02].
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)


def test_holm_caps_and_preserves_order():
    # Sorted 0.2 x 3 = 0.6; 0.3 x 2 = 0.6; 0.5 x 1 = 0.5 -> 0.6 (monotone). In order [0.6, 0.6, 0.6].
    assert holm([0.5, 0.2, 0.3]) == pytest.approx([0.6, 0.6, 0.6], abs=1e-15)
    # 0.4 x 3 = 1.2 -> 1; everything after is at least 1 and capped at 1.
    assert holm([0.9, 0.4, 0.6]) == [1.0, 1.0, 1.0]
    # Single p-value: unchanged.
    assert holm([0.037]) == pytest.approx([0.037])
    assert holm([]) == []


def test_holm_monotone_and_not_below_raw():
    rng = np.random.default_rng(5)
    p = rng.uniform(0, 0.2, size=12)
    adjusted = np.asarray(holm(p))
    order = np.argsort(p)
    assert np.all(np.diff(adjusted[order]) >= 0)
    assert np.all(adjusted >= p)
    assert np.all(adjusted <= 1.0)
    # The smallest p is multiplied by the number of tests.
    assert adjusted[order[0]] == pytest.approx(min(1.0, 12 * p[order[0]]))


def test_holm_errors():
    with pytest.raises(ValueError, match="NaN"):
        holm([0.01, float("nan")])
    with pytest.raises(ValueError):
        holm([0.01, 1.5])


# ------------------------------------------------------------------------------------------------ class bootstrap CI


def _synthetic_queries(seed, n_classes=30, min_size=2, max_size=9):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(min_size, max_size + 1, size=n_classes)
    # Labels are not 0..k-1 in order, to exercise the mapping to sorted distinct labels.
    labels = rng.permutation(np.arange(100, 100 + 3 * n_classes, 3))
    class_effect = rng.normal(0.5, 0.15, size=n_classes)
    classes = np.repeat(labels, sizes)
    values = np.repeat(class_effect, sizes) + rng.normal(0, 0.05, size=int(sizes.sum()))
    shuffle = rng.permutation(values.size)
    return values[shuffle], classes[shuffle]


def _slow_class_bootstrap(values, classes, level, resamples, seed, stat=None):
    """Reference: a loop over resamples that gathers each drawn class's queries one by one."""
    distinct = sorted(set(classes.tolist()))
    members = {c: [i for i, x in enumerate(classes.tolist()) if x == c] for c in distinct}
    k = len(distinct)
    draws = np.random.default_rng(seed).integers(0, k, size=(resamples, k))
    out = []
    for row in draws:
        picked = [i for j in row for i in members[distinct[j]]]
        out.append(stat(picked) if stat else sum(values[i] for i in picked) / len(picked))
    tail = (1 - level) / 2
    return tuple(np.quantile(out, [tail, 1 - tail])), out


def test_class_bootstrap_matches_slow_reference():
    values, classes = _synthetic_queries(0)
    (ref_low, ref_high), _ = _slow_class_bootstrap(values, classes, 0.95, 300, seed=7)
    low, high = class_bootstrap_ci(values, classes, resamples=300, seed=7)
    assert low == pytest.approx(ref_low, abs=1e-12)
    assert high == pytest.approx(ref_high, abs=1e-12)
    (ref_low, ref_high), _ = _slow_class_bootstrap(values, classes, 0.8, 300, seed=7)
    assert class_bootstrap_ci(values, classes, level=0.8, resamples=300, seed=7) == (
        pytest.approx(ref_low, abs=1e-12),
        pytest.approx(ref_high, abs=1e-12),
    )


def test_class_bootstrap_chunking_keeps_the_draws(monkeypatch):
    values, classes = _synthetic_queries(2)
    whole = class_bootstrap_ci(values, classes, resamples=101, seed=3)
    # 30 classes and a 70-cell bound: chunks of 2 resamples, so the draws come from many generator calls.
    monkeypatch.setattr(fair_stats, "_MAX_CELLS", 70)
    chunked = class_bootstrap_ci(values, classes, resamples=101, seed=3)
    assert chunked == (pytest.approx(whole[0], abs=1e-12), pytest.approx(whole[1], abs=1e-12))


def test_class_bootstrap_constant_class_means():
    # Every class has mean 0.4 (different sizes, different spreads inside): every resample's mean is 0.4.
    values = np.array([0.3, 0.5, 0.4, 0.4, 0.4, 0.2, 0.6, 0.1, 0.7, 0.4, 0.4])
    classes = np.array([0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 3])
    low, high = class_bootstrap_ci(values, classes)
    assert low == pytest.approx(0.4, abs=1e-12) and high == pytest.approx(0.4, abs=1e-12)


def test_class_bootstrap_centred_on_query_weighted_mean():
    # Unequal class sizes make the query-weighted mean differ from the mean of class means.
    rng = np.random.default_rng(11)
    n_classes = 200
    sizes = rng.integers(1, 20, size=n_classes)
    effect = rng.normal(0.5, 0.1, size=n_classes) + 0.01 * sizes  # big classes are easier
    classes = np.repeat(np.arange(n_classes), sizes)
    values = np.repeat(effect, sizes) + rng.normal(0, 0.05, size=int(sizes.sum()))
    query_mean = float(values.mean())
    class_mean_mean = float(np.mean([values[classes == c].mean() for c in range(n_classes)]))
    assert abs(query_mean - class_mean_mean) > 0.02
    low, high = class_bootstrap_ci(values, classes, resamples=2000, seed=0)
    assert low < query_mean < high
    assert (low + high) / 2 == pytest.approx(query_mean, abs=0.005)
    assert not low < class_mean_mean < high


def test_class_bootstrap_string_labels():
    values, classes = _synthetic_queries(4, n_classes=12)
    names = np.array([f"class_{c}" for c in classes])
    (ref_low, ref_high), _ = _slow_class_bootstrap(values, names, 0.95, 200, seed=1)
    low, high = class_bootstrap_ci(values, names, resamples=200, seed=1)
    assert (low, high) == (pytest.approx(ref_low, abs=1e-12), pytest.approx(ref_high, abs=1e-12))


def test_class_bootstrap_at_the_study_size_contains_the_mean():
    rng = np.random.default_rng(0)
    classes = np.repeat(np.arange(1000), 12)
    values = rng.uniform(size=classes.size)
    low, high = class_bootstrap_ci(values, classes, resamples=2000, seed=0)
    assert low < float(values.mean()) < high


def test_class_bootstrap_errors():
    with pytest.raises(ValueError, match="one label per query"):
        class_bootstrap_ci([0.1, 0.2, 0.3], [0, 1])
    with pytest.raises(ValueError, match="NaN"):
        class_bootstrap_ci([0.1, float("nan")], [0, 1])
    with pytest.raises(ValueError, match="at least one"):
        class_bootstrap_ci([], [])


def test_paired_class_bootstrap_matches_slow_reference():
    values_b, classes = _synthetic_queries(6)
    rng = np.random.default_rng(9)
    values_a = values_b + 0.02 + rng.normal(0, 0.03, size=values_b.size)

    def diff_of_means(picked):
        return sum(values_a[i] for i in picked) / len(picked) - sum(values_b[i] for i in picked) / len(picked)

    (ref_low, ref_high), _ = _slow_class_bootstrap(values_a, classes, 0.95, 300, seed=5, stat=diff_of_means)
    low, high = paired_class_bootstrap_ci(values_a, values_b, classes, resamples=300, seed=5)
    assert low == pytest.approx(ref_low, abs=1e-12)
    assert high == pytest.approx(ref_high, abs=1e-12)
    assert low < float(values_a.mean() - values_b.mean()) < high


def test_paired_class_bootstrap_constant_shift():
    values_b, classes = _synthetic_queries(8)
    low, high = paired_class_bootstrap_ci(values_b - 0.03, values_b, classes)
    assert low == pytest.approx(-0.03, abs=1e-12) and high == pytest.approx(-0.03, abs=1e-12)


def test_paired_class_bootstrap_errors():
    with pytest.raises(ValueError, match="same queries"):
        paired_class_bootstrap_ci([0.1, 0.2], [0.1], [0, 1])


# ---------------------------------------------------------------------------------------------- format_p and verdict


@pytest.mark.parametrize(
    ("p", "text"),
    [
        (0.0, "p < 0.001"),
        (0.0004, "p < 0.001"),
        (0.001, "p 0.001"),
        (0.0123, "p 0.012"),
        (0.049, "p 0.049"),
        (0.0625, "p 0.062"),
        (0.1, "p 0.10"),
        (0.43, "p 0.43"),
        (0.999, "p 1.00"),
        (1.0, "p 1.00"),
    ],
)
def test_format_p(p, text):
    assert format_p(p) == text


def test_format_p_never_zero():
    for p in np.concatenate([np.linspace(0, 1, 1001), [1e-12, 0.00099, 0.0010001, 0.0995]]):
        text = format_p(float(p))
        if text != "p < 0.001":
            assert float(text.removeprefix("p ")) > 0.0, text


def test_format_p_errors():
    for bad in (float("nan"), -0.1, 1.1):
        with pytest.raises(ValueError):
            format_p(bad)


@pytest.mark.parametrize(
    ("diff", "p", "alpha", "word"),
    [
        (0.01, 0.01, 0.05, "gain"),
        (-0.01, 0.01, 0.05, "loss"),
        (0.01, 0.05, 0.05, "no difference shown"),
        (-0.01, 0.2, 0.05, "no difference shown"),
        (0.0, 0.001, 0.05, "no difference shown"),
        (0.01, 0.03, 0.01, "no difference shown"),
        (0.01, 0.03, 0.1, "gain"),
    ],
)
def test_verdict(diff, p, alpha, word):
    assert verdict(diff, p, alpha=alpha) == word
