"""memvir.retrieval.diagnosis.ranking, memvir.retrieval.diagnosis.failures and memvir.retrieval.diagnosis.per_class
against brute-force references written here: every similarity computed in float64 numpy, each query's whole gallery
sorted with a Python sort by (similarity, index), and its AP@R, first correct rank and missed items read off that order
with loops.

Two kinds of gallery: +-1 vectors in 16 dimensions, whose cosines are exact multiples of 1/8 in float32 and float64
alike (so the many exact ties are ties for the code and the reference), and random Gaussian vectors (no ties)."""

import importlib.util
from collections import Counter

import numpy as np
import pytest
import torch

from memvir.retrieval.diagnosis.failures import hardest_queries, largest_differences
from memvir.retrieval.diagnosis.per_class import confused_class_pairs, per_class_difference, per_class_metrics
from memvir.retrieval.diagnosis.ranking import rank_gallery, rank_queries
from memvir.retrieval.metrics import per_query_metrics, retrieval_metrics

BACKENDS = [pytest.param("faiss", marks=pytest.mark.skipif(importlib.util.find_spec("faiss") is None,
                                                           reason="faiss is not installed")), "torch"]
# Class sizes: one class of a single item (no query, a distractor), one large class whose far members lie beyond
# the neighbours the search fetches (their ranks are counted).
CLASS_SIZES = (1, 3, 5, 8, 12, 30, 4, 6, 2, 9)


def _labels(rng, sizes=CLASS_SIZES):
    labels = np.concatenate([np.full(size, code) for code, size in enumerate(sizes)])
    return rng.permutation(labels)


def tied_gallery(seed=0):
    """+-1 vectors (exact cosines, many ties and exact duplicates), labelled."""
    rng = np.random.default_rng(seed)
    labels = _labels(rng)
    vectors = rng.choice([-1.0, 1.0], size=(len(labels), 16)).astype(np.float32)
    vectors[5] = vectors[6]  # an exact duplicate, whatever their classes
    return vectors, labels


def gaussian_gallery(seed=0):
    rng = np.random.default_rng(seed)
    labels = _labels(rng)
    centres = rng.normal(size=(len(CLASS_SIZES), 24))
    return (centres[labels] + 3.0 * rng.normal(size=(len(labels), 24))).astype(np.float32), labels


# ---------------------------------------------------------------------------------------------------------------
# The reference
# ---------------------------------------------------------------------------------------------------------------
def reference_ranking(gallery, gallery_labels, query, query_label, exclude, k, missed):
    """One query's figures from its whole ranking, sorted by a Python sort: (similarity desc, index asc)."""
    unit = gallery.astype(np.float64) / np.linalg.norm(gallery.astype(np.float64), axis=1, keepdims=True)
    q = query.astype(np.float64) / np.linalg.norm(query.astype(np.float64))
    similarity = unit @ q
    order = sorted((i for i in range(len(gallery)) if i != exclude), key=lambda i: (-similarity[i], i))
    correct = [gallery_labels[i] == query_label for i in order]
    same = sum(correct)
    if same == 0:
        return {"same_class": 0, "first_correct_rank": 0, "average_precision": float("nan"),
                "r_precision": float("nan"), "neighbours": order[:k], "correct": correct[:k], "missed": [],
                "missed_ranks": []}
    found, precision_sum = 0, 0.0
    for rank, is_correct in enumerate(correct[:same], 1):
        if is_correct:
            found += 1
            precision_sum += found / rank
    misses = [(rank, item) for rank, (item, is_correct) in enumerate(zip(order, correct, strict=True), 1)
              if is_correct and rank > k][:missed]
    return {"same_class": same, "first_correct_rank": correct.index(True) + 1,
            "average_precision": precision_sum / same, "r_precision": found / same,
            "neighbours": order[:k], "correct": correct[:k],
            "missed": [item for _, item in misses], "missed_ranks": [rank for rank, _ in misses]}


