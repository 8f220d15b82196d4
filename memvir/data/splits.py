"""What `load_dataset` returns: the train and test splits, their common interface, and the facts about them."""

import copy
import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from memvir.data.errors import DatasetError


class SplitDataset(Dataset, ABC):
    """One split of a dataset: items are (image tensor [C, H, W], label int in [0, num_classes)).

    Besides the torch Dataset protocol every split offers `labels` (int64, one per item, known without loading any
    image: samplers and metrics use it), `class_names` (index = label) and `image(i)`, the raw PIL image for
    galleries and thumbnails.

    A split whose random augmentation is cheaper per batch than per image sets `batch_transform` (a callable on a
    stacked batch of `raw(i)` tensors) and implements `raw(i)`; the Trainer then loads raw items and augments whole
    batches. `dataset[i]` stays the same augmentation applied to one item.

    Every split applies its `transform` attribute in `__getitem__`, so a shallow copy with the test split's
    `transform` reads the same images as the test split reads its own (validation.py relies on this).
    """

    batch_transform = None

    def __init__(self, labels: np.ndarray, class_names: list[str]):
        self.labels = np.asarray(labels, dtype=np.int64)
        self.class_names = list(class_names)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self.labels)

    def with_transform(self, transform) -> "SplitDataset":
        """A shallow copy that reads its items through `transform`, without batch augmentation (same images)."""
        clean = copy.copy(self)
        clean.transform = transform
        clean.batch_transform = None
        return clean

    @abstractmethod
    def image(self, index: int) -> Image.Image:
        """The raw, un-normalised image of item `index`."""

    @abstractmethod
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """The transformed image tensor and the label of item `index`."""


@dataclass(frozen=True)
class DatasetInfo:
    """Facts about a loaded dataset that a model and its checkpoint config need (input shape and normalisation).

    `kind` tells how to bring a query image to `image_size` ("glyph": plain resize; "photo": resize the short side
    to image_size * 256/224 and crop the centre). `normalization` follows `EmbeddingModel`'s config: None means
    pixels are scaled to [0, 1] before (x - mean) / std per channel (glyphs, and photos with ImageNet statistics);
    "caffe" means pixels stay on the 0-255 scale, with mean and std given on that scale.
    """

    name: str
    kind: str  # "glyph" or "photo"
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_train_classes: int
    num_test_classes: int
    normalization: str | None = None
    split_rule: str = ""  # which classes train and which test, in words, for the run's log ("" where it is fixed)


@dataclass(frozen=True)
class DatasetSplits:
    """The train split (random augmentation), the test split (deterministic) and their `DatasetInfo`.

    Train and test hold disjoint classes, each labelled from 0, as deep metric learning evaluates on unseen classes.
    """

    train: SplitDataset
    test: SplitDataset
    info: DatasetInfo


def without_augmentation(splits: DatasetSplits) -> DatasetSplits:
    """The same splits, with training images read the way the test split reads its own: clean, deterministic.

    For held-out validation classes, and for training without augmentation (a setting in which a network can
    over-fit its few training classes). The train split is a shallow copy, so the original keeps its augmentation.
    """
    return dataclasses.replace(splits, train=splits.train.with_transform(splits.test.transform))


def check_scorable(split: SplitDataset, what: str) -> None:
    """DatasetError unless some class of `split` has two or more items: retrieval is scored by each query finding
    another item of its class (memvir.retrieval.metrics leaves out the others), so a split of single images cannot be
    scored, and a run on it would train to the end and fail there. `what` names the split in the message."""
    counts = np.bincount(split.labels, minlength=split.num_classes)
    if not (counts >= 2).any():
        raise DatasetError(
            f"{what} has no class with two or more images (its {split.num_classes} classes have one each), so "
            "retrieval cannot be scored on it: each query needs another image of its class. Give its classes at "
            "least two images each"
        )
