"""TrainingBatches: a run's training batches, the same ones whatever stops, resumes or processes come between.

Every sample's augmentation is drawn from its own seed (run seed, epoch, position), or, for a split that augments
whole batches (glyphs: far cheaper), the batch's from the batch's seed; batches come from a seeded permutation of
each epoch (or the class-balanced sampler). So a run stopped at any step and resumed gets exactly the batches the
uninterrupted run would have had, whatever the number of loader workers; and under torchrun each rank's rows of a
batch are exactly its share of the single-process batch.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from memvir.data.samplers import ClassBalancedSampler
from memvir.data.transforms import sample_seed

_SEED_STRIDE = 65_536  # positions a batch's samples take in the seed arithmetic: more than any batch holds


def _sample_seed(run_seed: int, epoch: int, position: int) -> int:
    return ((run_seed * 1_000_003 + epoch) * 10_000_019 + position) % (2**63 - 1)


class _KeyedSamples(Dataset):
    """Items looked up by (index, seed) keys, so that randomness depends on the key, never on what came before.

    Per item (raw=False): the item's augmentation is drawn from its own seed. For a split that augments whole batches
    (raw=True): the un-augmented item, with its batch's seed passed along to `_AugmentBatch`.
    """

    def __init__(self, dataset, raw: bool):
        self.dataset = dataset
        self.raw = raw

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        index, seed = key
        if self.raw:
            return (*self.dataset.raw(index), seed)
        with sample_seed(seed):
            return self.dataset[index]


class _AugmentBatch:
    """collate_fn: stack raw items, then augment the batch with randomness drawn from the batch's own seed.

    The draws cover the whole batch at once, so a rank given only its share would draw other numbers than a single
    process: each rank loads the whole global batch, augments it, and keeps its `rows`.
    """

    def __init__(self, batch_transform, rows: slice):
        self.batch_transform = batch_transform
        self.rows = rows

    def __call__(self, items):
        pixels = torch.stack([item[0] for item in items])
        labels = torch.tensor([item[1] for item in items], dtype=torch.long)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small tensors: a second thread only adds hand-off cost, dearly on a busy CPU
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(items[0][2])
                return self.batch_transform(pixels)[self.rows], labels[self.rows]
        finally:
            torch.set_num_threads(threads)


class _EpochBatches(Sampler):
    """The batch sampler of the run's one DataLoader: the keyed batches set for the current epoch.

    One loader for the whole run lets its worker processes persist from epoch to epoch instead of starting again.
    """

    def __init__(self):
        self.batches: list[list] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


class TrainingBatches:
    """The training batches of a run: `epoch(e, position)` iterates epoch e's batches from `position` on.

    split: the training split. batch_size: the global batch. rows: this rank's rows of each batch (all of them in
    one process). sampler: "random" (a seeded permutation per epoch, the reference's) or "balanced" (P classes x K
    images). pin_memory: for a GPU. name: the dataset's, for messages.
    """

    def __init__(self, split, batch_size: int, seed: int, rows: slice = slice(None), sampler: str = "random",
                 samples_per_class: int = 4, num_workers: int = 0, pin_memory: bool = False, name: str = "the data"):
        if batch_size > len(split):
            raise ValueError(f"batch_size {batch_size} is larger than the training split of {name} ({len(split)} "
                             f"images); use --batch-size {len(split)} or less")
        self.split = split
        self.batch_size = batch_size
        self.seed = seed
        self.rows = rows
        self._num_workers = num_workers
        self._pin_memory = pin_memory
        self._balanced = None
        if sampler == "balanced":
            self._balanced = ClassBalancedSampler(split.labels, batch_size // samples_per_class, samples_per_class,
                                                  seed=seed)
        self.steps_per_epoch = len(self._balanced) if self._balanced else len(split) // batch_size
        self._epoch_batches = _EpochBatches()
        self._loader = self._make_loader()

    def _make_loader(self) -> DataLoader:
        if self.split.batch_transform is not None:
            dataset, collate = _KeyedSamples(self.split, raw=True), _AugmentBatch(self.split.batch_transform,
                                                                                  self.rows)
        else:
            dataset, collate = _KeyedSamples(self.split, raw=False), None
        return DataLoader(dataset, batch_sampler=self._epoch_batches, collate_fn=collate,
                          num_workers=self._num_workers, pin_memory=self._pin_memory,
                          persistent_workers=self._num_workers > 0)

    def epoch(self, epoch: int, position: int = 0):
        """Epoch `epoch`'s (images, labels) batches from batch `position` on, this rank's rows of each."""
        if self._balanced is not None:
            self._balanced.set_epoch(epoch)
            batches = list(self._balanced)
        else:
            order = torch.randperm(len(self.split),
                                   generator=torch.Generator().manual_seed(_sample_seed(self.seed, epoch, 0)))
            size = self.batch_size
            batches = [order[i * size:(i + 1) * size].tolist() for i in range(self.steps_per_epoch)]
        first = epoch * self.steps_per_epoch
        if self.split.batch_transform is not None:  # one seed per batch; _AugmentBatch keeps this rank's rows
            keyed = [[(index, _sample_seed(self.seed, epoch, 1 + (first + b) * _SEED_STRIDE)) for index in batch]
                     for b, batch in enumerate(batches)]
        else:
            keyed = [[(index, _sample_seed(self.seed, epoch, 1 + (first + b) * _SEED_STRIDE + slot))
                      for slot, index in enumerate(batch)][self.rows] for b, batch in enumerate(batches)]
        self._epoch_batches.batches = keyed[position:]
        return iter(self._loader)

    def release_workers(self) -> None:
        """End the loader's persistent worker processes (a fresh loader takes over, should training go on)."""
        self._loader = self._make_loader()