def assert_matches(row, expected):
    assert row["same_class"] == expected["same_class"]
    assert row["first_correct_rank"] == expected["first_correct_rank"]
    np.testing.assert_allclose(row["average_precision"], expected["average_precision"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(row["r_precision"], expected["r_precision"], rtol=0, atol=1e-12)
    assert row["neighbours"] == expected["neighbours"]
    assert row["correct"] == expected["correct"]
    assert row["missed"] == expected["missed"]
    assert row["missed_ranks"] == expected["missed_ranks"]


# ---------------------------------------------------------------------------------------------------------------
# rank_gallery and rank_queries
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [tied_gallery, gaussian_gallery])
@pytest.mark.parametrize(("k", "missed"), [(1, 3), (8, 4), (20, 30)])
def test_each_gallery_item_ranked_as_brute_force(make, backend, k, missed):
    vectors, labels = make()
    rankings = rank_gallery(vectors, labels, k=k, missed=missed, backend=backend)
    queries = [i for i in range(len(labels)) if (labels == labels[i]).sum() > 1]
    assert rankings.query.tolist() == queries
    far = 0
    for position, item in enumerate(queries):
        expected = reference_ranking(vectors, labels, vectors[item], labels[item], item, k, missed)
        assert_matches(rankings.row(position), expected)
        far += any(rank > rankings.neighbours.shape[1] for rank in expected["missed_ranks"])
    assert far > 0  # some missed items lie beyond the fetched neighbours: the counted ranks are checked too


@pytest.mark.parametrize("make", [tied_gallery, gaussian_gallery])
def test_gallery_rankings_are_the_metrics_query_by_query(make):
    vectors, labels = make(seed=3)
    rankings = rank_gallery(torch.from_numpy(vectors), torch.from_numpy(labels))
    # The torch search settles ties by lower index throughout; faiss may keep another of the items tied at the last
    # place it returns (memvir.retrieval.knn), which the +-1 gallery's exact ties reach.
    per_query = per_query_metrics(vectors, labels, ks=(1,), backend="torch")
    assert np.array_equal(rankings.query, per_query["query"])
    np.testing.assert_allclose(rankings.average_precision, per_query["map@r"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(rankings.r_precision, per_query["r_precision"], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(rankings.first_correct_rank == 1, per_query["recall@1"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_outside_queries_with_and_without_an_excluded_item(backend):
    vectors, labels = tied_gallery(seed=1)
    rng = np.random.default_rng(7)
    queries = np.concatenate([rng.choice([-1.0, 1.0], size=(4, 16)), vectors[[10, 20]]]).astype(np.float32)
    query_labels = np.array([labels[0], labels[40], 99, labels[3], labels[10], labels[20]])  # 99: no such class
    exclude = np.array([-1, -1, -1, -1, 10, -1])
    rankings = rank_queries(queries, vectors, labels, query_labels, k=6, missed=5, exclude=exclude, backend=backend)
    for position in range(len(queries)):
        expected = reference_ranking(vectors, labels, queries[position], query_labels[position], exclude[position],
                                     6, 5)
        assert_matches(rankings.row(position), expected)
    assert rankings.same_class[2] == 0 and np.isnan(rankings.average_precision[2])
    alone = rank_queries(queries[4:5], vectors, labels, query_labels[4:5], k=6, missed=5, exclude=[10])
    assert_matches(alone.row(0), reference_ranking(vectors, labels, queries[4], query_labels[4], 10, 6, 5))


def test_string_labels_rank_as_their_codes():
    vectors, labels = gaussian_gallery(seed=5)
    names = np.array([f"class {label}" for label in labels])
    as_codes, as_names = rank_gallery(vectors, labels), rank_gallery(vectors, names)
    np.testing.assert_array_equal(as_codes.average_precision, as_names.average_precision)
    assert as_names.label.tolist() == names[as_names.query].tolist()


@pytest.mark.parametrize(("call", "message"), [
    (lambda v, y: rank_gallery(v, y, k=0), "k=0 is out of range"),
    (lambda v, y: rank_gallery(v, y, missed=-1), "missed must be a whole number"),
    (lambda v, y: rank_gallery(v, y[:-1]), "labels must be 1-D with one label per row"),
    (lambda v, y: rank_gallery(v, np.arange(len(y))), "no class has at least two members"),
    (lambda v, y: rank_queries(v[:2, :3], v, y, y[:2]), "queries have 3 dimensions but the gallery has 16"),
    (lambda v, y: rank_queries(v[:2], v, y, y[:2], exclude=[0]), "one gallery index"),
    (lambda v, y: rank_queries(v[:2], v, y, y[:2], exclude=[0, len(y)]), "outside the gallery"),
])
def test_bad_arguments_say_what_is_wrong(call, message):
    vectors, labels = tied_gallery()
    with pytest.raises(ValueError, match=message):
        call(vectors, labels)


# ---------------------------------------------------------------------------------------------------------------
# failures
# ---------------------------------------------------------------------------------------------------------------
def _reference_rows(vectors, labels):
    queries = [i for i in range(len(labels)) if (labels == labels[i]).sum() > 1]
    return queries, [reference_ranking(vectors, labels, vectors[i], labels[i], i, 8, 4) for i in queries]


@pytest.mark.parametrize("make", [tied_gallery, gaussian_gallery])
def test_hardest_queries_are_the_worst_by_either_order(make):
    vectors, labels = make(seed=2)
    rankings = rank_gallery(vectors, labels)
    queries, rows = _reference_rows(vectors, labels)
    by_ap = sorted(range(len(queries)), key=lambda p: (rows[p]["average_precision"], -rows[p]["first_correct_rank"],
                                                       queries[p]))
    by_rank = sorted(range(len(queries)), key=lambda p: (-rows[p]["first_correct_rank"],
                                                         rows[p]["average_precision"], queries[p]))
    assert hardest_queries(rankings, "map@r", 7).tolist() == by_ap[:7]
    assert hardest_queries(rankings, "first_correct_rank", 7).tolist() == by_rank[:7]


def test_largest_differences_both_ways():
    vectors, labels = gaussian_gallery(seed=4)
    other = vectors + 0.8 * np.random.default_rng(9).normal(size=vectors.shape).astype(np.float32)
    queries, first_rows = _reference_rows(vectors, labels)
    _, second_rows = _reference_rows(other, labels)
    difference = [a["average_precision"] - b["average_precision"] for a, b in zip(first_rows, second_rows,
                                                                                   strict=True)]
    first_better = sorted((p for p in range(len(queries)) if difference[p] > 0),
                          key=lambda p: (-difference[p], queries[p]))
    second_better = sorted((p for p in range(len(queries)) if difference[p] < 0),
                           key=lambda p: (difference[p], queries[p]))
    better_first, better_second = largest_differences(rank_gallery(vectors, labels), rank_gallery(other, labels), 5)
    assert better_first.tolist() == first_better[:5] and better_second.tolist() == second_better[:5]
    shuffled = np.roll(labels, 1)
    with pytest.raises(ValueError, match="not of the same gallery items"):
        largest_differences(rank_gallery(vectors, labels), rank_gallery(vectors, shuffled))
    with pytest.raises(ValueError, match="must be one of"):
        hardest_queries(rank_gallery(vectors, labels), by="recall")


# ---------------------------------------------------------------------------------------------------------------
# per_class
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [tied_gallery, gaussian_gallery])
def test_per_class_table_against_grouped_reference_and_the_metrics(make):
    vectors, labels = make(seed=6)
    table = per_class_metrics(rank_gallery(vectors, labels))
    queries, rows = _reference_rows(vectors, labels)
    grouped = {}
    for item, row in zip(queries, rows, strict=True):
        grouped.setdefault(labels[item], []).append(row)
    assert table.classes.tolist() == sorted(grouped)
    for position, label in enumerate(table.classes):
        members = grouped[label]
        assert table.queries[position] == len(members)
        np.testing.assert_allclose(table.values["recall@1"][position],
                                   np.mean([row["first_correct_rank"] == 1 for row in members]), atol=1e-12)
        np.testing.assert_allclose(table.values["r_precision"][position],
                                   np.mean([row["r_precision"] for row in members]), atol=1e-12)
        np.testing.assert_allclose(table.values["map@r"][position],
                                   np.mean([row["average_precision"] for row in members]), atol=1e-12)
    overall = retrieval_metrics(vectors, labels, ks=(1,), backend="torch")  # ties by index, as above
    for name, value in table.overall().items():
        assert value == pytest.approx(overall[name], abs=1e-12)


def test_per_class_difference_is_second_minus_first():
    vectors, labels = gaussian_gallery(seed=8)
    first = per_class_metrics(rank_gallery(vectors, labels))
    second = per_class_metrics(rank_gallery(vectors + 0.5, labels))
    difference = per_class_difference(first, second)
    for name in ("recall@1", "r_precision", "map@r"):
        np.testing.assert_allclose(difference[name], second.values[name] - first.values[name])
    with pytest.raises(ValueError, match="not of the same classes"):
        per_class_difference(first, per_class_metrics(rank_gallery(vectors, labels % 3)))


@pytest.mark.parametrize("make", [tied_gallery, gaussian_gallery])
def test_confused_pairs_count_other_class_items_within_r(make):
    vectors, labels = make(seed=11)
    queries, rows = _reference_rows(vectors, labels)
    counts, places = Counter(), Counter()
    for item, row in zip(queries, rows, strict=True):
        full = reference_ranking(vectors, labels, vectors[item], labels[item], item, row["same_class"], 0)
        places[labels[item]] += row["same_class"]
        for neighbour in full["neighbours"]:
            if labels[neighbour] != labels[item]:
                counts[tuple(sorted((labels[item], labels[neighbour])))] += 1
    expected = sorted(counts, key=lambda pair: (-counts[pair], -counts[pair] / (places[pair[0]] + places[pair[1]]),
                                                pair))[:6]
    pairs = confused_class_pairs(rank_gallery(vectors, labels), labels, count=6)
    assert [(pair.first, pair.second) for pair in pairs] == expected
    for pair in pairs:
        key = (pair.first, pair.second)
        assert pair.count == counts[key]
        assert pair.rate == pytest.approx(counts[key] / (places[key[0]] + places[key[1]]))
