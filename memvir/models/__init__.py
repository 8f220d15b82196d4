"""The embedding model and its parts.

- `embedding_model`: `EmbeddingModel`: image in, L2-normalised embedding out, saved and loaded in the Hub format.
- `backbones`: the backbone registry (convnet, convnet-gn, resnet18/50, googlenet).
- `card`: the model card an `EmbeddingModel` saves as README.md.
- `_hub_shims`: every use of huggingface_hub outside its documented API, checked against the pinned version.
- `initialisation`: a model started from a saved checkpoint folder (the backbone, the head where it fits).
"""
