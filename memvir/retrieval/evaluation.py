"""The one path from (model, dataset) to embeddings, metrics and a gallery index.

The Trainer, the CLI and the app all embed, score and index through these functions, so the Recall@1 each of them
shows is computed the same way: the split's own test-time transform, eval mode, L2-normalised float32 embeddings,
the K values of the dataset (docs/method.md, "Evaluation").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

from memvir.checkpoint import CheckpointError, RunFolder
from memvir.data import load_dataset
from memvir.hub import load_model
from memvir.models.preprocessing import read_for_model
from memvir.retrieval.index import GalleryIndex
from memvir.retrieval.metrics import retrieval_metrics

# SOP's classes hold a few images each, so its Recall@K is read at 1, 10, 100, 1000 (the paper's); 1, 2, 4, 8 else.
_KS = {"sop": (1, 10, 100, 1000)}
_DEFAULT_KS = (1, 2, 4, 8)


def retrieval_ks(dataset_name: str, num_items: int) -> tuple[int, ...]:
    """The K of Recall@K reported for a dataset, those smaller than the number of items."""
    return tuple(k for k in _KS.get(dataset_name, _DEFAULT_KS) if k < num_items)


@torch.no_grad()
def embed(model: torch.nn.Module, split, indices: Sequence[int] | None = None, batch_size: int = 256,
          num_workers: int = 0, progress: bool = False,
          on_progress: Callable[[float], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised embeddings (CPU float32) and labels of a dataset split (or of its `indices`), in eval mode.

    The model's training flag is restored afterwards, so this is safe between training steps. On a GPU the forward
    pass runs under bfloat16 autocast, as training does. `progress` shows a tqdm bar (for terminals);
    `on_progress` is called after each batch with the fraction of the items embedded so far (for a page's bar).
    """
    device = next(model.parameters()).device
    subset = split if indices is None else Subset(split, list(indices))
    loader = DataLoader(subset, batch_size=batch_size, num_workers=num_workers, pin_memory=device.type == "cuda")
    if progress:
        from tqdm.auto import tqdm

        loader = tqdm(loader, desc="embedding", unit="batch")
    was_training = model.training
    model.eval()
    chunks, labels = [], []
    embedded = 0
    try:
        for images, batch_labels in loader:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                chunks.append(model(images.to(device, non_blocking=True)).float().cpu())
            labels.append(torch.as_tensor(batch_labels))
            embedded += len(batch_labels)
            if on_progress is not None:
                on_progress(embedded / len(subset))
    finally:
        model.train(was_training)
    if not chunks:
        return torch.empty(0, getattr(model, "embedding_dim", 0)), torch.empty(0, dtype=torch.long)
    return torch.cat(chunks), torch.cat(labels)


def score(embeddings: torch.Tensor, labels: torch.Tensor, dataset_name: str) -> dict[str, float]:
    """Retrieval metrics of embeddings with their labels, at the dataset's K values."""
    return retrieval_metrics(embeddings, labels, ks=retrieval_ks(dataset_name, len(labels)))


def evaluate(model: torch.nn.Module, split, dataset_name: str, batch_size: int = 256, num_workers: int = 0,
             progress: bool = False) -> dict[str, float]:
    """Retrieval metrics of a model on a split: embed, then score."""
    embeddings, labels = embed(model, split, batch_size=batch_size, num_workers=num_workers, progress=progress)
    return score(embeddings, labels, dataset_name)


def build_index(model: torch.nn.Module, split, items: Sequence[str] | None = None, batch_size: int = 256,
                progress: bool = False):
    """A GalleryIndex of a split's embeddings and labels (`items`: an identifier per image, e.g. a path)."""
    embeddings, labels = embed(model, split, batch_size=batch_size, progress=progress)
    return GalleryIndex.build(embeddings, labels=labels, items=items)


def load_model_and_split(model_ref: str, dataset: str | None = None, data_root: str | None = None,
                         split: str = "test"):
    """(model, dataset name, split) for a run folder, checkpoint folder or Hub repo id, and a split of the dataset
    it was trained on (or of `dataset`), at the model's own input size, its images prepared as the model prepares a
    query (its mean, std and resizing: a timm backbone's may differ from the dataset's own)."""
    model = load_model(model_ref)
    config = dict(model.config)
    name = dataset or config.get("dataset")
    if not name:
        raise ValueError(f"{model_ref} does not say which dataset it was trained on; pass --dataset")
    columns = _trained_columns(model_ref) if name == config.get("dataset") else {}
    data = load_dataset(name, data_root=data_root, image_size=config.get("image_size"), **columns)
    return model, name, getattr(read_for_model(data, config), split)


def _trained_columns(model_ref: str) -> dict:
    """The Hub dataset columns (image_column, label_column) a run folder's train_config.json names, so that the
    run's own dataset is read as it was trained on; {} elsewhere (a repo id, a checkpoint folder: the defaults)."""
    try:
        saved = RunFolder(Path(model_ref).expanduser()).config_dict()
    except CheckpointError:  # no run folder, or a damaged config: the defaults
        return {}
    return {key: saved[key] for key in ("image_column", "label_column") if isinstance(saved.get(key), str)}
