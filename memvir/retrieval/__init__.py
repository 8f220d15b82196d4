"""Retrieval: search, metrics, and the one evaluation path the CLI, the Trainer and the app share.

- `knn`: exact cosine k-nearest-neighbour search (faiss or chunked torch), the one search behind everything here
  (`knn_search`; `search_backend`, the one it uses on a device).
- `metrics`: Recall@K, P@1, R-Precision, MAP@R, NMI (`retrieval_metrics`, `normalized_mutual_info`), and each
  query's own (`per_query_metrics`).
- `ranking`: where each query's own class lands in its ranking of a labelled gallery (`rank_gallery`,
  `rank_queries`, both giving `QueryRankings`): AP@R, first correct rank, neighbours marked, the nearest same-class
  items it missed.
- `failures`: the hardest queries of a gallery, and where two checkpoints differ most (`hardest_queries`,
  `largest_differences`).
- `per_class`: Recall@1, R-Precision and MAP@R class by class, two checkpoints' difference, the most-confused pairs
  (`per_class_metrics` giving `PerClass`, `per_class_difference`, `confused_class_pairs` giving `ClassConfusion`).
- `verification`: same-class and other-class pair cosines of a gallery, the threshold at a chosen false match rate
  and the false non-match rate there (`pair_similarities` giving `PairSimilarities`, its `OperatingPoint`).
- `export`: a gallery's embeddings, labels and thumbnails for other tools: a TensorBoard projector bundle and `.npz`
  (`write_projector_zip`, `write_npz`).
- `index`: `GalleryIndex`, a gallery's embeddings searchable exactly, by IVF or HNSW, saved and loaded; `SearchHit`,
  one result.
- `evaluation`: (model, dataset) to embeddings, metrics and a gallery index; used by its name
  (`evaluation.embed`, `evaluation.score`, `evaluation.build_index`).
- `shipped_gallery`: a checkpoint's own test-split index and its views' figures (rankings, pair cosines), used only
  while their stamps match; used by its name too (`shipped_gallery.load`, `shipped_gallery.build_views`).

`from memvir.retrieval import GalleryIndex`, and so for each name given with its part above: resolved on first use,
so `import memvir.retrieval` imports none of the parts (and faiss comes only with a search that uses it).
"""

from memvir._lazy import lazy_exports

_EXPORTS = {
    "knn_search": "memvir.retrieval.knn",
    "search_backend": "memvir.retrieval.knn",
    "normalized_mutual_info": "memvir.retrieval.metrics",
    "per_query_metrics": "memvir.retrieval.metrics",
    "retrieval_metrics": "memvir.retrieval.metrics",
    "QueryRankings": "memvir.retrieval.ranking",
    "rank_gallery": "memvir.retrieval.ranking",
    "rank_queries": "memvir.retrieval.ranking",
    "hardest_queries": "memvir.retrieval.failures",
    "largest_differences": "memvir.retrieval.failures",
    "ClassConfusion": "memvir.retrieval.per_class",
    "PerClass": "memvir.retrieval.per_class",
    "confused_class_pairs": "memvir.retrieval.per_class",
    "per_class_difference": "memvir.retrieval.per_class",
    "per_class_metrics": "memvir.retrieval.per_class",
    "OperatingPoint": "memvir.retrieval.verification",
    "PairSimilarities": "memvir.retrieval.verification",
    "pair_similarities": "memvir.retrieval.verification",
    "write_npz": "memvir.retrieval.export",
    "write_projector_zip": "memvir.retrieval.export",
    "GalleryIndex": "memvir.retrieval.index",
    "SearchHit": "memvir.retrieval.index",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
