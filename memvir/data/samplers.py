"""Class-balanced batches (P classes x K images), the sampling that pair- and proxy-based DML losses often use.

Plain random batches need no class here: torch's `DataLoader(shuffle=True, drop_last=True)` gives them.
"""

from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


class ClassBalancedSampler(Sampler[list[int]]):
    """A batch sampler: each batch holds `classes_per_batch` distinct classes with `samples_per_class` items each.

    Pass it as `DataLoader(dataset, batch_sampler=sampler)`. Classes are drawn uniformly without replacement within
    a batch; a class's items are drawn without replacement, or with replacement when it has fewer than
    `samples_per_class`. An epoch has len(labels) // batch_size batches (at least one), so it sees about as many
    items as the dataset holds. The batches depend only on `seed` and the epoch set with `set_epoch` (call it
    before each epoch, as with torch's DistributedSampler; without it every epoch repeats epoch 0).
    """

    def __init__(self, labels: Sequence[int] | np.ndarray, classes_per_batch: int, samples_per_class: int, seed=0):
        labels = np.asarray(labels)
        if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(
                f"labels must be a non-empty 1-D sequence of integers, got shape {labels.shape} of {labels.dtype}"
            )
        for name, value in (("classes_per_batch", classes_per_batch), ("samples_per_class", samples_per_class)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        classes, inverse = np.unique(labels, return_inverse=True)
        if classes_per_batch > len(classes):
            raise ValueError(
                f"classes_per_batch={classes_per_batch} exceeds the {len(classes)} classes in labels; lower it"
            )
        self.classes_per_batch = int(classes_per_batch)
        self.samples_per_class = int(samples_per_class)
        self.seed = int(seed)
        self.epoch = 0
        # Item indices of each class, grouped once so a batch costs O(P*K), not a scan of all labels.
        order = np.argsort(inverse, kind="stable")
        self._class_items = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
        self._num_batches = max(1, len(labels) // (self.classes_per_batch * self.samples_per_class))

    @property
    def batch_size(self) -> int:
        return self.classes_per_batch * self.samples_per_class

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batches the next iteration yields."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self._num_batches

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        for _ in range(self._num_batches):
            batch = []
            for class_index in rng.choice(len(self._class_items), size=self.classes_per_batch, replace=False):
                items = self._class_items[class_index]
                too_few = len(items) < self.samples_per_class
                batch.extend(rng.choice(items, size=self.samples_per_class, replace=too_few).tolist())
            yield batch
