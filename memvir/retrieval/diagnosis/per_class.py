"""Retrieval metrics class by class, two checkpoints' difference, and the classes most confused with one another.

Each class's Recall@1, R-Precision and MAP@R are the means over its queries of what docs/method.md, "Evaluation"
defines per query (memvir.retrieval.diagnosis.ranking gives them), so the mean of a column over all queries (each class
weighted by its queries) is `retrieval_metrics`' value (its torch search's, which settles ties as the rankings do). A
confusion is a neighbour of another class among a query's first R: what R-Precision counts against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memvir.retrieval.diagnosis.ranking import QueryRankings

METRICS = ("recall@1", "r_precision", "map@r")


@dataclass(frozen=True)
class PerClass:
    """One row per class that has queries, in the order of its label: `classes` (labels as given), `queries` (how
    many of its items query), and each metric of METRICS as a float64 array in `values`."""

    classes: np.ndarray
    queries: np.ndarray
    values: dict[str, np.ndarray]

    def overall(self) -> dict[str, float]:
        """Each metric's mean over all queries: what `retrieval_metrics` reports for the same items."""
        return {name: float((column * self.queries).sum() / self.queries.sum()) for name, column in self.values.items()}


@dataclass(frozen=True)
class ClassConfusion:
    """Two classes confused: `count` neighbours among the first R of one's queries that belong to the other (both
    ways together), and `rate`, that count over the first-R places of both classes' queries."""

    first: object
    second: object
    count: int
    rate: float


def per_class_metrics(rankings: QueryRankings) -> PerClass:
    """Recall@1, R-Precision and MAP@R of each class, from its queries' rankings (queries with R = 0 left out)."""
    eligible = rankings.same_class > 0
    if not eligible.any():
        raise ValueError("no query has a same-class item in the gallery, so no class has a metric")
    labels = rankings.label[eligible]
    classes, codes = np.unique(labels, return_inverse=True)
    queries = np.bincount(codes, minlength=len(classes))
    per_query = {"recall@1": (rankings.first_correct_rank[eligible] == 1).astype(np.float64),
                 "r_precision": rankings.r_precision[eligible], "map@r": rankings.average_precision[eligible]}
    values = {name: np.bincount(codes, weights=column, minlength=len(classes)) / queries
              for name, column in per_query.items()}
    return PerClass(classes=classes, queries=queries, values=values)


def per_class_difference(first: PerClass, second: PerClass) -> dict[str, np.ndarray]:
    """second minus first, metric by metric, class by class (rows as `first`'s). The two must hold the same classes
    with the same numbers of queries (the same gallery ranked by two checkpoints): ValueError otherwise."""
    if not (np.array_equal(first.classes, second.classes) and np.array_equal(first.queries, second.queries)):
        raise ValueError("the two tables are not of the same classes and queries; rank the same gallery with both "
                         "checkpoints")
    return {name: second.values[name] - first.values[name] for name in METRICS}


def confused_class_pairs(rankings: QueryRankings, gallery_labels, count: int = 10) -> list[ClassConfusion]:
    """The `count` pairs of classes with the most confusions, most first (ties: the higher rate, then the lower pair
    of labels). gallery_labels: [N] the label of each gallery item the rankings' neighbours index."""
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 1:
        raise ValueError(f"count must be a whole number of at least 1; got {count!r}")
    gallery_labels = np.asarray(gallery_labels)
    if gallery_labels.ndim != 1 or gallery_labels.shape[0] <= rankings.neighbours.max(initial=-1):
        raise ValueError(f"gallery_labels must be 1-D with a label for every gallery item; got shape "
                         f"{gallery_labels.shape}")
    eligible = np.flatnonzero(rankings.same_class > 0)
    if eligible.size == 0:
        return []
    same_class = rankings.same_class[eligible]
    neighbours = rankings.neighbours[eligible]
    ranks = np.arange(1, neighbours.shape[1] + 1)
    wrong = ~rankings.correct[eligible] & (ranks <= same_class[:, None])
    own_labels = rankings.label[eligible]
    query_labels = np.broadcast_to(own_labels[:, None], neighbours.shape)[wrong]
    neighbour_labels = gallery_labels[neighbours[wrong]]
    classes, codes = np.unique(np.concatenate([own_labels, query_labels, neighbour_labels]), return_inverse=True)
    own = codes[: own_labels.size]
    query_codes = codes[own_labels.size: own_labels.size + query_labels.size]
    neighbour_codes = codes[own_labels.size + query_labels.size:]
    low, high = np.minimum(query_codes, neighbour_codes), np.maximum(query_codes, neighbour_codes)
    pairs, pair_counts = np.unique(low * len(classes) + high, return_counts=True)
    places = np.bincount(own, weights=same_class, minlength=len(classes))
    first, second = pairs // len(classes), pairs % len(classes)
    rates = pair_counts / (places[first] + places[second])
    order = np.lexsort((pairs, -rates, -pair_counts))[:count]
    return [ClassConfusion(classes[first[i]].item(), classes[second[i]].item(), int(pair_counts[i]), float(rates[i]))
            for i in order]
