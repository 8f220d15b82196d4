"""The Train tab's figures: pure functions from a run's records or a projected snapshot to a plotly ``go.Figure``.

- `style`: the house style, and a figure built from plain dicts without plotly's validation.
- `curves`: loss and Recall@1, the class count s(i), the mean target cosine, each beside its baseline.
- `spread`: how far the virtual classes drifted from the live ones, and how the real classes spread.
- `embeddings`: the embedding picture of all classes, by age or by class. `few_classes`: the few-class pictures (the
  map and the drift).
"""
