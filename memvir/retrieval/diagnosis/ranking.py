"""Where each query's own class lands in its ranking of a labelled gallery: its AP@R and R-Precision, the rank of the
first correct item, its nearest items marked right or wrong, and the nearest same-class items it missed.

What the app shows to explain a checkpoint's retrieval (one query side by side for two checkpoints, the hardest queries
of a gallery: memvir.retrieval.diagnosis.failures, the per-class table: memvir.retrieval.diagnosis.per_class). The
figures are those of docs/method.md, "Evaluation", query by query: for the gallery's own items (`rank_gallery`) they
equal `memvir.retrieval.metrics.per_query_metrics` from the torch search (memvir.retrieval.knn). faiss may keep
another of several items tied at the last place it returns; the metrics take its answer as it is, while the rankings
search such a row again in torch, so that every tie is settled by lower index.

Ranks count from 1 over the gallery with the query's excluded item (itself) left out, ordered by cosine similarity,
ties by lower gallery index. The nearest neighbours come from the kNN search; a rank beyond them (a first correct item
far down, a missed item) is counted exactly: one plus the items ranked ahead of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from memvir.retrieval.knn import check_k, l2_normalized, search_normalized

# Neighbours fetched beyond max(k, R): most missed same-class items are found among them, so their ranks need no
# count over the whole gallery.
_EXTRA_NEIGHBOURS = 16
# Similarities compared at once while counting the ranks of items beyond the fetched neighbours.
_COUNT_BLOCK_ELEMENTS = 2**23


@dataclass(frozen=True)
class QueryRankings:
    """Each query's ranking of a gallery, as numpy arrays with one row per query (Q rows).

    query: the query's item index in the gallery (`rank_gallery`) or its row in the queries given (`rank_queries`).
    label: its label as given. same_class: R, the gallery items of its class (its excluded item left out).
    neighbours / scores / correct: [Q, F] its nearest gallery items (F >= max(k, R)), nearest first, their cosine
    similarity and whether each is of its class. first_correct_rank: rank of its nearest same-class item (0 when R is
    0). average_precision: AP@R; r_precision: correct among the first R / R (NaN when R is 0).
    missed / missed_scores / missed_ranks: [Q, m] its nearest same-class items ranked after k, nearest first (-1, NaN
    and 0 where it has fewer). k: the top-k the missed items are counted from.
    """

    query: np.ndarray
    label: np.ndarray
    same_class: np.ndarray
    neighbours: np.ndarray
    scores: np.ndarray
    correct: np.ndarray
    first_correct_rank: np.ndarray
    average_precision: np.ndarray
    r_precision: np.ndarray
    missed: np.ndarray
    missed_scores: np.ndarray
    missed_ranks: np.ndarray
    k: int

    def __len__(self) -> int:
        return len(self.query)

    def row(self, position: int) -> dict:
        """Query `position`'s figures as plain Python values (its top-k only, and the missed items it has)."""
        found = self.missed[position] >= 0
        return {
            "query": int(self.query[position]),
            "label": self.label[position].item(),  # a numpy scalar as the plain int or str it holds
            "same_class": int(self.same_class[position]),
            "neighbours": self.neighbours[position, : self.k].tolist(),
            "scores": self.scores[position, : self.k].tolist(),
            "correct": self.correct[position, : self.k].tolist(),
            "first_correct_rank": int(self.first_correct_rank[position]),
            "average_precision": float(self.average_precision[position]),
            "r_precision": float(self.r_precision[position]),
            "missed": self.missed[position, found].tolist(),
            "missed_scores": self.missed_scores[position, found].tolist(),
            "missed_ranks": self.missed_ranks[position, found].tolist(),
        }


def rank_gallery(embeddings, labels, k: int = 8, missed: int = 4, *, backend="auto") -> QueryRankings:
    """Every item of a labelled gallery querying all the others (itself excluded by index), as the metrics do.

    embeddings: [N, D] tensor or array; labels: [N] any hashable values. Items whose class has no other member are no
    queries (as in `retrieval_metrics`), so `query` holds the others' indices in ascending order. k: the top-k that
    the missed same-class items are counted from; missed: how many of them to keep. Raises ValueError as the metrics
    do (bad shapes, NaN rows, no class with two members) and for k outside 1..N-1.
    """
    vectors = l2_normalized(embeddings, "embeddings")
    codes, _ = _label_codes(labels, vectors.shape[0], "labels")
    same_class_others = np.bincount(codes)[codes] - 1
    query_indices = np.flatnonzero(same_class_others > 0)
    if query_indices.size == 0:
        raise ValueError(f"no class has at least two members among the {len(codes)} items, so no item has a "
                         "same-class item to find; pass several items per class")
    queries = vectors[torch.as_tensor(query_indices, device=vectors.device)]
    rankings = _rank(queries, vectors, codes, codes[query_indices], query_indices, k, missed, backend)
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    return _with(rankings, query=query_indices, label=array[query_indices])


