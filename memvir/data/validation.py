"""Validation classes held out from the training half, so that choices (N, M, a schedule...) are never made on the
test classes (the reference code picks its best epoch on the test set; docs/method.md, "Validation").

`hold_out_validation(splits, count, fold)` moves `count` training classes, picked by a fixed project seed (the same
classes in every run, whatever its seed), into a validation split that is scored like the test split: the clean,
deterministic test-time transform, labels from 0. The remaining training classes are relabelled from 0. Fold f is
the f-th block of `count` classes of that permutation, so folds 0, 1, ... are class-disjoint: the cross-validation
folds of a fair comparison (docs/reproduction.md, "A fair comparison").
"""

import copy
import dataclasses

import numpy as np

from memvir.data.errors import DatasetError
from memvir.data.image_files import MIN_CLASSES_PER_SPLIT
from memvir.data.splits import DatasetSplits, SplitDataset, check_scorable, without_augmentation

VALIDATION_SPLIT_SEED = 2022  # a project constant, like the glyph split's, not a training seed


class ClassSubset(SplitDataset):
    """The items of some classes of a split, relabelled 0.. in the given class order; `raw`, `image` and the batch
    augmentation are the base split's own."""

    def __init__(self, base: SplitDataset, classes: np.ndarray):
        classes = np.asarray(classes, dtype=np.int64)
        new_label = np.full(base.num_classes, -1, dtype=np.int64)
        new_label[classes] = np.arange(len(classes))
        self.indices = np.flatnonzero(new_label[base.labels] >= 0)
        super().__init__(labels=new_label[base.labels[self.indices]],
                         class_names=[base.class_names[c] for c in classes])
        self.base = base
        self.batch_transform = base.batch_transform

    def with_transform(self, transform) -> "ClassSubset":
        """The same classes of the base split read through `transform` (the base reads the images)."""
        clean = copy.copy(self)
        clean.base = self.base.with_transform(transform)
        clean.batch_transform = None
        return clean

    def image(self, index: int):
        return self.base.image(int(self.indices[index]))

    def raw(self, index: int):
        pixels, _ = self.base.raw(int(self.indices[index]))
        return pixels, int(self.labels[index])

    def __getitem__(self, index: int):
        pixels, _ = self.base[int(self.indices[index])]
        return pixels, int(self.labels[index])


def validation_classes(num_train_classes: int, count: int, fold: int = 0) -> np.ndarray:
    """The training-class indices (ascending) held out as validation: block `fold` of `count` classes of a fixed
    permutation (fold 0: its first `count`)."""
    order = np.random.default_rng(VALIDATION_SPLIT_SEED).permutation(num_train_classes)
    return np.sort(order[fold * count:(fold + 1) * count])


def hold_out_validation(splits: DatasetSplits, count: int, fold: int = 0) -> tuple[DatasetSplits, SplitDataset]:
    """(splits with `count` fewer training classes, the validation split of those classes, clean and labelled 0..).

    The validation split reads the training images through the test split's deterministic transform. `fold` picks
    which class-disjoint block of `count` classes is held out.
    """
    num_train = splits.info.num_train_classes
    if not MIN_CLASSES_PER_SPLIT <= count <= num_train - MIN_CLASSES_PER_SPLIT:
        raise DatasetError(
            f"cannot hold out {count} validation classes from the {num_train} training classes of {splits.info.name}: "
            f"both parts need at least {MIN_CLASSES_PER_SPLIT}; hold out between {MIN_CLASSES_PER_SPLIT} and "
            f"{num_train - MIN_CLASSES_PER_SPLIT} (--val-classes), or 0 for none"
        )
    folds = num_train // count
    if not 0 <= fold < folds:
        raise DatasetError(
            f"fold {fold} of {count} validation classes does not exist: the {num_train} training classes of "
            f"{splits.info.name} make {folds} class-disjoint folds of that size (--val-fold 0 to {folds - 1})"
        )
    held = validation_classes(num_train, count, fold)
    kept = np.setdiff1d(np.arange(num_train), held)
    validation = ClassSubset(without_augmentation(splits).train, held)
    check_scorable(validation, f"{splits.info.name}: the validation split ({count} classes held out, fold {fold})")
    train = ClassSubset(splits.train, kept)
    info = dataclasses.replace(splits.info, num_train_classes=len(kept))
    return DatasetSplits(train=train, test=splits.test, info=info), validation
