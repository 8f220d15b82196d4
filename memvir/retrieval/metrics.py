"""Retrieval metrics of embeddings: Recall@K, P@1, R-Precision, MAP@R and NMI, over the kNN search of
memvir.retrieval.knn. Definitions as docs/method.md, "Evaluation"; similarity is cosine (every vector is L2-normalised
here)."""

from dataclasses import dataclass

import numpy as np
import torch

from memvir.retrieval.knn import check_k, l2_normalized, search_normalized

# Neighbour labels turned into metric sums at once: bounds the temporaries of the cumulative precision.
_METRIC_BLOCK_ELEMENTS = 2**22


def _label_codes(labels, num_items):
    """Labels (any hashable numpy dtype, or a tensor) as int64 codes 0..C-1."""
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be 1-D [N]; got shape {array.shape}")
    if array.shape[0] != num_items:
        raise ValueError(f"embeddings have {num_items} rows but labels have {array.shape[0]}; pass one label per row")
    return np.unique(array, return_inverse=True)[1].astype(np.int64)


def _check_ks(ks, num_items):
    ks = (ks,) if isinstance(ks, int | np.integer) else tuple(ks)
    if not ks:
        raise ValueError("ks is empty; pass at least one K, e.g. ks=(1, 2, 4, 8)")
    return tuple(dict.fromkeys(check_k(k, num_items - 1, "K") for k in ks))


def retrieval_metrics(embeddings, labels, ks=(1, 2, 4, 8), nmi=False, *, backend="auto", chunk_size=None, seed=0):
    """Recall@K, P@1, R-Precision, MAP@R (and NMI on request) of ``embeddings`` [N, D] with class ``labels`` [N].

    Accepts torch tensors (any device, any float dtype) or numpy arrays; labels may be any hashable values.
    Every item queries all others by cosine similarity, itself excluded by index (an exact duplicate of a query
    counts as its neighbour). Items whose class has no other member are left out as queries and out of NMI; they
    stay in the gallery as distractors.

    For a query with R other items of its class and neighbours n_1, n_2, ... (ties by lower index, see
    ``memvir.retrieval.knn.knn_search``): Recall@K = [some n_i with i <= K is correct]; P@1 = [n_1 is correct] (equal to
    Recall@1); R-Precision = #correct among n_1..n_R / R; MAP@R = (1/R) * sum_{i <= R} P@i * [n_i is correct],
    with P@i the fraction correct among n_1..n_i. Each is averaged over the queries.

    nmi=True adds "nmi": scikit-learn's k-means (k-means++ start, ``seed``, run to convergence) with as many
    clusters as classes, scored by ``normalized_mutual_info``; it needs the scikit-learn package.

    Args:
        embeddings: [N, D], one row per item; L2-normalised here.
        labels: [N], each item's class.
        ks: the K of each Recall@K, each in 1..N-1 (an int for one).
        nmi: also cluster the queries and report their NMI.
        backend: the kNN search, "auto" | "faiss" | "torch" (see ``memvir.retrieval.knn.search_backend``).
        chunk_size: queries per torch matmul (default: about 64 MiB of similarities).
        seed: the k-means seed of NMI.

    Returns:
        {"recall@K" for each K, "precision@1", "r_precision", "map@r"[, "nmi"]}: plain floats in [0, 1].

    Raises:
        ValueError: for bad shapes, NaN/inf rows, K outside 1..N-1, or no class with two members.
    """
    found = _search(embeddings, labels, ks, backend, chunk_size)
    per_query = _neighbour_metrics(found)
    metrics = {f"recall@{k}": float(per_query[f"recall@{k}"].mean()) for k in found.ks}
    metrics["precision@1"] = float(per_query["precision@1"].mean())
    metrics["r_precision"] = float(per_query["r_precision"].mean())
    metrics["map@r"] = float(per_query["map@r"].mean())
    if nmi:
        clusters = _kmeans(found.queries, len(np.unique(found.query_codes)), seed)
        metrics["nmi"] = normalized_mutual_info(found.query_codes, clusters)
    return metrics


def per_query_metrics(embeddings, labels, ks=(1,), *, backend="auto", chunk_size=None) -> dict[str, np.ndarray]:
    """Each query's own Recall@K, P@1, R-Precision and AP@R: what `retrieval_metrics` averages, query by query (for
    per-class tables, the hardest queries, and bootstrap intervals over classes).

    Same arguments, queries and definitions as `retrieval_metrics`. Returns {"query": the query items' indices [Q]
    (items whose class has another member, ascending), "label": their labels as given, "recall@K" (bool) for each K,
    "precision@1" (bool), "r_precision", "map@r" (float64: the query's AP@R)}, numpy arrays of length Q; the mean of
    each is `retrieval_metrics`' value.
    """
    found = _search(embeddings, labels, ks, backend, chunk_size)
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    return {"query": found.query_indices, "label": array[found.query_indices], **_neighbour_metrics(found)}