def rank_queries(queries, gallery, gallery_labels, query_labels, k: int = 8, missed: int = 4, *, exclude=None,
                 backend="auto") -> QueryRankings:
    """Queries from outside a labelled gallery (an uploaded image, a drawing), each with a known class.

    queries: [Q, D]; gallery: [N, D] (tensors or arrays, normalised here); gallery_labels: [N]; query_labels: [Q] in
    the gallery's label values (a class the gallery lacks gives R = 0: no rank, AP@R NaN). exclude: None, or a gallery
    index per query to leave out of its ranking (-1 for none; e.g. the gallery item clicked as the query). k, missed:
    as `rank_gallery`. Raises ValueError for bad shapes, NaN rows, mismatched lengths or k outside 1..N (N-1 with an
    exclusion).
    """
    query_vectors = l2_normalized(queries, "queries")
    gallery_vectors = l2_normalized(gallery, "gallery").to(query_vectors.device)
    if query_vectors.shape[1] != gallery_vectors.shape[1]:
        raise ValueError(f"queries have {query_vectors.shape[1]} dimensions but the gallery has "
                         f"{gallery_vectors.shape[1]}; embed both with the same model")
    size = gallery_vectors.shape[0]
    gallery_array = _labels_array(gallery_labels, size, "gallery_labels")
    query_array = _labels_array(query_labels, query_vectors.shape[0], "query_labels")
    codes, classes = _label_codes(gallery_array, size, "gallery_labels")
    position = np.searchsorted(classes, query_array)
    known = (position < len(classes)) & (classes[np.minimum(position, len(classes) - 1)] == query_array)
    query_codes = np.where(known, np.minimum(position, len(classes) - 1), -1).astype(np.int64)
    excluded = None
    if exclude is not None:
        excluded = np.asarray(exclude, dtype=np.int64).reshape(-1)
        if excluded.shape[0] != query_vectors.shape[0]:
            raise ValueError(f"exclude must give one gallery index (or -1) per query ({query_vectors.shape[0]}); "
                             f"got {excluded.shape[0]}")
        if ((excluded < -1) | (excluded >= size)).any():
            raise ValueError(f"exclude holds an index outside the gallery's 0..{size - 1} (or -1 for none)")
        if (excluded < 0).all():
            excluded = None
    rankings = _rank(query_vectors, gallery_vectors, codes, query_codes, excluded, k, missed, backend)
    return _with(rankings, query=np.arange(query_vectors.shape[0]), label=query_array)


def _labels_array(labels, size, name):
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if array.ndim != 1 or array.shape[0] != size:
        raise ValueError(f"{name} must be 1-D with one label per row ({size}); got shape {array.shape}")
    return array


def _label_codes(labels, size, name):
    """(int64 codes 0..C-1 of `labels`, the sorted distinct labels)."""
    classes, codes = np.unique(_labels_array(labels, size, name), return_inverse=True)
    return codes.astype(np.int64), classes


def _with(rankings: QueryRankings, **fields) -> QueryRankings:
    return QueryRankings(**{**rankings.__dict__, **fields})


