"""Exact k-nearest-neighbour search by cosine similarity, in faiss or in chunked torch: the one search behind the
retrieval metrics (memvir.retrieval.metrics) and GalleryIndex (memvir.retrieval.index)."""

import logging
import threading
import time

import numpy as np
import torch

BACKENDS = ("auto", "faiss", "torch")

# Similarities held at once by the torch search (queries per chunk x gallery size): 2**24 float32 values are
# 64 MiB, which keeps a 100,000-item search well inside a small machine's memory; larger blocks are no faster.
_CHUNK_ELEMENTS = 2**24

# Both backends compute every similarity and return the same neighbours; neither ever builds an N x N similarity
# matrix. Which is faster on a CPU depends on the BLAS each one links (the faiss wheel bundles its own), and either
# can be several times faster than the other, so "auto" times both once per process and keeps the faster.
#
# The search "auto" times on each backend to choose between them: a few hundred queries against a gallery many
# times larger. It is the shape of a gallery search and the shape where the two differ most (bench/bench_metrics.py
# compares them on others too), and it costs a fraction of a second even where one backend is slow. The fastest of
# the runs counts, so a busy machine's pauses do not.
_PROBE_QUERIES = 256
_PROBE_GALLERY = 8192
_PROBE_DIM = 128
_PROBE_K = 10
_PROBE_RUNS = 2

_logger = logging.getLogger(__name__)
_measured_cpu_backend = None  # "faiss" or "torch" once timed; one measurement serves the whole process
_measure_lock = threading.Lock()  # the app builds indexes from several threads: measure once, not once each


def _import_faiss():
    """faiss if it is installed, else None (imported here, never at module import: the training path imports this
    module on machines without faiss, a GPU training image for one)."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def search_backend(backend="auto", device="cpu"):
    """The search that ``knn_search``, ``retrieval_metrics`` and ``GalleryIndex`` use for vectors on ``device``.

    Returns "faiss" or "torch". "auto" is torch for vectors on a GPU (searched where they are) or without faiss
    installed; on the CPU with faiss installed it is whichever searched faster in a small timed search run once per
    process (the choice is logged at INFO level). "faiss" and "torch" are used as given; "faiss" fails with
    ImportError when faiss is not installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if backend == "torch":
        return "torch"
    faiss_installed = _import_faiss() is not None
    if backend == "faiss":
        if not faiss_installed:
            raise ImportError("backend='faiss' needs the faiss-cpu package; install it or pass backend='torch'")
        return "faiss"
    if not faiss_installed or torch.device(device).type != "cpu":
        return "torch"
    return _faster_cpu_backend()


def _faster_cpu_backend():
    """The CPU backend that searched faster, measured on the first call and remembered for the process."""
    global _measured_cpu_backend
    with _measure_lock:
        if _measured_cpu_backend is None:
            start = time.perf_counter()
            faiss_seconds, torch_seconds = _time_probe_searches()
            _measured_cpu_backend = "faiss" if faiss_seconds < torch_seconds else "torch"
            _logger.info(
                "exact search backend: %s (timed %d x %d x %d, top-%d: faiss %.1f ms, torch %.1f ms, %d torch "
                "threads; choosing took %.0f ms)",
                _measured_cpu_backend,
                _PROBE_QUERIES,
                _PROBE_GALLERY,
                _PROBE_DIM,
                _PROBE_K,
                faiss_seconds * 1e3,
                torch_seconds * 1e3,
                torch.get_num_threads(),
                (time.perf_counter() - start) * 1e3,
            )
        return _measured_cpu_backend


