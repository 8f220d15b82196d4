"""The Retrieve tab: it caches and draws; what a query, an index or a diagnosis is, is memvir.retrieval's.

- `tab`: checkpoint, gallery, query and download controls, their handlers (one search and one side-by-side
  comparison, fed by one query-source helper) and the layout.
- `service`: `RetrievalService`, the tab's one object, made of the parts below, with a thin search that returns the
  hits and the query as the model saw it.
- `checkpoints`: which checkpoints to offer and to start on, each loaded once (`Catalogue`).
- `galleries`: what can be searched (a test split, an upload; `Galleries`), its classes as a visitor names them.
- `index_builds`: each gallery's index, built once with its progress and kept, and the figures the views read of it
  (`IndexCache`, `IndexBuilds`); on disk beside the app's own runs, else in the app's gallery cache (a bundled
  checkpoint's or a Hub snapshot's folder is only read).
- `side_by_side`, `hardest`, `per_class_table`: the views that show where a checkpoint fails (one query for two
  checkpoints, the hardest queries, metrics per class), laid out from memvir.retrieval.diagnosis's rankings.
  `threshold`: the similarities of same-class and other-class pairs, the threshold at a chosen false match rate, a
  cut-off. `tiles`: results as tiles.
- `downloads`: the downloads folder: a checkpoint as a zip, a gallery's embeddings as a projector bundle and .npz.
"""
