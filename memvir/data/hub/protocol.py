"""Which classes train and which test on a Hub dataset: the zero-shot protocol of the DML benchmarks (classes, not
images, are split; docs/method.md).

A repo whose splits hold disjoint classes already follows it (SOP's train and test): its splits are kept, the split
named "train" (else the first) training and the others testing. Otherwise (CUB and CARS mirrors split images, not
classes) all splits are pooled and the classes halved in label order: the first half, rounded up, trains and the rest
tests, as the paper does for CUB-200 (classes 1-100 of 200) and CARS196 (1-98 of 196).
"""

from collections.abc import Callable

import numpy as np


def class_disjoint(split_classes: dict[str, set[int]]) -> bool:
    """Whether two or more splits are given and no class appears in two of them."""
    seen: set[int] = set()
    for classes in split_classes.values():
        if seen & classes:
            return False
        seen |= classes
    return len(split_classes) >= 2


def choose_train_classes(split_names: list[str], class_ids: np.ndarray, split_of_row: np.ndarray
                         ) -> tuple[Callable[[int], bool], str]:
    """(whether a class id trains, the rule in words for the run's log) for labelled rows with `class_ids` (>= 0),
    row i in split `split_names[split_of_row[i]]`."""
    split_classes = {name: set(np.unique(class_ids[split_of_row == index]).tolist())
                     for index, name in enumerate(split_names)}
    split_classes = {name: classes for name, classes in split_classes.items() if classes}
    if class_disjoint(split_classes):
        train_split = "train" if "train" in split_classes else next(iter(split_classes))
        train = frozenset(split_classes[train_split])
        test_splits = [name for name in split_classes if name != train_split]
        rule = (f"the repo's splits hold disjoint classes, so they are kept: split '{train_split}' trains "
                f"({len(train)} classes), {', '.join(repr(name) for name in test_splits)} test"
                f" ({sum(len(split_classes[name]) for name in test_splits)} classes)")
        return train.__contains__, rule
    present = np.unique(class_ids)
    num_train = (len(present) + 1) // 2
    train = frozenset(present[:num_train].tolist())
    pooled = ", ".join(repr(name) for name in split_names)
    rule = (f"all splits pooled ({pooled}), classes split in label order: the first {num_train} of "
            f"{len(present)} train, the other {len(present) - num_train} test")
    return train.__contains__, rule