def _rank(queries, gallery, codes, query_codes, excluded, k, missed, backend) -> QueryRankings:
    """The rankings of normalised `queries` in normalised `gallery`; `excluded[i]`: gallery index left out of query
    i's ranking (-1 or None: none)."""
    size = gallery.shape[0]
    num_queries = queries.shape[0]
    exclusions = np.full(num_queries, -1, dtype=np.int64) if excluded is None else excluded
    has_exclusion = exclusions >= 0
    k = check_k(k, size - 1 if has_exclusion.any() else size, "k")
    if isinstance(missed, bool) or not isinstance(missed, int | np.integer) or missed < 0:
        raise ValueError(f"missed must be a whole number >= 0; got {missed!r}")
    class_sizes = np.bincount(codes, minlength=int(codes.max()) + 1)
    known = query_codes >= 0
    same_class = np.where(known, class_sizes[np.maximum(query_codes, 0)], 0)
    same_class = same_class - (has_exclusion & known & (codes[np.maximum(exclusions, 0)] == query_codes))
    largest = size - 1 if has_exclusion.any() else size
    fetched = min(largest, max(k, int(same_class.max(initial=0))) + _EXTRA_NEIGHBOURS)

    scores, neighbours = _search(queries, gallery, fetched, excluded, exclusions, backend)
    # faiss may keep any of several items tied at the last place fetched, so only places above the last score are
    # certain; where that tie reaches into the top max(k, R), the row is searched again by the torch search, whose
    # ties are settled by lower index throughout (memvir.retrieval.knn).
    placed = (scores > scores[:, -1:]) | (fetched == largest)
    used = np.minimum(np.maximum(k, same_class), fetched) - 1
    uncertain = np.flatnonzero(~placed[np.arange(num_queries), used])
    if uncertain.size:
        rows = torch.as_tensor(uncertain, device=queries.device)
        again = None if excluded is None else exclusions[uncertain]
        scores[uncertain], neighbours[uncertain] = _search(queries[rows], gallery, fetched, again, again, "torch")
        placed[uncertain] = True
    correct = codes[neighbours] == query_codes[:, None]
    ranks = np.arange(1, fetched + 1)

    # AP@R and R-Precision over the first R neighbours (fetched >= R), as memvir.retrieval.metrics computes them.
    within_r = correct & (ranks <= same_class[:, None])
    with np.errstate(invalid="ignore", divide="ignore"):
        r_precision = within_r.sum(axis=1) / same_class
        average_precision = (np.cumsum(correct, axis=1) / ranks * within_r).sum(axis=1) / same_class
    r_precision[same_class == 0] = np.nan
    average_precision[same_class == 0] = np.nan

    # Same-class items among the fetched neighbours have their ranks already; the rest are counted.
    found = correct & placed
    first_correct = np.where(found.any(axis=1), found.argmax(axis=1) + 1, 0)
    missed_items = np.full((num_queries, missed), -1, dtype=np.int64)
    missed_scores = np.full((num_queries, missed), np.nan, dtype=np.float32)
    missed_ranks = np.zeros((num_queries, missed), dtype=np.int64)
    beyond_k = found & (ranks > k)
    for row in range(num_queries):
        places = np.flatnonzero(beyond_k[row])[:missed]
        missed_items[row, : len(places)] = neighbours[row, places]
        missed_scores[row, : len(places)] = scores[row, places]
        missed_ranks[row, : len(places)] = places + 1
    correct_in_top_k = correct[:, :k].sum(axis=1)
    wanted_missed = np.minimum(missed, same_class - correct_in_top_k)
    found_missed = (missed_items >= 0).sum(axis=1)
    needs_count = np.flatnonzero((same_class > 0) & ((first_correct == 0) | (found_missed < wanted_missed)))
    if needs_count.size:
        _count_far_ranks(queries, gallery, codes, query_codes, exclusions, np.where(placed, neighbours, -2),
                         needs_count, first_correct,
                         missed_items, missed_scores, missed_ranks, found_missed, wanted_missed)
    return QueryRankings(query=np.arange(num_queries), label=query_codes, same_class=same_class,
                         neighbours=neighbours, scores=scores, correct=correct, first_correct_rank=first_correct,
                         average_precision=average_precision, r_precision=r_precision, missed=missed_items,
                         missed_scores=missed_scores, missed_ranks=missed_ranks, k=k)


def _search(queries, gallery, fetched, excluded, exclusions, backend):
    """(scores, neighbours) [Q, fetched] of memvir.retrieval.knn's search; `excluded`: None, or every query's gallery
    index to leave out (`exclusions`: the same with -1 where a query leaves none out)."""
    num_queries, size = queries.shape[0], gallery.shape[0]
    if excluded is None or (exclusions >= 0).all():
        return search_normalized(queries, gallery, fetched, excluded, backend, None)
    # Some queries leave an item out, some none: search one more and drop the excluded item (or the last place).
    scores, neighbours = search_normalized(queries, gallery, min(fetched + 1, size), None, backend, None)
    keep = neighbours != exclusions[:, None]
    keep[keep.all(axis=1), -1] = False
    scores, neighbours = scores[keep].reshape(num_queries, -1), neighbours[keep].reshape(num_queries, -1)
    return scores[:, :fetched], neighbours[:, :fetched]


