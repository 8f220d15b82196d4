"""Photo datasets stored as image files: one split dataset type, and the class-wise split every loader uses."""

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from memvir.data.errors import DatasetError
from memvir.data.splits import DatasetInfo, DatasetSplits, SplitDataset, check_scorable
from memvir.data.transforms import SeededTransform, photo_normalization, photo_test_transform, photo_train_transform

PHOTO_IMAGE_SIZE = 224
MIN_CLASSES_PER_SPLIT = 2  # retrieval among one class is trivial; metric learning needs negatives


class ImageFileDataset(SplitDataset):
    """One split of a photo dataset: image files read with Pillow, converted to RGB, then `transform`ed."""

    def __init__(self, paths: Sequence[Path], labels: np.ndarray, class_names: list[str], transform):
        super().__init__(labels=labels, class_names=class_names)
        self.paths = list(paths)
        self.transform = transform

    def image(self, index: int) -> Image.Image:
        path = self.paths[index]
        try:
            with Image.open(path) as opened:
                return opened.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            raise DatasetError(f"cannot read image {path}: {error}. Replace or remove the file.") from error

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.image(index)), int(self.labels[index])


def check_files_exist(paths: Sequence[Path], listed_in: str) -> None:
    """Raise a DatasetError naming the first missing files (and how many), so a broken copy fails at load time."""
    missing = [path for path in paths if not path.is_file()]
    if missing:
        examples = ", ".join(str(path) for path in missing[:3])
        raise DatasetError(f"{len(missing)} image file(s) listed in {listed_in} are missing, e.g. {examples}")


def _class_split(
    paths: Sequence, class_ids: Sequence[int], class_names: dict[int, str], keep_ids: list[int], transform,
    dataset_type: Callable[..., SplitDataset] = ImageFileDataset,
) -> SplitDataset:
    """The images of the classes `keep_ids` (ascending), labelled 0.. in that order."""
    label_of = {class_id: label for label, class_id in enumerate(keep_ids)}
    chosen = [
        (path, label_of[class_id]) for path, class_id in zip(paths, class_ids, strict=True) if class_id in label_of
    ]
    return dataset_type(
        [path for path, _ in chosen],
        labels=np.array([label for _, label in chosen], dtype=np.int64),
        class_names=[class_names[class_id] for class_id in keep_ids],
        transform=transform,
    )


def photo_splits(
    name: str,
    paths: Sequence,
    class_ids: Sequence[int],
    class_names: dict[int, str],
    is_train_class: Callable[[int], bool],
    split_rule: str,
    image_size: int,
    normalization: str,
    seed: int,
    dataset_type: Callable[..., SplitDataset] = ImageFileDataset,
) -> DatasetSplits:
    """Split images by class into train (`is_train_class`) and test (the rest), with the photo transforms.

    Labels run from 0 in ascending class-id order within each split. The train transform is seeded by `seed`.
    `split_rule` describes the rule, for the error raised when a split has fewer than two classes and for the run's
    log (`DatasetInfo.split_rule`). `dataset_type(items, labels=, class_names=, transform=)` makes each split from its
    items: `paths` are image files for the default, whatever that type reads otherwise (a Hub dataset's rows).
    """
    found_ids = sorted(set(class_ids))
    train_ids = [class_id for class_id in found_ids if is_train_class(class_id)]
    test_ids = [class_id for class_id in found_ids if not is_train_class(class_id)]
    for split, ids in (("train", train_ids), ("test", test_ids)):
        if len(ids) < MIN_CLASSES_PER_SPLIT:
            raise DatasetError(
                f"{name}: the {split} split has {len(ids)} class(es) with images ({split_rule}); "
                f"at least {MIN_CLASSES_PER_SPLIT} per split are needed"
            )
    mean, std = photo_normalization(normalization)
    train_transform = SeededTransform(photo_train_transform(image_size, normalization), seed)
    train = _class_split(paths, class_ids, class_names, train_ids, train_transform, dataset_type)
    test = _class_split(paths, class_ids, class_names, test_ids, photo_test_transform(image_size, normalization),
                        dataset_type)
    check_scorable(test, f"{name}: the test split ({split_rule})")
    info = DatasetInfo(
        name=name,
        kind="photo",
        channels=3,
        image_size=image_size,
        mean=mean,
        std=std,
        num_train_classes=train.num_classes,
        num_test_classes=test.num_classes,
        # EmbeddingModel's convention: None for pixels in [0, 1], "caffe" for 0-255.
        normalization="caffe" if normalization == "caffe" else None,
        split_rule=split_rule,
    )
    return DatasetSplits(train=train, test=test, info=info)
