"""memvir.retrieval.diagnosis.verification against brute-force references written here: every pair (i < j) visited by a
Python loop, its cosine computed in float64 numpy, the histogram counted by numpy's, the threshold found by trying every
distinct other-class cosine from the lowest up, and FMR and FNMR counted pair by pair.

Two kinds of gallery: +-1 vectors in 16 dimensions, whose cosines are exact multiples of 1/8 in float32 and float64
alike (every cosine lies on a bin edge, and ties are everywhere: the threshold's place is always inside a tie), and
random Gaussian vectors (no ties)."""

import numpy as np
import pytest
import torch

from memvir.retrieval.diagnosis import verification
from memvir.retrieval.diagnosis.verification import FINE_BINS, matches, pair_similarities

CLASS_SIZES = (1, 3, 5, 8, 12, 30, 4, 6, 2, 9)


def _labels(rng, sizes=CLASS_SIZES):
    return rng.permutation(np.concatenate([np.full(size, code) for code, size in enumerate(sizes)]))


def tied_gallery(seed=0):
    rng = np.random.default_rng(seed)
    labels = _labels(rng)
    return rng.choice([-1.0, 1.0], size=(len(labels), 16)).astype(np.float32), labels


def gaussian_gallery(seed=0):
    rng = np.random.default_rng(seed)
    labels = _labels(rng)
    centres = rng.normal(size=(len(CLASS_SIZES), 24))
    return (centres[labels] + 2.0 * rng.normal(size=(len(labels), 24))).astype(np.float32), labels


def reference_pairs(vectors, labels):
    """(same-class cosines, other-class cosines), float64, each pair i < j once."""
    unit = vectors.astype(np.float64) / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    same, other = [], []
    for i in range(len(unit)):
        for j in range(i + 1, len(unit)):
            (same if labels[i] == labels[j] else other).append(float(unit[i] @ unit[j]))
    return np.array(same), np.array(other)


def reference_threshold(other, fmr):
    """The lowest float32 threshold t with #(other >= t) / #other <= fmr: just above the lowest other-class cosine
    o for which the pairs strictly above it are few enough."""
    for value in np.unique(other):
        if (other > value).sum() / len(other) <= fmr:
            return float(np.nextafter(np.float32(value), np.float32(np.inf)))
    raise AssertionError("no threshold")


def reference_rates(same, other, threshold):
    return (sum(value >= threshold for value in other) / len(other),
            sum(value < threshold for value in same) / len(same))


GALLERIES = [pytest.param(tied_gallery, id="tied"), pytest.param(gaussian_gallery, id="gaussian")]


@pytest.fixture(params=[None, 7], ids=["one-block", "blocks-of-7-rows"])
def block_rows(request, monkeypatch):
    """Small blocks make the row blocks cut through classes and the diagonal squares of the similarity matrix."""
    if request.param is not None:
        monkeypatch.setattr(verification, "_BLOCK_ELEMENTS", request.param * sum(CLASS_SIZES))
    return request.param


@pytest.mark.parametrize("make", GALLERIES)
def test_histograms_count_every_pair_once_in_its_bin(make, block_rows):
    vectors, labels = make()
    same, other = reference_pairs(vectors, labels)
    pairs = pair_similarities(vectors, labels)
    assert (pairs.same_pairs, pairs.other_pairs) == (len(same), len(other))
    for bins in (64, FINE_BINS):
        edges, same_counts, other_counts = pairs.histogram(bins)
        reference_edges = np.linspace(-1.0, 1.0, bins + 1)
        np.testing.assert_array_equal(edges, reference_edges)
        for counts, values in ((same_counts, same), (other_counts, other)):
            expected = np.histogram(np.clip(values, -1, 1), reference_edges)[0]
            if make is tied_gallery or bins == 64:
                np.testing.assert_array_equal(counts, expected)
            else:
                # float32 cosines differ from float64 ones in the 7th digit: a pair that close to one of the
                # 2048 bins' edges may count on its other side, no other.
                near_edge = (np.abs(values[:, None] - reference_edges[None, :]) < 1e-6).any(axis=1).sum()
                assert np.abs(counts - expected).sum() <= 2 * near_edge
                assert counts.sum() == expected.sum()
    np.testing.assert_allclose(pairs.same_scores, np.sort(same), atol=1e-6)


def test_tied_cosines_sit_on_bin_edges_and_count_in_the_bin_above():
    """+-1 vectors' cosines are multiples of 1/8, each an edge of the 64-bin histogram: each counts in the bin that
    starts at it (1 itself in the last)."""
    vectors, labels = tied_gallery()
    same, other = reference_pairs(vectors, labels)
    assert np.all((same * 8) == np.round(same * 8))
    _, same_counts, other_counts = pair_similarities(vectors, labels).histogram(64)
    for counts, values in ((same_counts, same), (other_counts, other)):
        expected = np.zeros(64, dtype=np.int64)
        for value in values:
            expected[min(63, int(round((value + 1) * 32)))] += 1
        np.testing.assert_array_equal(counts, expected)