def _count_far_ranks(queries, gallery, codes, query_codes, exclusions, neighbours, rows, first_correct,
                     missed_items, missed_scores, missed_ranks, found_missed, wanted_missed):
    """Fill in, for `rows`, the first correct rank and the missed items that lie beyond the fetched neighbours.

    The same-class items not fetched are ordered by similarity (ties: lower index; a stable sort of the class's items
    in index order), and each one's rank is one plus the gallery items ranked ahead of it: higher similarity, or
    equal similarity and a lower index.
    """
    device = gallery.device
    size = gallery.shape[0]
    class_sizes = np.bincount(codes)
    # Each class's items in index order, padded with -1: row c of `members` lists class c.
    order = np.argsort(codes, kind="stable")
    starts = np.concatenate([[0], np.cumsum(class_sizes)[:-1]])
    members = np.full((len(class_sizes), int(class_sizes.max())), -1, dtype=np.int64)
    members[codes[order], np.arange(size) - starts[codes[order]]] = order
    needed_missed = (wanted_missed - found_missed)[rows]
    needed = np.maximum(needed_missed, (first_correct[rows] == 0).astype(np.int64))
    most = int(needed.max())
    block = max(1, _COUNT_BLOCK_ELEMENTS // (size * max(1, most)))
    for start in range(0, len(rows), block):
        chunk = rows[start:start + block]
        similarities = queries[torch.as_tensor(chunk, device=queries.device)] @ gallery.T
        chunk_rows = torch.arange(len(chunk), device=device)
        excluded = torch.as_tensor(exclusions[chunk], device=device)
        has_exclusion = excluded >= 0
        similarities[chunk_rows[has_exclusion], excluded[has_exclusion]] = float("-inf")
        candidates = members[query_codes[chunk]]  # [rows, largest class]
        unusable = (candidates < 0) | (candidates == exclusions[chunk, None])
        unusable |= (candidates[:, :, None] == neighbours[chunk, None, :]).any(axis=2)
        candidate_columns = torch.as_tensor(np.maximum(candidates, 0), device=device)
        candidate_scores = similarities.gather(1, candidate_columns)
        candidate_scores[torch.as_tensor(unusable, device=device)] = float("-inf")
        take = min(most, candidates.shape[1])
        chosen_scores, by_score = candidate_scores.sort(dim=1, descending=True, stable=True)
        chosen_scores, by_score = chosen_scores[:, :take], by_score[:, :take]
        chosen = candidate_columns.gather(1, by_score)
        # Items ahead of each chosen one: higher similarity, or equal and a lower index (ties are rare: counted only
        # in the rows that have one besides the item itself).
        # Counts are summed as float32 (exact below 2**24 items), several times faster than summing booleans.
        above = (similarities[:, None, :] > chosen_scores[:, :, None]).to(torch.float32).sum(dim=2)
        level = (similarities[:, None, :] >= chosen_scores[:, :, None]).to(torch.float32).sum(dim=2) - above
        ranks = above.to(torch.int64) + 1
        tied = (level > 1).any(dim=1).nonzero().squeeze(1)
        if tied.numel():
            columns = torch.arange(size, device=device)
            equal = similarities[tied, None, :] == chosen_scores[tied, :, None]
            ranks[tied] += (equal & (columns[None, None, :] < chosen[tied, :, None])).sum(dim=2)
        ranks, chosen, chosen_scores = ranks.cpu().numpy(), chosen.cpu().numpy(), chosen_scores.cpu().numpy()
        for offset, row in enumerate(chunk):
            usable = int(np.isfinite(chosen_scores[offset]).sum())
            if first_correct[row] == 0 and usable:
                first_correct[row] = ranks[offset, 0]
            place = int(found_missed[row])
            count = max(0, min(int(needed_missed[start + offset]), usable, missed_items.shape[1] - place))
            missed_items[row, place:place + count] = chosen[offset, :count]
            missed_scores[row, place:place + count] = chosen_scores[offset, :count]
            missed_ranks[row, place:place + count] = ranks[offset, :count]