def _time_probe_searches():
    """(faiss seconds, torch seconds): the fastest of up to ``_PROBE_RUNS`` runs of one random search on each backend.

    The runs alternate between the backends, so a pause of the machine hits both alike. Each backend first
    searches a few queries untimed: its first call starts thread pools and touches code, which a real search
    pays once per process, not per call.
    """
    generator = torch.Generator().manual_seed(0)
    gallery = torch.nn.functional.normalize(torch.randn(_PROBE_GALLERY, _PROBE_DIM, generator=generator), dim=1)
    queries = torch.nn.functional.normalize(torch.randn(_PROBE_QUERIES, _PROBE_DIM, generator=generator), dim=1)
    searches = {
        "faiss": lambda rows: _faiss_search(flat_inner_product_index(gallery), rows.numpy(), _PROBE_K, None),
        "torch": lambda rows: _torch_search(rows, gallery, _PROBE_K, None, None),
    }
    for search in searches.values():
        search(queries[:64])
    fastest = dict.fromkeys(searches, float("inf"))
    for _ in range(_PROBE_RUNS):
        for name, search in searches.items():
            start = time.perf_counter()
            search(queries)
            fastest[name] = min(fastest[name], time.perf_counter() - start)
        if max(fastest.values()) > 2 * min(fastest.values()):
            break  # a margin this wide is no pause of the machine: another run would not change the choice
    return fastest["faiss"], fastest["torch"]


def l2_normalized(vectors, name="embeddings"):
    """``vectors`` ([N, D] torch tensor on any device, any float dtype, or array-like) as unit-length float32 rows.

    The tensor stays on its device. All-zero rows stay zero (similarity 0 to everything). Raises ValueError for a
    shape other than [N, D] with N, D >= 1, and for rows holding NaN or inf (after the cast to float32).
    """
    tensor = vectors.detach() if isinstance(vectors, torch.Tensor) else torch.as_tensor(np.asarray(vectors))
    if tensor.ndim != 2:
        raise ValueError(f"{name} must be 2-D [N, D]; got shape {tuple(tensor.shape)}")
    if tensor.shape[0] == 0:
        raise ValueError(f"no rows in {name} (shape {tuple(tensor.shape)}); pass at least one vector")
    if tensor.shape[1] == 0:
        raise ValueError(f"no dimensions in {name} (shape {tuple(tensor.shape)}); pass [N, D] vectors with D >= 1")
    tensor = tensor.to(torch.float32)
    norms = torch.linalg.vector_norm(tensor, dim=1, keepdim=True)
    # A NaN or inf makes its row's norm non-finite, so the norms (needed anyway) find bad rows without a pass of
    # their own; a row of huge finite values overflows its norm too, hence the element-wise count before raising.
    if not bool(torch.isfinite(norms).all()):
        bad_rows = int((~torch.isfinite(tensor)).any(dim=1).sum())
        if bad_rows:
            raise ValueError(
                f"NaN or inf in {bad_rows} of {tensor.shape[0]} rows of {name}; check the model output "
                "(a diverged loss or a float16 overflow) before searching"
            )
    return tensor / norms.clamp_min(1e-12)  # what F.normalize computes, with the norms already at hand


def flat_inner_product_index(unit_vectors):
    """An exact faiss inner-product index (``IndexFlatIP``) holding ``unit_vectors`` ([N, D] float32 tensor or
    array, already L2-normalised): the one place such an index is built, for the search here and ``GalleryIndex``."""
    import faiss

    array = unit_vectors.cpu().numpy() if isinstance(unit_vectors, torch.Tensor) else unit_vectors
    index = faiss.IndexFlatIP(array.shape[1])
    index.add(np.ascontiguousarray(array, dtype=np.float32))
    return index


