"""memvir.retrieval.metrics and the kNN search under it (memvir.retrieval.knn) against references written here: a
brute-force float64 search with loops over queries, hand-computed small cases, and a hand-computed NMI contingency
example."""

import importlib.util
import logging
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import memvir.retrieval.knn
import memvir.retrieval.metrics
from memvir.retrieval.knn import (
    flat_inner_product_index,
    knn_search,
    l2_normalized,
    search_backend,
    search_unit_gallery,
)
from memvir.retrieval.metrics import normalized_mutual_info, per_query_metrics, retrieval_metrics

FAISS_INSTALLED = importlib.util.find_spec("faiss") is not None
needs_faiss = pytest.mark.skipif(not FAISS_INSTALLED, reason="faiss is not installed")
# NMI and its k-means come from scikit-learn, which machines that only train (a GPU image) may lack.
needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="scikit-learn is not installed")
BACKENDS = [pytest.param("faiss", marks=needs_faiss), "torch"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


# ---------------------------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------------------------


def reference_neighbours(queries, gallery, k, exclude_self=False):
    """Brute force in float64: full similarity matrix, stable argsort (ties by lower index), self dropped by index."""
    queries = np.asarray(queries, dtype=np.float64)
    gallery = np.asarray(gallery, dtype=np.float64)
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    gallery = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    similarity = queries @ gallery.T
    neighbours = []
    for query in range(len(queries)):
        order = np.argsort(-similarity[query], kind="stable")
        if exclude_self:
            order = order[order != query]
        neighbours.append(order[:k])
    return np.array(neighbours)


def reference_metrics(embeddings, labels, ks):
    """MLRC definitions, one query at a time; classes without a second member are not queries."""
    embeddings = np.asarray(embeddings, dtype=np.float64)
    labels = list(labels)
    n = len(labels)
    neighbours = reference_neighbours(embeddings, embeddings, n - 1, exclude_self=True)
    recall = {k: [] for k in ks}
    precision_at_1, r_precision, map_at_r = [], [], []
    for query in range(n):
        r = sum(1 for other in range(n) if other != query and labels[other] == labels[query])
        if r == 0:
            continue
        correct = [labels[j] == labels[query] for j in neighbours[query]]
        for k in ks:
            recall[k].append(1.0 if any(correct[:k]) else 0.0)
        precision_at_1.append(1.0 if correct[0] else 0.0)
        r_precision.append(sum(correct[:r]) / r)
        precision_sum = 0.0
        for i in range(1, r + 1):
            if correct[i - 1]:
                precision_sum += sum(correct[:i]) / i
        map_at_r.append(precision_sum / r)
    expected = {f"recall@{k}": float(np.mean(recall[k])) for k in ks}
    expected["precision@1"] = float(np.mean(precision_at_1))
    expected["r_precision"] = float(np.mean(r_precision))
    expected["map@r"] = float(np.mean(map_at_r))
    return expected


def reference_nmi(labels_true, labels_pred):
    """NMI from the contingency table, one pair of labels at a time: MI / ((H(true) + H(pred)) / 2)."""
    n = len(labels_true)
    pairs, true_sizes, pred_sizes = {}, {}, {}
    for true, pred in zip(labels_true, labels_pred, strict=True):
        pairs[true, pred] = pairs.get((true, pred), 0) + 1
        true_sizes[true] = true_sizes.get(true, 0) + 1
        pred_sizes[pred] = pred_sizes.get(pred, 0) + 1
    mutual_info = sum(c / n * math.log(n * c / (true_sizes[t] * pred_sizes[p])) for (t, p), c in pairs.items())
    entropy_true = -sum(c / n * math.log(c / n) for c in true_sizes.values())
    entropy_pred = -sum(c / n * math.log(c / n) for c in pred_sizes.values())
    return mutual_info / ((entropy_true + entropy_pred) / 2)


def clustered_data(seed=0, class_sizes=(6, 5, 4, 3, 2, 7, 1, 1, 1), dim=12, spread=0.8, duplicates=5):
    """Noisy class clusters (so the metrics land mid-range), singleton classes, and exact duplicate rows."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(class_sizes), dim))
    labels = np.repeat(np.arange(len(class_sizes)), class_sizes)
    embeddings = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    copied = rng.choice(len(labels), size=duplicates, replace=False)
    embeddings = np.concatenate([embeddings, embeddings[copied]])
    labels = np.concatenate([labels, labels[copied]])
    order = rng.permutation(len(labels))  # duplicates land at arbitrary positions, not after their originals
    return embeddings[order].astype(np.float32), labels[order]


def assert_metrics_equal(actual, expected):
    assert set(actual) == set(expected)
    for key, value in actual.items():
        assert isinstance(value, float), key
        assert 0.0 <= value <= 1.0, key
        assert value == pytest.approx(expected[key], abs=1e-12), key


# ---------------------------------------------------------------------------------------------------------------
# retrieval_metrics
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_brute_force_with_singletons_and_duplicates(backend, seed):
    embeddings, labels = clustered_data(seed)
    ks = (1, 2, 4, 8, 16)
    expected = reference_metrics(embeddings, labels, ks)
    assert 0.0 < expected["map@r"] < expected["recall@1"] < 1.0  # the data exercises the metrics mid-range
    assert_metrics_equal(retrieval_metrics(embeddings, labels, ks, backend=backend), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_metrics_with_large_classes_match_brute_force(backend):
    """R up to 39 makes the search fetch more neighbours than max(ks); MAP@R then averages over many ranks."""
    embeddings, labels = clustered_data(3, class_sizes=(40, 25, 12, 3, 1), dim=6, spread=1.5, duplicates=3)
    expected = reference_metrics(embeddings, labels, (1, 4))
    assert_metrics_equal(retrieval_metrics(embeddings, labels, ks=(1, 4), backend=backend), expected)


def unit_vectors_at_degrees(*angles):
    return np.array([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in angles])


@pytest.mark.parametrize("backend", BACKENDS)
def test_five_points_on_an_arc_hand_computed(backend):
    # Angles 0, 10, 30, 65, 110 degrees; cosine ranks by angle gap. Labels 0,1,0,0,1: class 0 has R=2, class 1 R=1.
    # Neighbour orders (gap in degrees):      correct marks       R@1 R@2 R@4  RP    AP@R
    #   p0 (0): 1(10) 2(30) 3(65) 4(110)      x v v x               0   1   1   1/2  (1/2)(1/2) = 1/4
    #   p1 (1): 0(10) 2(20) 3(55) 4(100)      x x x v               0   0   1   0    0
    #   p2 (0): 1(20) 0(30) 3(35) 4(80)       x v v x               0   1   1   1/2  1/4
    #   p3 (0): 2(35) 4(45) 1(55) 0(65)       v x x v               1   1   1   1/2  (1/2)(1/1) = 1/2
    #   p4 (1): 3(45) 2(80) 1(100) 0(110)     x x v x               0   0   1   0    0
    embeddings = unit_vectors_at_degrees(0, 10, 30, 65, 110)
    metrics = retrieval_metrics(embeddings, [0, 1, 0, 0, 1], ks=(1, 2, 4), backend=backend)
    assert metrics == pytest.approx(
        {
            "recall@1": 1 / 5,
            "recall@2": 3 / 5,
            "recall@4": 1.0,
            "precision@1": 1 / 5,
            "r_precision": 3 / 10,
            "map@r": 1 / 5,
        },
        abs=1e-12,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_singleton_is_a_distractor_but_not_a_query(backend):
    # As above plus p5 at 75 degrees with its own class (label 2): never a query, but it is close to everyone.
    #   p0: 1 2 3 5 4      x v v x x   R@1 0  R@2 1  R@4 1  RP 1/2  AP 1/4
    #   p1: 0 2 3 5 4      x x x x v         0      0      0      0       0
    #   p2: 1 0 3 5 4      x v v x x         0      1      1      1/2     1/4
    #   p3: 5 2 4 1 0      x v x x v         0      1      1      1/2     1/4
    #   p4: 5 3 2 1 0      x x x v x         0      0      1      0       0
    embeddings = unit_vectors_at_degrees(0, 10, 30, 65, 110, 75)
    metrics = retrieval_metrics(embeddings, [0, 1, 0, 0, 1, 2], ks=(1, 2, 4), backend=backend)
    assert metrics == pytest.approx(
        {
            "recall@1": 0.0,
            "recall@2": 3 / 5,
            "recall@4": 4 / 5,
            "precision@1": 0.0,
            "r_precision": 3 / 10,
            "map@r": 3 / 20,
        },
        abs=1e-12,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_duplicate_of_the_query_is_its_nearest_neighbour(backend):
    # p0 and p1 are the same point of class 0; p2 (class 0) is far; p3, p4 (class 1) sit between.
    # Self is excluded by index, so p0 finds p1 (and p1 finds p0) at similarity 1: both score R@1 = 1.
    embeddings = unit_vectors_at_degrees(0, 0, 170, 40, 50)
    metrics = retrieval_metrics(embeddings, [0, 0, 0, 1, 1], ks=(1,), backend=backend)
    # Queries: p0 -> p1 v, p1 -> p0 v, p2 -> p4 x, p3 -> p4 v, p4 -> p3 v.  R@1 = 4/5.
    # R-Precision: p0 (R=2): p1 v, p3 x -> 1/2; p1 same 1/2; p2 (R=2): p4 x, p3 x -> 0; p3, p4 (R=1): 1.
    # MAP@R: p0: (1/2)(1) = 1/2; p1: 1/2; p2: 0; p3: 1; p4: 1.
    assert metrics == pytest.approx(
        {"recall@1": 4 / 5, "precision@1": 4 / 5, "r_precision": 3 / 5, "map@r": 3 / 5}, abs=1e-12
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_and_torch_inputs_agree(backend):
    embeddings, labels = clustered_data(4)
    from_numpy = retrieval_metrics(embeddings, labels, backend=backend)
    from_torch = retrieval_metrics(torch.from_numpy(embeddings), torch.from_numpy(labels), backend=backend)
    assert from_numpy == from_torch


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_inputs_are_measured_as_their_float32_values(backend):
    embeddings, labels = clustered_data(5)
    for low_precision in (torch.float16, torch.bfloat16):
        rounded = torch.from_numpy(embeddings).to(low_precision)
        expected = reference_metrics(rounded.float().numpy(), labels, (1, 2, 4, 8))
        assert_metrics_equal(retrieval_metrics(rounded, labels, backend=backend), expected)
    numpy_half = embeddings.astype(np.float16)
    expected = reference_metrics(numpy_half.astype(np.float32), labels, (1, 2, 4, 8))
    assert_metrics_equal(retrieval_metrics(numpy_half, labels, backend=backend), expected)


@pytest.mark.parametrize("chunk_size", [1, 7, 13, 1000])
def test_torch_chunking_does_not_change_the_metrics(chunk_size):
    embeddings, labels = clustered_data(6)  # 34 rows: 7 and 13 do not divide it
    expected = reference_metrics(embeddings, labels, (1, 2, 4, 8))
    actual = retrieval_metrics(embeddings, labels, backend="torch", chunk_size=chunk_size)
    assert_metrics_equal(actual, expected)


def test_metric_sums_over_several_row_blocks_match_brute_force(monkeypatch):
    import memvir.retrieval.metrics

    monkeypatch.setattr(memvir.retrieval.metrics, "_METRIC_BLOCK_ELEMENTS", 50)  # blocks of a few queries each
    embeddings, labels = clustered_data(12)
    expected = reference_metrics(embeddings, labels, (1, 2, 4, 8))
    assert_metrics_equal(retrieval_metrics(embeddings, labels, backend="torch"), expected)


@needs_faiss
def test_faiss_and_torch_backends_agree_on_a_larger_set():
    embeddings, labels = clustered_data(7, class_sizes=(30,) * 10 + (1,) * 5, dim=32, spread=1.2, duplicates=20)
    faiss_metrics = retrieval_metrics(embeddings, labels, ks=(1, 2, 4, 8, 32), backend="faiss")
    torch_metrics = retrieval_metrics(embeddings, labels, ks=(1, 2, 4, 8, 32), backend="torch", chunk_size=33)
    assert faiss_metrics == pytest.approx(torch_metrics, abs=1e-12)


def test_string_labels_int_ks_and_repeated_ks():
    embeddings, labels = clustered_data(8)
    names = np.array([f"class-{label}" for label in labels])
    expected = reference_metrics(embeddings, labels, (2,))
    assert_metrics_equal(retrieval_metrics(embeddings, names, ks=2), expected)
    assert list(retrieval_metrics(embeddings, labels, ks=(4, 1, 4))) == [
        "recall@4",
        "recall@1",
        "precision@1",
        "r_precision",
        "map@r",
    ]


def test_faiss_missing_falls_back_to_torch_with_the_same_numbers(monkeypatch):
    embeddings, labels = clustered_data(9)
    expected = reference_metrics(embeddings, labels, (1, 2, 4, 8))
    monkeypatch.setitem(sys.modules, "faiss", None)  # makes `import faiss` raise ImportError
    assert search_backend("auto") == "torch"
    assert_metrics_equal(retrieval_metrics(embeddings, labels), expected)
    with pytest.raises(ImportError, match=r"backend='faiss' needs the faiss-cpu package.*backend='torch'"):
        retrieval_metrics(embeddings, labels, backend="faiss")


@pytest.mark.parametrize("device", DEVICES)
def test_search_backend_choice(device, monkeypatch):
    # "auto" on the CPU is measured (tests below); here the measurement says faiss, as it does where faiss is faster.
    monkeypatch.setattr(memvir.retrieval.knn, "_measured_cpu_backend", "faiss")
    assert search_backend("torch", device) == "torch"
    if device == "cuda":
        assert search_backend("auto", device) == "torch"  # GPU vectors are searched where they are
    else:
        assert search_backend("auto", device) == ("faiss" if FAISS_INSTALLED else "torch")


class FakeProbe:
    """Stands in for the timed probe searches: returns fixed (faiss, torch) seconds and counts its calls."""

    def __init__(self, faiss_seconds, torch_seconds, pause=0.0):
        self.seconds = (faiss_seconds, torch_seconds)
        self.pause = pause
        self.calls = 0

    def __call__(self):
        self.calls += 1
        time.sleep(self.pause)  # widens the window in which threads could race to measure twice
        return self.seconds


@pytest.fixture
def unmeasured(monkeypatch):
    """A process that has not yet measured its backends; returns a function installing a fake probe."""
    monkeypatch.setattr(memvir.retrieval.knn, "_measured_cpu_backend", None)

    def install(faiss_seconds, torch_seconds, pause=0.0):
        probe = FakeProbe(faiss_seconds, torch_seconds, pause)
        monkeypatch.setattr(memvir.retrieval.knn, "_time_probe_searches", probe)
        return probe

    return install


def record_searches(monkeypatch):
    """Wraps the two search backends so a test sees which ran; returns the list of their names, in call order."""
    used = []
    for name in ("_faiss_search", "_torch_search"):
        search = getattr(memvir.retrieval.knn, name)

        def recorded(*args, _name=name, _search=search):
            used.append(_name)
            return _search(*args)

        monkeypatch.setattr(memvir.retrieval.knn, name, recorded)
    return used


@needs_faiss
@pytest.mark.parametrize(("faiss_seconds", "torch_seconds", "faster"), [(0.2, 0.05, "torch"), (0.05, 0.2, "faiss")])
def test_auto_uses_the_backend_that_searched_faster_and_measures_once(
    unmeasured, monkeypatch, caplog, faiss_seconds, torch_seconds, faster
):
    probe = unmeasured(faiss_seconds, torch_seconds)
    used = record_searches(monkeypatch)
    embeddings, labels = clustered_data(14)
    expected = reference_metrics(embeddings, labels, (1, 2, 4, 8))
    with caplog.at_level(logging.INFO, logger="memvir.retrieval.knn"):
        for _ in range(3):
            assert search_backend("auto") == faster
            assert_metrics_equal(retrieval_metrics(embeddings, labels), expected)
    assert probe.calls == 1  # measured once, then remembered
    assert set(used) == {f"_{faster}_search"}
    records = [record.getMessage() for record in caplog.records if record.name == "memvir.retrieval.knn"]
    assert len(records) == 1 and records[0].startswith(f"exact search backend: {faster} ")


@needs_faiss
def test_an_explicit_backend_overrides_the_measurement(unmeasured):
    probe = unmeasured(faiss_seconds=0.05, torch_seconds=0.2)
    embeddings, labels = clustered_data(15)
    expected = reference_metrics(embeddings, labels, (1, 2, 4, 8))
    for backend in ("faiss", "torch"):
        assert search_backend(backend) == backend
        assert_metrics_equal(retrieval_metrics(embeddings, labels, backend=backend), expected)
    assert probe.calls == 0  # nothing to choose, nothing measured


def test_auto_measures_nothing_where_there_is_no_choice(unmeasured, monkeypatch):
    probe = unmeasured(faiss_seconds=0.05, torch_seconds=0.2)
    assert search_backend("auto", "cuda") == "torch"  # the device's type decides; no GPU needed to ask
    monkeypatch.setitem(sys.modules, "faiss", None)
    assert search_backend("auto") == "torch"
    assert probe.calls == 0


@needs_faiss
def test_threads_asking_at_once_measure_once(unmeasured):
    probe = unmeasured(faiss_seconds=0.2, torch_seconds=0.05, pause=0.05)
    with ThreadPoolExecutor(max_workers=4) as pool:
        choices = list(pool.map(lambda _: search_backend("auto"), range(8)))
    assert choices == ["torch"] * 8
    assert probe.calls == 1


@needs_faiss
def test_the_probe_times_both_backends():
    # Which backend wins depends on the machine; only the measurement's shape is checked, never a time.
    faiss_seconds, torch_seconds = memvir.retrieval.knn._time_probe_searches()
    assert 0.0 < faiss_seconds < math.inf and 0.0 < torch_seconds < math.inf


@pytest.mark.parametrize("device", DEVICES)
def test_metrics_on_device_match_brute_force(device):
    embeddings, labels = clustered_data(10)
    expected = reference_metrics(embeddings, labels, (1, 2, 4, 8))
    on_device = torch.from_numpy(embeddings).to(device)
    assert_metrics_equal(retrieval_metrics(on_device, torch.from_numpy(labels).to(device)), expected)


def test_importing_metrics_imports_neither_faiss_nor_scikit_learn():
    code = (
        "import sys, memvir.retrieval.metrics, memvir.retrieval.index; "
        "assert 'faiss' not in sys.modules, 'faiss imported'; "
        "assert 'sklearn' not in sys.modules, 'sklearn imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------------------------
# NMI
# ---------------------------------------------------------------------------------------------------------------


@needs_sklearn
def test_nmi_hand_computed_contingency_example():
    # true: 0 0 0 1 1 1   pred: 0 0 1 1 2 2   (n = 6; row sums a = 3, 3; column sums b = 2, 2, 2)
    # MI = sum n_ij/n log(n n_ij / (a_i b_j)) = 2/6 log 2 + 1/6 log 1 + 1/6 log 1 + 2/6 log 2 = (2/3) log 2
    # H(true) = log 2, H(pred) = log 3; NMI = (2/3) log 2 / ((log 2 + log 3) / 2) = 4 log 2 / (3 log 6)
    expected = 4 * math.log(2) / (3 * math.log(6))
    assert normalized_mutual_info([0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2]) == pytest.approx(expected, abs=1e-12)
    # NMI is symmetric and ignores the names of labels and clusters.
    assert normalized_mutual_info(["b", "b", "c", "c", "a", "a"], [7, 7, 7, 3, 3, 3]) == pytest.approx(
        expected, abs=1e-12
    )


@needs_sklearn
def test_nmi_edge_cases():
    assert normalized_mutual_info([4, 4, 4], [1, 1, 1]) == 1.0  # one class, one cluster: identical labelings
    assert normalized_mutual_info([0, 0, 1, 1], [0, 1, 0, 1]) == 0.0  # independent: MI = 0
    assert normalized_mutual_info([0, 0, 1, 1], [0, 0, 0, 0]) == 0.0
    assert normalized_mutual_info([0, 0, 1, 2], [5, 5, 9, 8]) == pytest.approx(1.0, abs=1e-12)


def test_nmi_matches_scikit_learn_on_random_labelings():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(5):
        true = rng.integers(0, 7, size=200)
        pred = rng.integers(0, 5, size=200)
        expected = sklearn_metrics.normalized_mutual_info_score(true, pred)
        assert normalized_mutual_info(true, pred) == pytest.approx(expected, abs=1e-12)


@needs_sklearn
@pytest.mark.parametrize("backend", BACKENDS)
def test_nmi_is_one_for_separated_classes(backend):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(6), 10)
    embeddings = np.eye(8)[labels] + 0.01 * rng.normal(size=(60, 8))
    metrics = retrieval_metrics(embeddings, labels, ks=(1,), nmi=True, backend=backend)
    assert metrics["nmi"] == pytest.approx(1.0, abs=1e-12)
    assert metrics["recall@1"] == 1.0


@needs_sklearn
@pytest.mark.parametrize("backend", BACKENDS)
def test_nmi_leaves_singletons_out_and_is_a_fraction(backend):
    embeddings, labels = clustered_data(11)
    value = retrieval_metrics(embeddings, labels, nmi=True, backend=backend)["nmi"]
    assert isinstance(value, float) and 0.0 < value < 1.0
    assert retrieval_metrics(embeddings, labels, nmi=True, backend=backend)["nmi"] == value  # fixed seed
    assert "nmi" not in retrieval_metrics(embeddings, labels, backend=backend)


def test_nmi_scores_scikit_learn_k_means_of_the_queries():
    # The k-means is scikit-learn's, run on the normalised queries (singletons left out) with as many clusters as
    # classes and the given seed; NMI is then checked against the hand-computed definition above.
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    embeddings, labels = clustered_data(13, class_sizes=(8,) * 6 + (1, 1), dim=6, spread=1.0)
    queries = np.isin(labels, np.flatnonzero(np.bincount(labels) > 1))
    unit = embeddings[queries] / np.linalg.norm(embeddings[queries], axis=1, keepdims=True)
    clusters = sklearn_cluster.KMeans(n_clusters=6, init="k-means++", n_init=1, random_state=3).fit_predict(unit)
    expected = reference_nmi(labels[queries], clusters)
    assert retrieval_metrics(embeddings, labels, ks=(1,), nmi=True, seed=3)["nmi"] == pytest.approx(expected, abs=1e-6)


def test_nmi_k_means_runs_with_blas_on_one_thread(monkeypatch):
    # KMeans parallelises over its own OpenMP threads; BLAS threads on top of them oversubscribe the cores.
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas_threads = []

    def fit_predict(self, points):
        blas_threads.extend(
            pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"
        )
        return np.arange(len(points)) % self.n_clusters

    monkeypatch.setattr(sklearn_cluster.KMeans, "fit_predict", fit_predict)
    embeddings, labels = clustered_data(17)
    assert 0.0 <= retrieval_metrics(embeddings, labels, nmi=True)["nmi"] <= 1.0
    assert blas_threads and set(blas_threads) == {1}


def test_nmi_without_scikit_learn_says_what_is_needed(monkeypatch):
    embeddings, labels = clustered_data(16)
    for module in ("sklearn", "sklearn.cluster", "sklearn.metrics"):
        monkeypatch.setitem(sys.modules, module, None)  # makes the import raise ImportError
    assert "nmi" not in retrieval_metrics(embeddings, labels)  # the metrics without NMI need no scikit-learn
    with pytest.raises(ImportError, match="NMI needs the scikit-learn package"):
        retrieval_metrics(embeddings, labels, nmi=True)
    with pytest.raises(ImportError, match="NMI needs the scikit-learn package"):
        normalized_mutual_info([0, 1], [0, 1])


def test_nmi_errors():
    with pytest.raises(ValueError, match=r"1-D and of equal length; got shapes \(3,\) and \(2,\)"):
        normalized_mutual_info([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="labelings are empty"):
        normalized_mutual_info([], [])


# ---------------------------------------------------------------------------------------------------------------
# knn_search
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_knn_search_matches_brute_force(backend):
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(23, 10)).astype(np.float32)
    gallery = rng.normal(size=(41, 10)).astype(np.float32) * rng.uniform(0.1, 5, size=(41, 1)).astype(np.float32)
    scores, indices = knn_search(queries, gallery, 9, backend=backend, chunk_size=None if backend == "faiss" else 5)
    assert scores.dtype == np.float32 and indices.dtype == np.int64
    assert scores.shape == indices.shape == (23, 9)
    np.testing.assert_array_equal(indices, reference_neighbours(queries, gallery, 9))
    unit_queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    unit_gallery = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    expected_scores = np.einsum("qd,qkd->qk", unit_queries, unit_gallery[indices])
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_knn_search_exclude_self_drops_the_query_by_index_not_its_duplicate(backend):
    rng = np.random.default_rng(2)
    points = rng.normal(size=(12, 5)).astype(np.float32)
    points[7] = points[3]  # an exact duplicate
    scores, indices = knn_search(points, points, 11, exclude_self=True, backend=backend)
    for query in range(12):
        assert query not in indices[query]
        assert sorted(indices[query]) == [j for j in range(12) if j != query]
    assert indices[3, 0] == 7 and indices[7, 0] == 3
    assert scores[3, 0] == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_array_equal(indices, reference_neighbours(points, points, 11, exclude_self=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_exclude_self_when_the_query_ties_with_more_copies_than_k(backend):
    # Six copies of one point: a search for k + 1 = 3 places may return three other copies and not the query
    # itself; the query must still be left out and exactly k copies returned.
    rng = np.random.default_rng(5)
    points = np.concatenate([np.tile(rng.normal(size=(1, 4)), (6, 1)), rng.normal(size=(3, 4))]).astype(np.float32)
    scores, indices = knn_search(points, points, 2, exclude_self=True, backend=backend)
    for query in range(6):
        assert query not in indices[query]
        assert set(indices[query]) <= set(range(6))
        np.testing.assert_allclose(scores[query], 1.0, atol=1e-6)
    if backend == "torch":  # lower index first among the tied copies
        assert indices[:6].tolist() == [[1, 2], [0, 2], [0, 1], [0, 1], [0, 1], [0, 1]]


def test_torch_search_breaks_ties_by_lower_index_even_at_the_kth_place():
    # Axis-aligned unit vectors: every similarity is exactly 0 or 1, so ties are exact.
    e1, e2, e3 = np.eye(3, dtype=np.float32)
    gallery = np.stack([e2, e1, e3, e1, e1, e2])  # similarity to e1: 0 1 0 1 1 0
    expected = {1: [1], 2: [1, 3], 3: [1, 3, 4], 4: [1, 3, 4, 0], 5: [1, 3, 4, 0, 2], 6: [1, 3, 4, 0, 2, 5]}
    for k, order in expected.items():
        for chunk_size in (1, None):
            scores, indices = knn_search(e1[None], gallery, k, backend="torch", chunk_size=chunk_size)
            assert indices[0].tolist() == order
            assert scores[0].tolist() == [1.0 if j in (1, 3, 4) else 0.0 for j in order]


@needs_faiss
def test_faiss_search_orders_tied_rows_by_index():
    e1, e2, e3 = np.eye(3, dtype=np.float32)
    gallery = np.stack([e2, e1, e3, e1, e1, e2])
    scores, indices = knn_search(np.stack([e1, e1]), gallery, 6, backend="faiss")
    assert indices.tolist() == [[1, 3, 4, 0, 2, 5]] * 2
    assert scores[0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


@needs_faiss
def test_knn_search_accepts_a_faiss_index_as_gallery():
    import faiss

    rng = np.random.default_rng(3)
    gallery = rng.normal(size=(30, 6)).astype(np.float32)
    gallery /= np.linalg.norm(gallery, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(6)
    index.add(gallery)
    queries = rng.normal(size=(4, 6)).astype(np.float32)
    expected = reference_neighbours(queries, gallery, 5)
    for backend in ("auto", "faiss", "torch"):
        np.testing.assert_array_equal(knn_search(queries, index, 5, backend=backend)[1], expected)


@pytest.mark.parametrize("device", DEVICES)
def test_knn_search_chunk_sizes_agree(device):
    rng = np.random.default_rng(4)
    points = torch.from_numpy(rng.normal(size=(50, 8)).astype(np.float32)).to(device)
    expected = reference_neighbours(points.cpu().numpy(), points.cpu().numpy(), 6, exclude_self=True)
    for chunk_size in (1, 7, 49, 50, 51):
        _, indices = knn_search(points, points, 6, exclude_self=True, backend="torch", chunk_size=chunk_size)
        np.testing.assert_array_equal(indices, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_unit_gallery_matches_knn_search_on_a_normalised_gallery(backend):
    rng = np.random.default_rng(6)
    queries = rng.normal(size=(9, 7)).astype(np.float32)
    gallery = rng.normal(size=(30, 7)).astype(np.float32)
    unit_gallery = torch.from_numpy(gallery / np.linalg.norm(gallery, axis=1, keepdims=True))
    expected = knn_search(queries, gallery, 8, backend=backend)
    actual = search_unit_gallery(queries, unit_gallery, 8, backend=backend)
    np.testing.assert_array_equal(actual[1], expected[1])
    np.testing.assert_allclose(actual[0], expected[0], atol=1e-6)
    np.testing.assert_array_equal(actual[1], reference_neighbours(queries, gallery, 8))


@needs_faiss
def test_auto_searches_a_faiss_index_in_faiss_whatever_was_measured(monkeypatch):
    monkeypatch.setattr(memvir.retrieval.knn, "_measured_cpu_backend", "torch")  # torch is faster for arrays here
    used = record_searches(monkeypatch)
    rng = np.random.default_rng(7)
    gallery = rng.normal(size=(25, 5)).astype(np.float32)
    index = flat_inner_product_index(gallery / np.linalg.norm(gallery, axis=1, keepdims=True))
    queries = rng.normal(size=(3, 5)).astype(np.float32)
    np.testing.assert_array_equal(knn_search(queries, index, 4)[1], reference_neighbours(queries, gallery, 4))
    assert used == ["_faiss_search"]  # not copied out of the index into a torch search


@needs_faiss
def test_flat_inner_product_index_holds_the_vectors_given():
    import faiss

    vectors = np.random.default_rng(8).normal(size=(12, 4)).astype(np.float32)
    for given in (vectors, torch.from_numpy(vectors)):
        index = flat_inner_product_index(given)
        assert isinstance(index, faiss.IndexFlatIP) and (index.ntotal, index.d) == (12, 4)
        np.testing.assert_array_equal(index.reconstruct_n(0, 12), vectors)


def test_l2_normalized_matches_a_float64_reference_including_zero_and_huge_rows():
    rng = np.random.default_rng(9)
    rows = rng.normal(size=(6, 5)) * rng.uniform(0.01, 100, size=(6, 1))
    rows[2] = 0.0  # stays zero: similarity 0 to everything
    rows[4] = 1e30  # finite, though its float32 norm overflows: not reported as NaN/inf
    actual = l2_normalized(rows).numpy()
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    expected = np.where(norms > 0, rows / np.where(norms > 0, norms, 1), 0.0)
    expected[4] = 0.0  # x / inf, as torch's normalize gives where the norm overflows
    np.testing.assert_allclose(actual, expected, atol=1e-6)
    assert actual.dtype == np.float32


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


def test_metrics_input_errors():
    good = np.random.default_rng(0).normal(size=(6, 4))
    labels = [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match=r"embeddings must be 2-D \[N, D\]; got shape \(6,\)"):
        retrieval_metrics(good[:, 0], labels)
    with pytest.raises(ValueError, match=r"no rows in embeddings \(shape \(0, 4\)\)"):
        retrieval_metrics(np.zeros((0, 4)), [])
    with pytest.raises(ValueError, match=r"no dimensions in embeddings \(shape \(6, 0\)\)"):
        retrieval_metrics(np.zeros((6, 0)), labels)
    with pytest.raises(ValueError, match=r"labels must be 1-D \[N\]; got shape \(6, 1\)"):
        retrieval_metrics(good, np.array(labels)[:, None])
    with pytest.raises(ValueError, match="embeddings have 6 rows but labels have 5; pass one label per row"):
        retrieval_metrics(good, labels[:5])
    with pytest.raises(ValueError, match="no class has at least two members among the 6 items"):
        retrieval_metrics(good, [0, 1, 2, 3, 4, 5])


def test_metrics_nan_and_inf_errors_count_rows():
    embeddings = np.random.default_rng(0).normal(size=(6, 4))
    embeddings[1, 2] = np.nan
    embeddings[4, 0] = np.nan
    embeddings[4, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or inf in 2 of 6 rows of embeddings"):
        retrieval_metrics(embeddings, [0, 0, 1, 1, 2, 2])
    overflow = torch.full((4, 2), 70000.0).half()  # float16 overflow becomes inf
    with pytest.raises(ValueError, match="NaN or inf in 4 of 4 rows of embeddings"):
        retrieval_metrics(overflow, [0, 0, 1, 1])


def test_metrics_k_errors_name_the_largest_valid_k():
    embeddings = np.random.default_rng(0).normal(size=(6, 4))
    labels = [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="K=6 is out of range: it must be >= 1 and the largest valid value is 5"):
        retrieval_metrics(embeddings, labels, ks=(1, 6))
    with pytest.raises(ValueError, match="K=0 is out of range.*largest valid value is 5"):
        retrieval_metrics(embeddings, labels, ks=(0,))
    with pytest.raises(ValueError, match="K must be an integer; got 1.5"):
        retrieval_metrics(embeddings, labels, ks=(1.5,))
    with pytest.raises(ValueError, match="ks is empty"):
        retrieval_metrics(embeddings, labels, ks=())
    assert "recall@5" in retrieval_metrics(embeddings, labels, ks=(5,))


def test_backend_and_chunk_size_errors():
    embeddings = np.random.default_rng(0).normal(size=(6, 4))
    labels = [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'faiss', 'torch'\); got 'gpu'"):
        retrieval_metrics(embeddings, labels, ks=(1,), backend="gpu")
    with pytest.raises(ValueError, match="chunk_size must be a positive integer or None; got 0"):
        retrieval_metrics(embeddings, labels, ks=(1,), backend="torch", chunk_size=0)


def test_knn_search_errors():
    rng = np.random.default_rng(0)
    gallery = rng.normal(size=(5, 4))
    with pytest.raises(ValueError, match="queries have 3 dimensions but the gallery has 4"):
        knn_search(rng.normal(size=(2, 3)), gallery, 1)
    with pytest.raises(ValueError, match="k=6 is out of range: it must be >= 1 and the largest valid value is 5"):
        knn_search(gallery, gallery, 6)
    with pytest.raises(ValueError, match="k=5 is out of range.*largest valid value is 4"):
        knn_search(gallery, gallery, 5, exclude_self=True)
    with pytest.raises(ValueError, match="there are 2 queries and 5 gallery items"):
        knn_search(gallery[:2], gallery, 1, exclude_self=True)
    with pytest.raises(ValueError, match="exclude_self leaves no gallery item to find"):
        knn_search(gallery[:1], gallery[:1], 1, exclude_self=True)
    with pytest.raises(ValueError, match=r"gallery must be 2-D \[N, D\]"):
        knn_search(gallery, gallery[0], 1)
    with pytest.raises(ValueError, match=r"no rows in queries"):
        knn_search(np.zeros((0, 4)), gallery, 1)
    with pytest.raises(ValueError, match="NaN or inf in 1 of 5 rows of gallery"):
        knn_search(gallery, np.where(np.arange(5)[:, None] == 2, np.inf, gallery), 1)


# ---------------------------------------------------------------------------------------------------------------
# per_query_metrics
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_query_metrics_of_five_points_on_an_arc_hand_computed(backend):
    # The arc of test_five_points_on_an_arc_hand_computed, query by query (its table's rows).
    embeddings = unit_vectors_at_degrees(0, 10, 30, 65, 110)
    per_query = per_query_metrics(embeddings, ["a", "b", "a", "a", "b"], ks=(1, 2), backend=backend)
    assert per_query["query"].tolist() == [0, 1, 2, 3, 4]
    assert per_query["label"].tolist() == ["a", "b", "a", "a", "b"]
    assert per_query["recall@1"].tolist() == [False, False, False, True, False]
    assert per_query["recall@2"].tolist() == [True, False, True, True, False]
    assert per_query["precision@1"].tolist() == per_query["recall@1"].tolist()
    assert per_query["r_precision"] == pytest.approx([1 / 2, 0, 1 / 2, 1 / 2, 0], abs=1e-12)
    assert per_query["map@r"] == pytest.approx([1 / 4, 0, 1 / 4, 1 / 2, 0], abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_per_query_metrics_average_to_the_brute_force_metrics_and_leave_out_singletons(seed):
    embeddings, labels = clustered_data(seed)
    per_query = per_query_metrics(embeddings, labels, ks=(1, 4))
    counts = np.bincount(labels)
    assert per_query["query"].tolist() == np.flatnonzero(counts[labels] > 1).tolist()
    assert np.array_equal(per_query["label"], labels[per_query["query"]])
    expected = reference_metrics(embeddings, labels, (1, 4))
    for name in ("recall@1", "recall@4", "precision@1", "r_precision", "map@r"):
        assert float(per_query[name].mean()) == pytest.approx(expected[name], abs=1e-12), name