@dataclass(frozen=True)
class _Found:
    """The kNN search of every query: what the metrics are computed from."""

    queries: torch.Tensor  # [Q, D] normalised query vectors
    query_indices: np.ndarray  # [Q] item index of each query
    query_codes: np.ndarray  # [Q] label code of each query
    others: np.ndarray  # [Q] R, the other items of the query's class
    codes: np.ndarray  # [N] label code of every item
    neighbours: np.ndarray  # [Q, max(K, R)] item indices, nearest first, the query itself excluded
    ks: tuple[int, ...]


def _search(embeddings, labels, ks, backend, chunk_size) -> _Found:
    vectors = l2_normalized(embeddings, "embeddings")
    codes = _label_codes(labels, vectors.shape[0])
    same_class_others = np.bincount(codes)[codes] - 1
    query_indices = np.flatnonzero(same_class_others > 0)
    if query_indices.size == 0:
        raise ValueError(
            f"no class has at least two members among the {len(codes)} items, so no item has a same-class "
            "neighbour to find; pass several items per class"
        )
    ks = _check_ks(ks, vectors.shape[0])
    others = same_class_others[query_indices]
    num_neighbours = max(max(ks), int(others.max()))
    if query_indices.size == len(codes):  # every item is a query: search with the vectors themselves, no copy
        queries = vectors
    else:
        queries = vectors[torch.as_tensor(query_indices, device=vectors.device)]
    _, neighbours = search_normalized(queries, vectors, num_neighbours, query_indices, backend, chunk_size)
    return _Found(queries, query_indices, codes[query_indices], others, codes, neighbours, ks)


def _neighbour_metrics(found: _Found) -> dict[str, np.ndarray]:
    """Each query's metrics; rows are processed in blocks so temporaries stay small."""
    num_queries, num_neighbours = found.neighbours.shape
    ranks = np.arange(1, num_neighbours + 1)
    recall = {k: np.empty(num_queries, dtype=bool) for k in found.ks}
    top1 = np.empty(num_queries, dtype=bool)
    r_precision = np.empty(num_queries)
    map_at_r = np.empty(num_queries)
    block = max(1, _METRIC_BLOCK_ELEMENTS // num_neighbours)
    for start in range(0, num_queries, block):
        rows = slice(start, start + block)
        correct = found.codes[found.neighbours[rows]] == found.query_codes[rows, None]
        r = found.others[rows]
        top1[rows] = correct[:, 0]
        for k in found.ks:
            recall[k][rows] = correct[:, :k].any(axis=1)
        correct_within_r = correct & (ranks <= r[:, None])
        precision_at_rank = np.cumsum(correct, axis=1) / ranks
        r_precision[rows] = correct_within_r.sum(axis=1) / r
        map_at_r[rows] = (precision_at_rank * correct_within_r).sum(axis=1) / r
    return {**{f"recall@{k}": recall[k] for k in found.ks}, "precision@1": top1, "r_precision": r_precision,
            "map@r": map_at_r}


def _import_sklearn(module, what):
    """``sklearn.<module>``, imported here (never at module import: the training path imports this module on machines
    without scikit-learn, a GPU training image for one), with a clear error where it is missing."""
    import importlib

    try:
        return importlib.import_module(f"sklearn.{module}")
    except ImportError as error:
        raise ImportError(f"{what} needs the scikit-learn package; install it (pip install scikit-learn)") from error


def normalized_mutual_info(labels_true, labels_pred):
    """NMI of two labelings of the same items: scikit-learn's ``normalized_mutual_info_score`` with its default
    arithmetic-mean normalisation, MI / ((H(true) + H(pred)) / 2), as a plain float.

    Two single-cluster labelings score 1.0; MI = 0 scores 0.0. Labels may be any hashable values.
    """
    true = np.asarray(labels_true)
    pred = np.asarray(labels_pred)
    if true.ndim != 1 or pred.ndim != 1 or true.shape != pred.shape:
        raise ValueError(f"labelings must be 1-D and of equal length; got shapes {true.shape} and {pred.shape}")
    if true.size == 0:
        raise ValueError("labelings are empty; pass at least one item")
    cluster_metrics = _import_sklearn("metrics", "NMI")
    return float(cluster_metrics.normalized_mutual_info_score(true, pred))


def _kmeans(points, num_clusters, seed):
    """Cluster ids (numpy int64) of normalised ``points`` [N, D] from scikit-learn's k-means.

    One run from a greedy k-means++ start, iterated to convergence: on clustered embeddings it scores a higher and
    steadier NMI across seeds than faiss's fixed 20 iterations from a plain k-means++ start (docs/benchmarks.md).
    """
    cluster = _import_sklearn("cluster", "NMI")
    from threadpoolctl import threadpool_limits  # a dependency of scikit-learn, so present wherever it is

    kmeans = cluster.KMeans(n_clusters=num_clusters, init="k-means++", n_init=1, random_state=seed)
    # KMeans spreads its work over its own OpenMP threads; BLAS threads on top of those (numpy's and scipy's
    # OpenBLAS start one per core each) oversubscribe the cores, which made it 7 times slower on a busy machine.
    with threadpool_limits(limits=1, user_api="blas"):
        return kmeans.fit_predict(points.cpu().numpy()).astype(np.int64)
