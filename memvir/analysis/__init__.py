"""What the paper's figures measure (docs/method.md, "What the app shows"), computed from a run's tensors.

- `spread`: how far the virtual classes have drifted from the live ones; how the real classes use the sphere
  (`virtual_spread`, `class_weight_spread`).
- `snapshots`: what an embedding snapshot holds besides the step's rows: the probe set and the few-class view
  (`SnapshotMaker`).
- `projection`: a snapshot to 2-D points (PCA, UMAP), aligned from one snapshot to the next (`project_snapshot`
  giving `ProjectedSnapshot`; for the few-class view `few_class_points` giving `FewClassPoints`, and
  `project_few_classes` giving `FewClassProjection`; `umap_layout`, which the app runs off its own thread).
- `drift_frame`: a class's stored weights in a frame of their own around its live weight, at their true angle
  (`drift_offsets`).

`from memvir.analysis import project_snapshot`, and so for each name given with its part above: resolved on first
use, so `import memvir.analysis` imports none of the parts (and umap comes only with a UMAP projection).
"""

from memvir._lazy import lazy_exports

_EXPORTS = {
    "class_weight_spread": "memvir.analysis.spread",
    "virtual_spread": "memvir.analysis.spread",
    "SnapshotMaker": "memvir.analysis.snapshots",
    "FewClassPoints": "memvir.analysis.projection",
    "FewClassProjection": "memvir.analysis.projection",
    "ProjectedSnapshot": "memvir.analysis.projection",
    "few_class_points": "memvir.analysis.projection",
    "project_few_classes": "memvir.analysis.projection",
    "project_snapshot": "memvir.analysis.projection",
    "umap_layout": "memvir.analysis.projection",
    "drift_offsets": "memvir.analysis.drift_frame",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
