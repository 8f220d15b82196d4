"""`load_hub_dataset`: a Hub image-classification dataset through 🤗 datasets (`datasets.load_dataset`, cached under
its usual cache, HF_DATASETS_CACHE), split by class as the benchmarks are (memvir.data.hub.protocol).

The rows stay in the Arrow files 🤗 datasets keeps (memory-mapped, so a data loader's workers share them); an image is
decoded with Pillow when its item is read, in the worker that reads it.
"""

import io
from functools import partial

import numpy as np
import torch
from PIL import Image

from memvir.data.errors import DatasetError
from memvir.data.hub.columns import class_ids, pick_columns
from memvir.data.hub.names import parse_hub_name
from memvir.data.hub.protocol import choose_train_classes
from memvir.data.image_files import photo_splits
from memvir.data.splits import DatasetSplits, SplitDataset

MIN_IMAGE_SIDE = 16  # the smallest model input (memvir.data.registry.MIN_IMAGE_SIZE): less holds nothing to learn
SIZE_CHECKED_ROWS = 64  # images whose size is read (headers only) before training, spread over the dataset
DATASETS_PIN = "datasets==5.2.0"


class HubImageDataset(SplitDataset):
    """One split of a Hub dataset: rows of an Arrow table whose image column is read undecoded (bytes or a path),
    decoded with Pillow, converted to RGB, then `transform`ed."""

    def __init__(self, rows, labels: np.ndarray, class_names: list[str], transform, *, table, image_column: str,
                 where: str):
        super().__init__(labels=labels, class_names=class_names)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.transform = transform
        self.table = table
        self.image_column = image_column
        self.where = where

    def image(self, index: int) -> Image.Image:
        row = int(self.rows[index])
        return _decode(self.table[row][self.image_column], f"{self.where}, row {row}")

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.image(index)), int(self.labels[index])


def _open(cell, what: str) -> Image.Image:
    """The image of an undecoded Image cell ({"bytes", "path"}), opened lazily (header read, pixels not yet)."""
    if not isinstance(cell, dict) or (cell.get("bytes") is None and not cell.get("path")):
        raise DatasetError(f"{what} holds no image")
    try:
        return Image.open(io.BytesIO(cell["bytes"]) if cell.get("bytes") is not None else cell["path"])
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise DatasetError(f"cannot read the image of {what}: {error}") from error


def _decode(cell, what: str) -> Image.Image:
    opened = _open(cell, what)
    try:
        with opened:
            return opened.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise DatasetError(f"cannot decode the image of {what}: {error}") from error


def _check_image_sizes(table, image_column: str, rows: np.ndarray, where: str) -> None:
    """DatasetError if an image among SIZE_CHECKED_ROWS rows spread over `rows` has a side under MIN_IMAGE_SIDE."""
    picked = rows[np.unique(np.linspace(0, len(rows) - 1, min(SIZE_CHECKED_ROWS, len(rows))).astype(np.int64))]
    for row in picked.tolist():
        with _open(table[row][image_column], f"{where}, row {row}") as opened:
            width, height = opened.size
        if min(width, height) < MIN_IMAGE_SIDE:
            raise DatasetError(
                f"{where}: the image of row {row} is {width}x{height} pixels; images need at least {MIN_IMAGE_SIDE} "
                "pixels a side to be learnt from (a model's smallest input). Choose a dataset of larger images")


def _load_repo(name: str, repo_id: str, revision: str | None):
    """The repo's splits as a 🤗 DatasetDict; DatasetError in words when 🤗 datasets cannot load it."""
    try:
        import datasets  # imported here: the training path imports without it (a GPU machine may lack it)
    except ImportError as error:
        raise DatasetError(f"{name} is read through 🤗 datasets, which is not installed: pip install "
                           f"{DATASETS_PIN}") from error
    try:
        loaded = datasets.load_dataset(repo_id, revision=revision)
    except Exception as error:  # noqa: BLE001 - every failure of the Hub or the repo, said in words below
        offline = " (HF_HUB_OFFLINE is set: only a dataset already in the cache is found)" if _offline() else ""
        raise DatasetError(
            f"{name}: 🤗 datasets could not load the Hub dataset {repo_id}"
            f"{'@' + revision if revision else ''}{offline}: {type(error).__name__}: {error}. Check the repo id "
            "and revision on the Hub and your connection; a private repo needs HF_TOKEN") from None
    if not isinstance(loaded, datasets.DatasetDict) or not loaded:
        raise DatasetError(f"{name}: {repo_id} holds no splits of rows that 🤗 datasets can read")
    return loaded


def _offline() -> bool:
    import huggingface_hub.constants

    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def load_hub_dataset(name: str, image_size: int, normalization: str, seed: int, image_column: str | None = None,
                     label_column: str | None = None) -> DatasetSplits:
    """The train and test splits of the Hub dataset `hf:OWNER/NAME[@REVISION]`, split by class.

    image_column / label_column: the columns to read; None picks the dataset's one Image and one ClassLabel feature
    (memvir.data.hub.columns). Rows without a label are left out. The classes: memvir.data.hub.protocol; the rule
    chosen is in the result's `info.split_rule`. Refused with a DatasetError, before any training: a repo that
    cannot be loaded, columns that are missing or do not fit, images under MIN_IMAGE_SIDE pixels a side, fewer than
    two classes in a half, or a test half without a class of two images.
    """
    reference = parse_hub_name(name)
    loaded = _load_repo(name, reference.repo_id, reference.revision)
    return hub_splits(name, loaded, image_size, normalization, seed, image_column, label_column)


def hub_splits(name: str, loaded, image_size: int, normalization: str, seed: int, image_column: str | None = None,
               label_column: str | None = None) -> DatasetSplits:
    """`load_hub_dataset`'s splits of a 🤗 DatasetDict already loaded (`loaded`), `name` naming it in messages."""
    import datasets

    split_names = list(loaded)
    features = loaded[split_names[0]].features
    image, label = pick_columns(features, image_column, label_column, f"{name} (split '{split_names[0]}')")
    parts = []
    for split in split_names:
        part = loaded[split]
        for column in (image, label):
            if column not in part.features or part.features[column] != features[column]:
                raise DatasetError(f"{name}: split '{split}' does not have the column {column!r} as split "
                                   f"'{split_names[0]}' has it ({features[column]}); its splits cannot be pooled")
        parts.append(part.select_columns([image, label]).cast_column(image, datasets.Image(decode=False)))
    pooled = datasets.concatenate_datasets(parts)
    ids, class_names = class_ids(pooled.with_format("arrow")[label].to_pylist(), features[label])
    split_of_row = np.repeat(np.arange(len(parts)), [len(part) for part in parts])
    rows = np.flatnonzero(ids >= 0)
    if len(rows) == 0:
        raise DatasetError(f"{name}: no row has a label in column {label!r}")
    is_train_class, rule = choose_train_classes(split_names, ids[rows], split_of_row[rows])
    unlabelled = len(ids) - len(rows)
    if unlabelled:
        rule += f"; {unlabelled} rows without a label left out"
    images = pooled.select_columns([image])
    _check_image_sizes(images, image, rows, name)
    return photo_splits(
        name, rows, ids[rows].tolist(), class_names, is_train_class, split_rule=rule, image_size=image_size,
        normalization=normalization, seed=seed,
        dataset_type=partial(HubImageDataset, table=images, image_column=image, where=name),
    )
