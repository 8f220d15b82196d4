"""What the paper's figures measure (docs/method.md, "What the app shows"), computed from a run's tensors.

- `spread`: how far the virtual classes have drifted from the live ones; how the real classes use the sphere.
- `snapshots`: what an embedding snapshot holds besides the step's rows: the probe set and the few-class view.
- `projection`: a snapshot to 2-D points (PCA, UMAP), aligned from one snapshot to the next.
- `drift_frame`: a class's stored weights in a frame of their own around its live weight, at their true angle.
"""
