"""Starting a model from a saved checkpoint folder: the backbone always, the embedding head where its shape fits.

This is the fine-tuning half of the paper's setting (docs/method.md, "Pretraining and fine-tuning"): a backbone
pretrained on one set of classes starts a run on another. The folder is one `EmbeddingModel.save_pretrained` wrote
(config.json + model.safetensors), read from the disk only, never the Hub. Class weights are not part of such a
folder (the Trainer keeps them apart), and they could not carry over anyway: the classes differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from memvir import checkpoint
from memvir.checkpoint import CheckpointError
from memvir.models.embedding_model import EmbeddingModel

PRETRAINED_GLYPHS_BACKBONE = "checkpoints/glyphs-pretrain-convnet"
"""The bundled backbone pretrained on glyphs-pretrain (`make pretrained`), relative to the repository's root: what a
run of the paper's setting passes as `--init` with `--dataset glyphs-few`, and the example refusals name."""


@dataclass(frozen=True)
class Initialisation:
    """What `initialise_from_checkpoint` loaded: the folder, whether the head came too, and why not if not."""

    folder: str
    head_loaded: bool
    head_skipped_because: str | None = None

    def describe(self) -> str:
        """One line for people: what came from where, and what starts fresh."""
        loaded = "backbone and embedding head" if self.head_loaded else "backbone"
        fresh = "new class weights" if self.head_loaded else (
            f"a new embedding head ({self.head_skipped_because}) and new class weights")
        return f"{loaded} from {self.folder}; {fresh}"


def read_checkpoint_config(folder: str | Path, flag: str = "--init") -> dict:
    """The config.json of a checkpoint folder, after checking the folder holds a checkpoint; CheckpointError saying
    what is wrong (missing, a file, no checkpoint files, unreadable config) and what to pass instead."""
    folder = Path(folder).expanduser()
    example = f"a checkpoint folder (config.json + model.safetensors), such as {PRETRAINED_GLYPHS_BACKBONE}"
    if not folder.exists():
        raise CheckpointError(f"{flag} {folder}: there is no such folder; pass {example}")
    if not folder.is_dir():
        raise CheckpointError(f"{flag} {folder} is a file, not a folder; pass {example}")
    missing = [name for name in checkpoint.MODEL_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{flag} {folder} is not a checkpoint: {' and '.join(missing)} missing; pass {example}")
    config_file = folder / checkpoint.CONFIG_FILE
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{flag} {folder}: its config.json is not valid JSON ({error}); save the model "
                              "again, or pass another checkpoint folder") from error
    if not isinstance(config, dict) or not {"backbone", "in_channels"} <= set(config):
        raise CheckpointError(f"{flag} {folder}: its config.json does not describe an EmbeddingModel (no backbone "
                              f"and in_channels); pass {example}")
    return config


def initialise_from_checkpoint(model, folder: str | Path, dataset: str = "the run's dataset",
                               flag: str = "--init") -> Initialisation:
    """Copy the backbone of the checkpoint in `folder` into `model` (an EmbeddingModel), and its embedding head too
    when the head has the same shape (the same embedding dimension).

    The backbone must be the same architecture with the same number of input channels; otherwise a CheckpointError
    says which differs and what to pass (`--backbone`, or a checkpoint for the dataset's channels). BatchNorm running
    statistics come with the backbone: they are part of what pretraining learnt. `dataset` names the run's data in
    that message; `flag` is how the caller's users name the folder.
    """
    config = read_checkpoint_config(folder, flag)
    folder = Path(folder).expanduser()
    wanted = model.config
    if config["backbone"] != wanted["backbone"]:
        raise CheckpointError(
            f"{flag} {folder} holds a {config['backbone']!r} backbone, but this run builds {wanted['backbone']!r}: "
            f"pass --backbone {config['backbone']} to fine-tune it, or a checkpoint of a {wanted['backbone']!r} "
            "backbone")
    if config["in_channels"] != wanted["in_channels"]:
        raise CheckpointError(
            f"{flag} {folder} takes {config['in_channels']}-channel images, but {dataset} has "
            f"{wanted['in_channels']}-channel ones: fine-tune it on a dataset with {config['in_channels']}-channel "
            f"images, or pass a checkpoint trained on {wanted['in_channels']}-channel images")
    source = EmbeddingModel.from_pretrained(folder)  # a local folder: strict keys, no Hub look-up
    with torch.no_grad():
        model.backbone.load_state_dict(source.backbone.state_dict())
        head_fits = source.head.weight.shape == model.head.weight.shape
        if head_fits:
            model.head.load_state_dict(source.head.state_dict())
    skipped = None if head_fits else (
        f"the checkpoint's embedding is {source.embedding_dim}-d, this run's {model.embedding_dim}-d")
    return Initialisation(str(folder), head_fits, skipped)
