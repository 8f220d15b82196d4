"""Where a checkpoint fails: the hardest queries of a gallery, and the queries where two checkpoints differ most.

Both read the rankings of the gallery's own items (memvir.retrieval.diagnosis.ranking.rank_gallery): a query is hard
when its AP@R is low (docs/method.md, "Evaluation": how much of its own class it finds, and how early), or when its
first correct item comes late. Comparing two checkpoints needs the rankings of the same gallery items with the same
labels.
"""

from __future__ import annotations

import numpy as np

from memvir.retrieval.diagnosis.ranking import QueryRankings

ORDERS = ("map@r", "first_correct_rank")


def _check_count(count):
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 1:
        raise ValueError(f"count must be a whole number of at least 1; got {count!r}")
    return int(count)


def hardest_queries(rankings: QueryRankings, by: str = "map@r", count: int = 10) -> np.ndarray:
    """Positions (rows of `rankings`) of the `count` worst queries, worst first.

    by="map@r": lowest AP@R first, then the later first correct rank, then the lower item index. by=
    "first_correct_rank": latest first correct item first, then the lower AP@R, then the lower item index. Queries
    without a same-class item (R = 0) are never among them.
    """
    if by not in ORDERS:
        raise ValueError(f"by must be one of {ORDERS}; got {by!r}")
    count = _check_count(count)
    eligible = np.flatnonzero(rankings.same_class > 0)
    average_precision = rankings.average_precision[eligible]
    first_correct = rankings.first_correct_rank[eligible]
    items = rankings.query[eligible]
    keys = (items, -first_correct, average_precision) if by == "map@r" else (items, average_precision, -first_correct)
    return eligible[np.lexsort(keys)[:count]]


def largest_differences(first: QueryRankings, second: QueryRankings, count: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """(where `first` does better, where `second` does better): positions of the `count` queries whose AP@R differs
    most each way, largest difference first (ties: lower item index); a query both rank equally is in neither.

    The rankings must be of the same gallery's items (same query items, same labels): ValueError otherwise.
    """
    count = _check_count(count)
    if not (np.array_equal(first.query, second.query) and np.array_equal(first.label, second.label)):
        raise ValueError("the two rankings are not of the same gallery items with the same labels; rank the same "
                         "gallery with both checkpoints")
    difference = first.average_precision - second.average_precision
    eligible = np.flatnonzero(first.same_class > 0)

    def most(sign):
        gains = sign * difference[eligible]
        better = eligible[gains > 0]
        order = np.lexsort((first.query[better], -(sign * difference[better])))
        return better[order[:count]]

    return most(1.0), most(-1.0)
