"""Diagnosis: what a checkpoint gets wrong on a labelled gallery, query by query, class by class and pair by pair.

- `ranking`: where each query's own class lands in its ranking of a labelled gallery (`rank_gallery`,
  `rank_queries`, both giving `QueryRankings`): AP@R, first correct rank, neighbours marked, the nearest same-class
  items it missed.
- `failures`: the hardest queries of a gallery, and where two checkpoints differ most (`hardest_queries`,
  `largest_differences`).
- `per_class`: Recall@1, R-Precision and MAP@R class by class, two checkpoints' difference, the most-confused pairs
  (`per_class_metrics` giving `PerClass`, `per_class_difference`, `confused_class_pairs` giving `ClassConfusion`).
- `verification`: same-class and other-class pair cosines of a gallery, the threshold at a chosen false match rate
  and the false non-match rate there (`pair_similarities` giving `PairSimilarities`, its `OperatingPoint`).

`from memvir.retrieval.diagnosis import rank_gallery` (or `from memvir.retrieval import rank_gallery`), and so for
each name given with its part above: resolved on first use.
"""

from memvir._lazy import lazy_exports

_EXPORTS = {
    "QueryRankings": "memvir.retrieval.diagnosis.ranking",
    "rank_gallery": "memvir.retrieval.diagnosis.ranking",
    "rank_queries": "memvir.retrieval.diagnosis.ranking",
    "hardest_queries": "memvir.retrieval.diagnosis.failures",
    "largest_differences": "memvir.retrieval.diagnosis.failures",
    "ClassConfusion": "memvir.retrieval.diagnosis.per_class",
    "PerClass": "memvir.retrieval.diagnosis.per_class",
    "confused_class_pairs": "memvir.retrieval.diagnosis.per_class",
    "per_class_difference": "memvir.retrieval.diagnosis.per_class",
    "per_class_metrics": "memvir.retrieval.diagnosis.per_class",
    "OperatingPoint": "memvir.retrieval.diagnosis.verification",
    "PairSimilarities": "memvir.retrieval.diagnosis.verification",
    "pair_similarities": "memvir.retrieval.diagnosis.verification",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
