"""The query/gallery protocol of memvir.retrieval.metrics (`gallery=`, `gallery_labels=`), and both protocols against
pytorch-metric-learning's AccuracyCalculator on the same embeddings: leave-one-out as `ref_includes_query=True` with
query = reference, query/gallery as separate sets."""

import importlib.util
import math

import numpy as np
import pytest
import torch

import memvir.retrieval.metrics
from memvir.retrieval.metrics import per_query_metrics, retrieval_metrics

needs_faiss = pytest.mark.skipif(importlib.util.find_spec("faiss") is None, reason="faiss is not installed")
BACKENDS = [pytest.param("faiss", marks=needs_faiss), "torch"]
KS = (1, 2, 4, 8)


def split_data(seed=0, dim=8, spread=0.9):
    """Random class clusters split into queries and a gallery. Class by class (query items, gallery items): most have
    both, some a single gallery item or a single query; classes 5, 6 and 9 have no gallery item (their queries are
    left out), classes 10 to 12 no query (distractors); classes 9 and 10 have one item in all, which leave-one-out
    leaves out as queries."""
    split = [(4, 5), (3, 6), (5, 1), (2, 3), (1, 7), (3, 0), (2, 0), (6, 4), (2, 2), (1, 0), (0, 1), (0, 4), (0, 9)]
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(split), dim))
    query_labels = np.repeat(np.arange(len(split)), [q for q, _ in split])
    gallery_labels = np.repeat(np.arange(len(split)), [g for _, g in split])
    queries = centres[query_labels] + spread * rng.normal(size=(len(query_labels), dim))
    gallery = centres[gallery_labels] + spread * rng.normal(size=(len(gallery_labels), dim))
    query_order, gallery_order = rng.permutation(len(query_labels)), rng.permutation(len(gallery_labels))
    return (queries[query_order].astype(np.float32), query_labels[query_order],
            gallery[gallery_order].astype(np.float32), gallery_labels[gallery_order])


def reference_gallery_metrics(queries, query_labels, gallery, gallery_labels, ks):
    """MLRC definitions with R = gallery items of the query's class, one query at a time in float64; queries without
    one are left out."""
    unit = lambda x: np.asarray(x, np.float64) / np.linalg.norm(np.asarray(x, np.float64), axis=1, keepdims=True)  # noqa: E731
    similarity = unit(queries) @ unit(gallery).T
    totals = {f"recall@{k}": [] for k in ks} | {"precision@1": [], "r_precision": [], "map@r": []}
    for query, label in enumerate(query_labels):
        r = int(np.sum(gallery_labels == label))
        if r == 0:
            continue
        correct = gallery_labels[np.argsort(-similarity[query], kind="stable")] == label
        for k in ks:
            totals[f"recall@{k}"].append(float(correct[:k].any()))
        totals["precision@1"].append(float(correct[0]))
        totals["r_precision"].append(correct[:r].sum() / r)
        totals["map@r"].append(sum(correct[:i].sum() / i for i in range(1, r + 1) if correct[i - 1]) / r)
    return {name: float(np.mean(values)) for name, values in totals.items()}


# ---------------------------------------------------------------------------------------------------------------
# pytorch-metric-learning's AccuracyCalculator
# ---------------------------------------------------------------------------------------------------------------


