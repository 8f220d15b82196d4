"""The embedding model and its parts.

- `embedding_model`: `EmbeddingModel`: image in, L2-normalised embedding out, saved and loaded in the Hub format.
- `backbones`: the backbone registry (convnet, convnet-gn, resnet18/50, googlenet): `build_backbone`,
  `available_backbones`, `register_backbone`, `check_backbone`; a `Backbone` (features and their width),
  `PretrainedWeightsUnavailable`.
- `timm_backbones`: `timm:NAME`, any timm model as a backbone, its weights from the Hub through timm, its
  preprocessing from timm's pretrained config (timm imported only for such a name).
- `preprocessing`: a model's input preprocessing: the transform of its queries, and a dataset's splits read its way
  (`model_input`, `read_for_model`, `query_transform`).
- `card`: the model card an `EmbeddingModel` saves as README.md.
- `initialisation`: a model started from a saved checkpoint folder (the backbone, the head where it fits):
  `initialise_from_checkpoint`, which says what it loaded as an `Initialisation`.

`from memvir.models import EmbeddingModel`, and so for each name given with its part above: resolved on first use, so
`import memvir.models` imports none of the parts (huggingface_hub comes only with `EmbeddingModel`).
"""

from memvir._lazy import lazy_exports

_EXPORTS = {
    "EmbeddingModel": "memvir.models.embedding_model",
    "Backbone": "memvir.models.backbones",
    "PretrainedWeightsUnavailable": "memvir.models.backbones",
    "available_backbones": "memvir.models.backbones",
    "build_backbone": "memvir.models.backbones",
    "check_backbone": "memvir.models.backbones",
    "register_backbone": "memvir.models.backbones",
    "Initialisation": "memvir.models.initialisation",
    "initialise_from_checkpoint": "memvir.models.initialisation",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