def check_k(k, largest, what):
    """``k`` as an int in 1..``largest``; ValueError naming ``what`` and the largest valid value otherwise."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise ValueError(f"{what} must be an integer; got {k!r}")
    if k < 1 or k > largest:
        raise ValueError(f"{what}={k} is out of range: it must be >= 1 and the largest valid value is {largest}")
    return int(k)


def _is_faiss_index(gallery):
    faiss = _import_faiss()
    return faiss is not None and isinstance(gallery, faiss.Index)


def knn_search(queries, gallery, k, exclude_self=False, backend="auto", chunk_size=None):
    """The ``k`` most cosine-similar gallery items of every query, best first.

    queries: [Nq, D] tensor (any device, any float dtype) or array. gallery: [Ng, D] tensor or array, or a faiss
    index that already holds L2-normalised vectors (what ``GalleryIndex`` keeps); queries and array galleries are
    L2-normalised here. exclude_self: query i is gallery item i (Nq == Ng) and is left out of its own result BY
    INDEX, so an exact duplicate of the query is still found. backend: "auto" | "faiss" | "torch" (see
    ``search_backend``; "auto" searches a faiss index in faiss); chunk_size: queries per torch matmul (default:
    about 64 MiB of similarities).

    Returns (scores [Nq, k] float32, indices [Nq, k] int64) numpy arrays. Ties: each row is ordered by score, then
    by lower gallery index. The torch search also breaks ties at the k-th place by lower index; faiss may keep a
    different one of several exactly tied items there. An approximate faiss index (IVF, HNSW) may find fewer than
    k items for a query: the missing places hold index -1 and the lowest float32 score, last in the row.
    """
    if not _is_faiss_index(gallery):
        gallery = l2_normalized(gallery, "gallery")
    return search_unit_gallery(queries, gallery, k, exclude_self, backend, chunk_size)


def search_unit_gallery(queries, gallery, k, exclude_self=False, backend="auto", chunk_size=None):
    """``knn_search`` for a gallery that is already L2-normalised: a float32 [Ng, D] tensor (on any device) or a
    faiss index. It skips the gallery's normalisation and checks, which cost more than a small query's search."""
    query_vectors = l2_normalized(queries, "queries")
    if _is_faiss_index(gallery):
        gallery_size, gallery_dim = gallery.ntotal, gallery.d
        if backend == "auto":  # a faiss index is searched where it is: copying it out would cost more
            backend = "faiss"
    else:
        gallery_size, gallery_dim = gallery.shape
    if query_vectors.shape[1] != gallery_dim:
        raise ValueError(
            f"queries have {query_vectors.shape[1]} dimensions but the gallery has {gallery_dim}; "
            "embed both with the same model"
        )
    self_indices = None
    if exclude_self:
        if query_vectors.shape[0] != gallery_size:
            raise ValueError(
                f"exclude_self needs query i to be gallery item i, but there are {query_vectors.shape[0]} queries "
                f"and {gallery_size} gallery items; pass the same vectors as both"
            )
        self_indices = np.arange(gallery_size)
    largest = gallery_size - 1 if exclude_self else gallery_size
    if largest < 1:
        raise ValueError("exclude_self leaves no gallery item to find: pass at least two vectors")
    k = check_k(k, largest, "k")
    return search_normalized(query_vectors, gallery, k, self_indices, backend, chunk_size)


def search_normalized(queries, gallery, k, self_indices, backend, chunk_size):
    """kNN of normalised ``queries`` in ``gallery`` (normalised tensor or faiss index); k already checked.

    self_indices[i] is the gallery index of query i, which is left out of its result (None: nothing left out).
    """
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive integer or None; got {chunk_size!r}")
    gallery_is_tensor = isinstance(gallery, torch.Tensor)
    if search_backend(backend, queries.device) == "faiss":
        gallery_index = gallery if not gallery_is_tensor else flat_inner_product_index(gallery)
        return _faiss_search(gallery_index, queries.cpu().numpy(), k, self_indices)
    if not gallery_is_tensor:
        gallery = torch.from_numpy(gallery.reconstruct_n(0, gallery.ntotal))
    return _torch_search(queries, gallery.to(queries.device), k, self_indices, chunk_size)


def _faiss_search(index, queries, k, self_indices):
    # One extra neighbour makes room for the query itself, which is then dropped by index (not by score, so a
    # duplicate of the query scoring exactly like it stays in the result).
    fetch = k if self_indices is None else k + 1
    scores, indices = index.search(np.ascontiguousarray(queries), fetch)
    if self_indices is not None:
        keep = indices != self_indices[:, None]
        self_not_found = keep.all(axis=1)  # the query lost a tie at the last place: drop that place instead
        keep[self_not_found, -1] = False
        scores, indices = scores[keep].reshape(-1, k), indices[keep].reshape(-1, k)
    # faiss orders exact ties arbitrarily; settle them by lower index, as the torch search does. Rows are already
    # ordered by score, so only rows holding a tie need the sort.
    tied = np.flatnonzero((scores[:, 1:] == scores[:, :-1]).any(axis=1))
    if tied.size:
        order = np.lexsort((indices[tied], -scores[tied]), axis=1)
        scores[tied] = np.take_along_axis(scores[tied], order, axis=1)
        indices[tied] = np.take_along_axis(indices[tied], order, axis=1)
    return scores.astype(np.float32, copy=False), indices.astype(np.int64, copy=False)


def _torch_search(queries, gallery, k, self_indices, chunk_size):
    num_queries, gallery_size = queries.shape[0], gallery.shape[0]
    chunk_size = min(chunk_size or max(1, _CHUNK_ELEMENTS // gallery_size), num_queries)
    # One similarity block serves every chunk: a fresh block per chunk is fresh memory, which the system maps in
    # page by page on first write (about a tenth of the time of a 10,000-item search, measured).
    block = torch.empty(chunk_size, gallery_size, dtype=queries.dtype, device=queries.device)
    gallery_transposed = gallery.T  # a view: the matmul reads the gallery's rows as columns without a copy
    scores = torch.empty(num_queries, k, dtype=torch.float32)
    indices = torch.empty(num_queries, k, dtype=torch.int64)
    for start in range(0, num_queries, chunk_size):
        stop = min(start + chunk_size, num_queries)
        similarities = torch.mm(queries[start:stop], gallery_transposed, out=block[: stop - start])
        if self_indices is not None:
            rows = torch.arange(stop - start, device=similarities.device)
            own_columns = torch.as_tensor(self_indices[start:stop], device=similarities.device)
            similarities[rows, own_columns] = float("-inf")
        chunk_scores, chunk_indices = _top_k_lowest_index_first(similarities, k)
        scores[start:stop] = chunk_scores
        indices[start:stop] = chunk_indices
    return scores.numpy(), indices.numpy()


def _top_k_lowest_index_first(similarities, k):
    """Row-wise top-k of a [rows, Ng] matrix, ordered by score then lower column index (torch.topk alone keeps an
    unspecified one of several items tied at the k-th place)."""
    if k == similarities.shape[1]:  # every item is returned: only the order needs settling
        scores, indices = similarities.topk(k, dim=1)
        return _order_ties_by_index(scores, indices)
    # One place more than asked shows whether the k-th place is tied with an item left out.
    scores, indices = similarities.topk(k + 1, dim=1)
    tied_at_boundary = scores[:, k] == scores[:, k - 1]
    scores, indices = scores[:, :k], indices[:, :k]
    if tied_at_boundary.any():
        rows = tied_at_boundary.nonzero().squeeze(1)
        tied = similarities[rows]
        threshold = scores[rows, -1:]
        above = tied > threshold
        places_left = k - above.sum(dim=1, keepdim=True)
        at_threshold = tied == threshold
        chosen = above | (at_threshold & (at_threshold.cumsum(dim=1) <= places_left))
        columns = chosen.nonzero()[:, 1].view(len(rows), k)  # exactly k per row, in column order
        # A stable sort by score keeps column order among equal scores: these rows come out fully ordered.
        column_scores, by_score = tied.gather(1, columns).sort(dim=1, descending=True, stable=True)
        scores[rows] = column_scores
        indices[rows] = columns.gather(1, by_score)
    return _order_ties_by_index(scores, indices)


def _order_ties_by_index(scores, indices):
    """Rows already ordered by score (as topk returns them), with exactly tied scores put in lower-index order.

    Only rows holding a tie are sorted: with real embeddings that is a few rows, and sorting all is a second pass.
    """
    tied = (scores[:, 1:] == scores[:, :-1]).any(dim=1).nonzero().squeeze(1)
    if tied.numel():
        tied_indices, by_index = indices[tied].sort(dim=1)
        tied_scores, by_score = scores[tied].gather(1, by_index).sort(dim=1, descending=True, stable=True)
        scores[tied] = tied_scores
        indices[tied] = tied_indices.gather(1, by_score)
    return scores, indices
