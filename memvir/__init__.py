"""MemVir Studio: deep metric learning with memory-based virtual classes (Ko, Gu, Kim; ICCV 2021).

Importing the package costs torch and numpy only: the public names below are resolved on first use, so the
training path never pulls faiss, umap or huggingface_hub unless it needs them.

The library, by concept: `memory/` (the paper's algorithm), `train/` (the loop), `models/`, `retrieval/` (search,
metrics, the evaluation path), `analysis/` (what the paper's figures measure), `data/`, `integrations/` (other
libraries' losses, such as pytorch-metric-learning's, imported only there); at the top `config` (TrainConfig),
`events`, `losses`, `checkpoint` (the run folder on disk: its names, writers and `RunFolder`), `hub`, `cli`;
`_validate` (the argument and tensor checks the parts share), `_registry` (the one registry shape: losses,
backbones, datasets), `_hub_shims` (every version-sensitive use of huggingface_hub: the telemetry switch, the Hub
mixin's internals) and `_lazy` (the lazy faces: this one and each package's, whose `__init__` exports the package's
public names the same way).
"""

from memvir._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "MemVir": "memvir.memory.virtual_classes",
    "build_loss": "memvir.losses",
    "LOSSES": "memvir.losses",
    "retrieval_metrics": "memvir.retrieval.metrics",
    "per_query_metrics": "memvir.retrieval.metrics",
    "EmbeddingModel": "memvir.models.embedding_model",
    "TrainConfig": "memvir.config",
    "Trainer": "memvir.train.trainer",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