@pytest.mark.parametrize("make", GALLERIES)
@pytest.mark.parametrize("fmr", [1e-3, 1e-2, 0.05, 1e-1, 0.29])
def test_threshold_at_fmr_is_the_lowest_that_keeps_the_false_match_rate(make, fmr, block_rows):
    vectors, labels = make()
    same, other = reference_pairs(vectors, labels)
    point = pair_similarities(vectors, labels, max_fmr=0.3).threshold_at_fmr(fmr)
    expected = reference_threshold(other, fmr)
    expected_fmr, expected_fnmr = reference_rates(same, other, expected)
    if make is tied_gallery:
        assert point.threshold == expected  # exact cosines: the same float32 number
    else:
        assert point.threshold == pytest.approx(expected, abs=1e-6)
    assert point.fmr == pytest.approx(expected_fmr, abs=0) and point.fmr <= fmr
    assert point.fnmr == pytest.approx(expected_fnmr, abs=0)
    assert point.false_matches == round(expected_fmr * len(other))
    assert point.false_non_matches == round(expected_fnmr * len(same))


def test_ties_at_the_threshold_all_stay_below_it():
    """With exact ties, the other-class cosine where the allowed count runs out is shared by several pairs: none
    of them matches, so the FMR reached is below the one asked for, and a same-class pair at that cosine is a
    non-match."""
    vectors, labels = tied_gallery()
    same, other = reference_pairs(vectors, labels)
    pairs = pair_similarities(vectors, labels)
    point = pairs.threshold_at_fmr(0.1)
    tied_value = max(value for value in other if value < point.threshold)
    assert sum(value == tied_value for value in other) > 1
    assert point.fmr < 0.1
    assert pairs.at_threshold(tied_value).fmr > 0.1  # one step lower lets the whole tie in
    assert point.false_non_matches == sum(value <= tied_value for value in same)


@pytest.mark.parametrize("make", GALLERIES)
def test_rates_at_any_threshold(make, block_rows):
    vectors, labels = make()
    same, other = reference_pairs(vectors, labels)
    pairs = pair_similarities(vectors, labels, max_fmr=0.2)
    for threshold in [-1.0, -0.3, 0.0, 0.125, 0.25, 0.3141, 0.5, 0.75, 1.0, 1.5]:
        point = pairs.at_threshold(threshold)
        expected_fmr, expected_fnmr = reference_rates(same, other, float(np.float32(threshold)))
        assert point.fnmr == pytest.approx(expected_fnmr, abs=0)
        if threshold >= pairs.top_floor:
            assert point.fmr == pytest.approx(expected_fmr, abs=0)
        else:  # only counted by bin: more false matches than the kept rate allows
            assert point.fmr is None and expected_fmr > 0.2


def test_labels_any_order_and_type_and_tensors():
    vectors, labels = gaussian_gallery(3)
    names = np.array([f"class {label}" for label in labels])
    first = pair_similarities(vectors, labels)
    for embeddings, these in ((torch.from_numpy(vectors * 3.0), torch.from_numpy(labels)), (vectors, names)):
        again = pair_similarities(embeddings, these)
        np.testing.assert_array_equal(again.fine_same, first.fine_same)
        np.testing.assert_array_equal(again.fine_other, first.fine_other)
        assert again.threshold_at_fmr(0.01).threshold == pytest.approx(first.threshold_at_fmr(0.01).threshold,
                                                                      abs=1e-6)


def test_matches_is_the_threshold_s_comparison():
    scores = np.array([0.5, 0.25, 0.25000003, 0.2499999, -1.0], dtype=np.float32)
    assert matches(scores, 0.25).tolist() == [True, True, True, False, False]
    # A threshold set just above a cosine leaves that cosine out.
    just_above = float(np.nextafter(np.float32(0.25), np.float32(1)))
    assert matches(scores, just_above).tolist() == [True, False, True, False, False]


@pytest.mark.parametrize("labels, words", [
    ([0, 1, 2, 3], "no two of the 4 items share a class"),
    ([5, 5, 5, 5], "every item is of one class"),
])
def test_galleries_without_both_kinds_of_pair_are_refused(labels, words):
    with pytest.raises(ValueError, match=words):
        pair_similarities(np.eye(4, dtype=np.float32), labels)


def test_bad_arguments_say_what_is_wrong():
    vectors, labels = gaussian_gallery()
    with pytest.raises(ValueError, match="one label per row"):
        pair_similarities(vectors, labels[:-1])
    with pytest.raises(ValueError, match="max_fmr must be above 0 and below 1"):
        pair_similarities(vectors, labels, max_fmr=1.0)
    pairs = pair_similarities(vectors, labels, max_fmr=0.1)
    with pytest.raises(ValueError, match="at most 0.1"):
        pairs.threshold_at_fmr(0.2)
    with pytest.raises(ValueError, match="above 0"):
        pairs.threshold_at_fmr(0)
    with pytest.raises(ValueError, match="power of two"):
        pairs.histogram(100)
    with pytest.raises(ValueError, match="must be a number"):
        pairs.at_threshold(float("nan"))
    bad = vectors.copy()
    bad[2] = np.nan
    with pytest.raises(ValueError):
        pair_similarities(bad, labels)
