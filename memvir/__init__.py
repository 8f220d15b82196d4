"""MemVir Studio: deep metric learning with memory-based virtual classes (Ko, Gu, Kim; ICCV 2021).

Importing the package costs torch and numpy only: the public names below are resolved on first use, so the
training path never pulls faiss, umap or huggingface_hub unless it needs them.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "MemVir": "memvir.memory",
    "build_loss": "memvir.losses",
    "LOSSES": "memvir.losses",
    "retrieval_metrics": "memvir.metrics",
    "per_query_metrics": "memvir.metrics",
    "EmbeddingModel": "memvir.models",
    "TrainConfig": "memvir.config",
    "Trainer": "memvir.train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'memvir' has no attribute {name!r}")