def pml_metrics(query, query_labels, reference, reference_labels, ref_includes_query, ks):
    """Our metric names from AccuracyCalculator. Its own metrics with k="max_bin_count" (what MAP@R and R-Precision
    need: R neighbours for the largest R); it has no Recall@K, so a subclass adds it as its docs show, a
    `calculate_` method over the same neighbour labels and the same queries (its lone queries left out), searched
    with k = max(ks)."""
    accuracy_calculator = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.utils.inference import CustomKNN

    class WithRecall(accuracy_calculator.AccuracyCalculator):
        def requires_knn(self):
            return [*super().requires_knn(), "recall_at_k"]

        def calculate_recall_at_k(self, knn_labels, query_labels, not_lone_query_mask, **kwargs):
            knn_labels, query_labels = knn_labels[not_lone_query_mask], query_labels[not_lone_query_mask]
            correct = knn_labels == query_labels[:, None]
            return {k: correct[:, :k].any(dim=1).double().mean().item() for k in ks}

    # Cosine similarity, as ours (CosineSimilarity normalises the embeddings itself; PML's default faiss search is
    # L2, which ranks alike only on vectors already normalised).
    cosine = CustomKNN(CosineSimilarity())
    cpu = torch.device("cpu")
    own = accuracy_calculator.AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"), k="max_bin_count", device=cpu,
        knn_func=cosine)
    recall = WithRecall(include=("recall_at_k",), k=max(ks), device=cpu, knn_func=cosine)
    args = (query, query_labels, reference, reference_labels, ref_includes_query)
    found = own.get_accuracy(*args) | recall.get_accuracy(*args)
    return {**{f"recall@{k}": found["recall_at_k"][k] for k in ks}, "precision@1": found["precision_at_1"],
            "r_precision": found["r_precision"], "map@r": found["mean_average_precision_at_r"]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_protocols_match_pytorch_metric_learning(backend, seed):
    queries, query_labels, gallery, gallery_labels = split_data(seed)
    everything = np.concatenate([queries, gallery])
    all_labels = np.concatenate([query_labels, gallery_labels])

    leave_one_out = retrieval_metrics(everything, all_labels, KS, backend=backend)
    expected = pml_metrics(everything, all_labels, everything, all_labels, True, KS)
    assert leave_one_out.keys() == expected.keys()
    for name, value in expected.items():
        assert leave_one_out[name] == pytest.approx(value, abs=1e-6), f"leave-one-out {name}"

    query_gallery = retrieval_metrics(queries, query_labels, KS, gallery=gallery, gallery_labels=gallery_labels,
                                      backend=backend)
    expected = pml_metrics(queries, query_labels, gallery, gallery_labels, False, KS)
    assert query_gallery.keys() == expected.keys()
    for name, value in expected.items():
        assert query_gallery[name] == pytest.approx(value, abs=1e-6), f"query/gallery {name}"
    assert 0 < query_gallery["map@r"] < query_gallery["recall@1"] < 1  # the data exercises the metrics mid-range
    assert query_gallery != leave_one_out


# ---------------------------------------------------------------------------------------------------------------
# The query/gallery protocol
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_query_gallery_matches_brute_force(backend, seed):
    queries, query_labels, gallery, gallery_labels = split_data(seed)
    expected = reference_gallery_metrics(queries, query_labels, gallery, gallery_labels, (1, 3, 16))
    actual = retrieval_metrics(torch.from_numpy(queries), query_labels, ks=(1, 3, 16), gallery=gallery,
                               gallery_labels=torch.from_numpy(gallery_labels), backend=backend)
    assert actual.keys() == expected.keys()
    for name, value in actual.items():
        assert isinstance(value, float) and value == pytest.approx(expected[name], abs=1e-12), name


def unit_vectors_at_degrees(*angles):
    return np.array([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in angles])


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_computed_queries_and_gallery_on_an_arc(backend):
    # Gallery at 0, 20, 40, 90 degrees labelled a, b, a, c; queries at 15 (a), 85 (c), 45 (z, no gallery item).
    # Query 15: ranks 20 b, 0 a, 40 a; R = 2. Query 85: ranks 90 c; R = 1. Query z is left out.
    gallery = unit_vectors_at_degrees(0, 20, 40, 90)
    queries = unit_vectors_at_degrees(15, 85, 45)
    per_query = per_query_metrics(queries, ["a", "c", "z"], ks=(1, 2), gallery=gallery,
                                  gallery_labels=["a", "b", "a", "c"], backend=backend)
    assert per_query["query"].tolist() == [0, 1] and per_query["label"].tolist() == ["a", "c"]
    assert per_query["recall@1"].tolist() == [False, True]
    assert per_query["recall@2"].tolist() == [True, True]
    assert per_query["r_precision"] == pytest.approx([1 / 2, 1], abs=1e-12)
    assert per_query["map@r"] == pytest.approx([(1 / 2) / 2, 1], abs=1e-12)
    metrics = retrieval_metrics(queries, ["a", "c", "z"], ks=(1, 2), gallery=gallery,
                                gallery_labels=["a", "b", "a", "c"], backend=backend)
    assert metrics == pytest.approx({"recall@1": 0.5, "recall@2": 1.0, "precision@1": 0.5, "r_precision": 0.75,
                                     "map@r": 0.625}, abs=1e-12)


def test_a_query_in_the_gallery_finds_itself():
    # Nothing is excluded in the query/gallery protocol: the query's own copy in the gallery is its neighbour.
    vectors = unit_vectors_at_degrees(0, 50, 100)
    metrics = retrieval_metrics(vectors[:1], [0], ks=(1,), gallery=vectors, gallery_labels=[0, 1, 0])
    # Ranking 0 (itself), 50 (other class), 100; R = 2, so only the first correct place is within R.
    assert metrics["recall@1"] == 1.0 and metrics["r_precision"] == 0.5 and metrics["map@r"] == 0.5


@pytest.mark.parametrize("seed", [0, 1])
def test_per_query_metrics_average_to_retrieval_metrics_and_leave_out_queries_without_gallery_items(seed):
    queries, query_labels, gallery, gallery_labels = split_data(seed)
    per_query = per_query_metrics(queries, query_labels, ks=(1, 4), gallery=gallery, gallery_labels=gallery_labels)
    assert per_query["query"].tolist() == np.flatnonzero(np.isin(query_labels, gallery_labels)).tolist()
    assert np.array_equal(per_query["label"], query_labels[per_query["query"]])
    metrics = retrieval_metrics(queries, query_labels, ks=(1, 4), gallery=gallery, gallery_labels=gallery_labels)
    for name, value in metrics.items():
        assert float(per_query[name].mean()) == pytest.approx(value, abs=1e-12), name


def test_nmi_clusters_the_kept_queries(monkeypatch):
    queries, query_labels, gallery, gallery_labels = split_data(0)
    clustered = []

    def kmeans(points, num_clusters, seed):
        clustered.append((points.shape[0], num_clusters))
        return np.zeros(points.shape[0], dtype=np.int64)

    monkeypatch.setattr(memvir.retrieval.metrics, "_kmeans", kmeans)
    metrics = retrieval_metrics(queries, query_labels, ks=(1,), nmi=True, gallery=gallery,
                                gallery_labels=gallery_labels)
    kept = np.isin(query_labels, gallery_labels)
    assert clustered == [(int(kept.sum()), len(np.unique(query_labels[kept])))]
    assert metrics["nmi"] == 0.0  # one cluster for several classes


def test_query_gallery_errors():
    rng = np.random.default_rng(0)
    queries, gallery = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    gallery_labels = [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="gallery was given without gallery_labels; pass both"):
        retrieval_metrics(queries, [0, 1, 2], gallery=gallery)
    with pytest.raises(ValueError, match="gallery_labels was given without gallery; pass both"):
        per_query_metrics(queries, [0, 1, 2], gallery_labels=gallery_labels)
    with pytest.raises(ValueError, match="queries have 3 dimensions but the gallery has 4"):
        retrieval_metrics(queries[:, :3], [0, 1, 2], gallery=gallery, gallery_labels=gallery_labels)
    with pytest.raises(ValueError, match="gallery have 5 rows but gallery_labels have 4; pass one label per row"):
        retrieval_metrics(queries, [0, 1, 2], gallery=gallery, gallery_labels=gallery_labels[:4])
    with pytest.raises(ValueError, match="embeddings have 3 rows but labels have 2"):
        retrieval_metrics(queries, [0, 1], gallery=gallery, gallery_labels=gallery_labels)
    with pytest.raises(ValueError, match="none of the 3 queries has a class among the 5 gallery items' classes"):
        retrieval_metrics(queries, [7, 8, 9], gallery=gallery, gallery_labels=gallery_labels)
    with pytest.raises(ValueError, match="K=6 is out of range: it must be >= 1 and the largest valid value is 5"):
        retrieval_metrics(queries, [0, 1, 2], ks=(1, 6), gallery=gallery, gallery_labels=gallery_labels)
    with pytest.raises(ValueError, match="labels are int64 but gallery_labels are <U1"):
        retrieval_metrics(queries, [0, 1, 2], gallery=gallery, gallery_labels=list("00112"))
    with pytest.raises(ValueError, match="NaN or inf in 1 of 5 rows of gallery"):
        retrieval_metrics(queries, [0, 1, 2], gallery=np.where(np.arange(5)[:, None] == 1, np.nan, gallery),
                          gallery_labels=gallery_labels)
    assert "recall@5" in retrieval_metrics(queries, [0, 1, 2], ks=(5,), gallery=gallery, gallery_labels=gallery_labels)
