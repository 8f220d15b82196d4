"""The Retrieve tab.

- `tab`: checkpoint, gallery, query and download controls and their handlers.
- `service`: `RetrievalService`: checkpoints, cached indexes, queries. `galleries`: what can be searched.
- `side_by_side`, `hardest`, `per_class_table`: the views that show where a checkpoint fails (one query for two
  checkpoints, the hardest queries, metrics per class), laid out from memvir.retrieval's rankings. `threshold`: the
  similarities of same-class and other-class pairs, the threshold at a chosen false match rate, a cut-off.
- `index_builds`: gallery index builds in flight, with their progress. `tiles`: results as tiles.
- `downloads`: the downloads folder: a checkpoint as a zip, a gallery's embeddings as a projector bundle and .npz.
"""
