"""Retrieval metrics of embeddings: Recall@K, P@1, R-Precision, MAP@R and NMI, over the kNN search of
memvir.retrieval.knn, in two protocols: leave-one-out (every item queries all the others) and query/gallery (queries
search a separate gallery, as In-shop's). Definitions as docs/method.md, "Evaluation"; similarity is cosine (every
vector is L2-normalised here)."""

from dataclasses import dataclass

import numpy as np
import torch

from memvir.retrieval.knn import check_k, l2_normalized, search_normalized

# Neighbour labels turned into metric sums at once: bounds the temporaries of the cumulative precision.
_METRIC_BLOCK_ELEMENTS = 2**22


def _label_array(labels, num_items, rows_name, labels_name):
    """``labels`` as a 1-D numpy array of one label per row of ``rows_name`` (the names are for the message)."""
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"{labels_name} must be 1-D [N]; got shape {array.shape}")
    if array.shape[0] != num_items:
        raise ValueError(
            f"{rows_name} have {num_items} rows but {labels_name} have {array.shape[0]}; pass one label per row"
        )
    return array


def _codes(array):
    """Labels (any hashable numpy dtype) as int64 codes 0..C-1."""
    return np.unique(array, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _check_ks(ks, largest):
    ks = (ks,) if isinstance(ks, int | np.integer) else tuple(ks)
    if not ks:
        raise ValueError("ks is empty; pass at least one K, e.g. ks=(1, 2, 4, 8)")
    return tuple(dict.fromkeys(check_k(k, largest, "K") for k in ks))


def retrieval_metrics(embeddings, labels, ks=(1, 2, 4, 8), nmi=False, *, gallery=None, gallery_labels=None,
                      backend="auto", chunk_size=None, seed=0):
    """Recall@K, P@1, R-Precision, MAP@R (and NMI on request) of ``embeddings`` [N, D] with class ``labels`` [N].

    Accepts torch tensors (any device, any float dtype) or numpy arrays; labels may be any hashable values.

    Leave-one-out (no ``gallery``): every item queries all others by cosine similarity, itself excluded by index (an
    exact duplicate of a query counts as its neighbour). Items whose class has no other member are left out as
    queries and out of NMI; they stay in the gallery as distractors. R is the number of other items of the query's
    class.

    Query/gallery (``gallery`` and ``gallery_labels`` given, as In-shop's protocol): ``embeddings`` are the queries
    and search the gallery only; nothing is excluded, so a query that is also a gallery item finds itself. R is the
    number of gallery items of the query's class; a query whose class has no gallery item is left out of every
    metric and out of NMI. Gallery items of classes no query has are distractors.

    For a query with R relevant items and neighbours n_1, n_2, ... (ties by lower index, see
    ``memvir.retrieval.knn.knn_search``): Recall@K = [some n_i with i <= K is correct]; P@1 = [n_1 is correct] (equal to
    Recall@1); R-Precision = #correct among n_1..n_R / R; MAP@R = (1/R) * sum_{i <= R} P@i * [n_i is correct],
    with P@i the fraction correct among n_1..n_i. Each is averaged over the queries. Both protocols agree with
    pytorch-metric-learning's ``AccuracyCalculator`` (``ref_includes_query`` True and False, ``k="max_bin_count"``).

    nmi=True adds "nmi": scikit-learn's k-means (k-means++ start, ``seed``, run to convergence) of the queries with
    as many clusters as their classes, scored by ``normalized_mutual_info``; it needs the scikit-learn package.

    Args:
        embeddings: [N, D], one row per item (the queries when a gallery is given); L2-normalised here.
        labels: [N], each item's class.
        ks: the K of each Recall@K, each in 1..N-1 (1..gallery size with a gallery; an int for one).
        nmi: also cluster the queries and report their NMI.
        gallery: [G, D], the items the queries search instead of each other; L2-normalised here.
        gallery_labels: [G], each gallery item's class; given exactly when ``gallery`` is.
        backend: the kNN search, "auto" | "faiss" | "torch" (see ``memvir.retrieval.knn.search_backend``).
        chunk_size: queries per torch matmul (default: about 64 MiB of similarities).
        seed: the k-means seed of NMI.

    Returns:
        {"recall@K" for each K, "precision@1", "r_precision", "map@r"[, "nmi"]}: plain floats in [0, 1].

    Raises:
        ValueError: for bad shapes, NaN/inf rows, K out of range, a gallery without its labels (or labels without
            it), or no query left (no class with two members; with a gallery, no query whose class is in it).
    """
    found = _search(embeddings, labels, ks, backend, chunk_size, gallery, gallery_labels)
    per_query = _neighbour_metrics(found)
    metrics = {f"recall@{k}": float(per_query[f"recall@{k}"].mean()) for k in found.ks}
    metrics["precision@1"] = float(per_query["precision@1"].mean())
    metrics["r_precision"] = float(per_query["r_precision"].mean())
    metrics["map@r"] = float(per_query["map@r"].mean())
    if nmi:
        clusters = _kmeans(found.queries, len(np.unique(found.query_codes)), seed)
        metrics["nmi"] = normalized_mutual_info(found.query_codes, clusters)
    return metrics


def per_query_metrics(embeddings, labels, ks=(1,), *, gallery=None, gallery_labels=None, backend="auto",
                      chunk_size=None) -> dict[str, np.ndarray]:
    """Each query's own Recall@K, P@1, R-Precision and AP@R: what `retrieval_metrics` averages, query by query (for
    per-class tables, the hardest queries, and bootstrap intervals over classes).

    Args:
        embeddings, labels, ks, gallery, gallery_labels, backend, chunk_size: as `retrieval_metrics`, with the same
            queries and definitions in either protocol.

    Returns:
        {"query": the kept queries' indices in ``embeddings`` [Q] (ascending; leave-one-out keeps items whose class
        has another member, query/gallery those whose class is in the gallery), "label": their labels as given,
        "recall@K" (bool) for each K, "precision@1" (bool), "r_precision", "map@r" (float64: the query's AP@R)},
        numpy arrays of length Q; the mean of each is `retrieval_metrics`' value.
    """
    found = _search(embeddings, labels, ks, backend, chunk_size, gallery, gallery_labels)
    return {"query": found.query_indices, "label": found.query_labels, **_neighbour_metrics(found)}


@dataclass(frozen=True)
class _Found:
    """The kNN search of every query: what the metrics are computed from."""

    queries: torch.Tensor  # [Q, D] normalised query vectors
    query_indices: np.ndarray  # [Q] index of each query among the items given as queries
    query_labels: np.ndarray  # [Q] each query's label as given
    query_codes: np.ndarray  # [Q] label code of each query
    relevant: np.ndarray  # [Q] R, the searched items of the query's class (the query itself not counted)
    codes: np.ndarray  # [G] label code of every searched item, in the same codes as the queries'
    neighbours: np.ndarray  # [Q, max(K, R)] searched item indices, nearest first (leave-one-out: the query excluded)
    ks: tuple[int, ...]


def _search(embeddings, labels, ks, backend, chunk_size, gallery=None, gallery_labels=None) -> _Found:
    if gallery is None and gallery_labels is None:
        return _search_leave_one_out(embeddings, labels, ks, backend, chunk_size)
    if gallery is None or gallery_labels is None:
        given, missing = ("gallery", "gallery_labels") if gallery_labels is None else ("gallery_labels", "gallery")
        raise ValueError(f"{given} was given without {missing}; pass both for the query/gallery protocol, or neither "
                         "for leave-one-out")
    return _search_gallery(embeddings, labels, gallery, gallery_labels, ks, backend, chunk_size)


def _search_leave_one_out(embeddings, labels, ks, backend, chunk_size) -> _Found:
    vectors = l2_normalized(embeddings, "embeddings")
    label_array = _label_array(labels, vectors.shape[0], "embeddings", "labels")
    codes = _codes(label_array)
    same_class_others = np.bincount(codes)[codes] - 1
    query_indices = np.flatnonzero(same_class_others > 0)
    if query_indices.size == 0:
        raise ValueError(
            f"no class has at least two members among the {len(codes)} items, so no item has a same-class "
            "neighbour to find; pass several items per class"
        )
    ks = _check_ks(ks, vectors.shape[0] - 1)
    relevant = same_class_others[query_indices]
    num_neighbours = max(max(ks), int(relevant.max()))
    if query_indices.size == len(codes):  # every item is a query: search with the vectors themselves, no copy
        queries = vectors
    else:
        queries = vectors[torch.as_tensor(query_indices, device=vectors.device)]
    _, neighbours = search_normalized(queries, vectors, num_neighbours, query_indices, backend, chunk_size)
    return _Found(queries, query_indices, label_array[query_indices], codes[query_indices], relevant, codes,
                  neighbours, ks)


def _search_gallery(embeddings, labels, gallery, gallery_labels, ks, backend, chunk_size) -> _Found:
    query_vectors = l2_normalized(embeddings, "embeddings")
    gallery_vectors = l2_normalized(gallery, "gallery")
    if query_vectors.shape[1] != gallery_vectors.shape[1]:
        raise ValueError(
            f"queries have {query_vectors.shape[1]} dimensions but the gallery has {gallery_vectors.shape[1]}; "
            "embed both with the same model"
        )
    num_queries, gallery_size = query_vectors.shape[0], gallery_vectors.shape[0]
    query_labels = _label_array(labels, num_queries, "embeddings", "labels")
    gallery_label_array = _label_array(gallery_labels, gallery_size, "gallery", "gallery_labels")
    # numpy would turn 3 and "3" into the same string when joining the two sets: refuse rather than match them.
    if (query_labels.dtype.kind in "US") != (gallery_label_array.dtype.kind in "US"):
        raise ValueError(
            f"labels are {query_labels.dtype} but gallery_labels are {gallery_label_array.dtype}; a class must be "
            "named alike in both (both strings or both numbers)"
        )
    # One coding of both sets, so that a query's class and a gallery item's class compare as integers.
    codes = _codes(np.concatenate([query_labels, gallery_label_array]))
    query_codes, gallery_codes = codes[:num_queries], codes[num_queries:]
    in_gallery = np.bincount(gallery_codes, minlength=int(codes.max()) + 1)[query_codes]
    query_indices = np.flatnonzero(in_gallery > 0)
    if query_indices.size == 0:
        raise ValueError(
            f"none of the {num_queries} queries has a class among the {gallery_size} gallery items' classes, so no "
            "query has an item to find; pass a gallery holding the queries' classes"
        )
    ks = _check_ks(ks, gallery_size)
    relevant = in_gallery[query_indices]
    num_neighbours = max(max(ks), int(relevant.max()))
    if query_indices.size == num_queries:
        queries = query_vectors
    else:
        queries = query_vectors[torch.as_tensor(query_indices, device=query_vectors.device)]
    _, neighbours = search_normalized(queries, gallery_vectors, num_neighbours, None, backend, chunk_size)
    return _Found(queries, query_indices, query_labels[query_indices], query_codes[query_indices], relevant,
                  gallery_codes, neighbours, ks)


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
        r = found.relevant[rows]
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
