"""Retrieval: search, metrics, and the one evaluation path the CLI, the Trainer and the app share.

- `knn`: exact cosine k-nearest-neighbour search (faiss or chunked torch), the one search behind everything here
  (`knn_search`; `search_backend`, the one it uses on a device).
- `metrics`: Recall@K, P@1, R-Precision, MAP@R, NMI (`retrieval_metrics`, `normalized_mutual_info`), and each
  query's own (`per_query_metrics`).
- `diagnosis`: what a checkpoint gets wrong on a labelled gallery: each query's ranking (`rank_gallery`,
  `rank_queries`, `QueryRankings`), the hardest queries and where two checkpoints differ (`hardest_queries`,
  `largest_differences`), metrics per class (`per_class_metrics`, `PerClass`, `per_class_difference`,
  `confused_class_pairs`, `ClassConfusion`), pair cosines and thresholds (`pair_similarities`, `PairSimilarities`,
  `OperatingPoint`); a package of its own, whose names this face exports too.
- `export`: a gallery's embeddings, labels and thumbnails for other tools: a TensorBoard projector bundle and `.npz`
  (`write_projector_zip`, `write_npz`).
- `index`: `GalleryIndex`, a gallery's embeddings searchable exactly, by IVF or HNSW, saved and loaded; `SearchHit`,
  one result.
- `query`: searching with images: a query prepared from the model's config, an upload or a drawing
  (`prepare_query`), a set of images embedded and indexed as queries are (`embed_images`, `index_images`, a
  folder's `index_folder`), one search giving its hits and the query as the model saw it (`search_image`, giving
  `QueryResult`); `open_image`, a file's image or a ValueError naming it.
- `evaluation`: (model, dataset) to embeddings, metrics and a gallery index; used by its name
  (`evaluation.embed`, `evaluation.score`, `evaluation.build_index`).
- `shipped_gallery`: a checkpoint's own test-split index and its views' figures (rankings, pair cosines), used only
  while their stamps match; used by its name too (`shipped_gallery.load`, `shipped_gallery.build_views`).

`from memvir.retrieval import GalleryIndex`, and so for each name given with its part above: resolved on first use,
so `import memvir.retrieval` imports none of the parts (and faiss comes only with a search that uses it).
"""

from memvir._lazy import lazy_exports
from memvir.retrieval.diagnosis import _EXPORTS as DIAGNOSIS_EXPORTS

_EXPORTS = {
    "knn_search": "memvir.retrieval.knn",
    "search_backend": "memvir.retrieval.knn",
    "normalized_mutual_info": "memvir.retrieval.metrics",
    "per_query_metrics": "memvir.retrieval.metrics",
    "retrieval_metrics": "memvir.retrieval.metrics",
    **DIAGNOSIS_EXPORTS,  # the diagnosis package's names, from its own face
    "write_npz": "memvir.retrieval.export",
    "write_projector_zip": "memvir.retrieval.export",
    "GalleryIndex": "memvir.retrieval.index",
    "QueryResult": "memvir.retrieval.query",
    "embed_images": "memvir.retrieval.query",
    "index_folder": "memvir.retrieval.query",
    "index_images": "memvir.retrieval.query",
    "open_image": "memvir.retrieval.query",
    "prepare_query": "memvir.retrieval.query",
    "search_image": "memvir.retrieval.query",
    "SearchHit": "memvir.retrieval.index",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
