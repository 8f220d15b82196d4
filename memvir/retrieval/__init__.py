"""Retrieval: search, metrics, and the one evaluation path the CLI, the Trainer and the app share.

- `knn`: exact cosine k-nearest-neighbour search (faiss or chunked torch), the one search behind everything here.
- `metrics`: Recall@K, P@1, R-Precision, MAP@R, NMI (`retrieval_metrics`), and each query's own (`per_query_metrics`).
- `ranking`: where each query's own class lands in its ranking of a labelled gallery (`rank_gallery`,
  `rank_queries`): AP@R, first correct rank, neighbours marked, the nearest same-class items it missed.
- `failures`: the hardest queries of a gallery, and where two checkpoints differ most (`hardest_queries`,
  `largest_differences`).
- `per_class`: Recall@1, R-Precision and MAP@R class by class, two checkpoints' difference, the most-confused pairs.
- `verification`: same-class and other-class pair cosines of a gallery, the threshold at a chosen false match rate
  and the false non-match rate there (`pair_similarities`).
- `export`: a gallery's embeddings, labels and thumbnails for other tools: a TensorBoard projector bundle and `.npz`.
- `index`: `GalleryIndex`, a gallery's embeddings searchable exactly, by IVF or HNSW, saved and loaded.
- `evaluation`: (model, dataset) to embeddings, metrics and a gallery index.
- `shipped_gallery`: a checkpoint's own test-split index and its views' figures (rankings, pair cosines), used only
  while their stamps match.
"""
