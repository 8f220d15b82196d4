"""ClassBalancedSampler: P classes x K items per batch, deterministic by seed and epoch, len = batches per epoch."""

from collections import Counter

import numpy as np
import pytest
import torch

from memvir.data import ClassBalancedSampler

# ten classes; class 7 has one item and class 9 two, fewer than K = 3
COUNTS = {0: 5, 1: 4, 2: 6, 3: 3, 4: 8, 5: 5, 6: 4, 7: 1, 8: 7, 9: 2}
LABELS = np.array([label for label, count in COUNTS.items() for _ in range(count)])  # 45 items


def check_batch(batch, classes_per_batch, samples_per_class):
    assert len(batch) == classes_per_batch * samples_per_class
    per_class = Counter(int(LABELS[index]) for index in batch)
    assert len(per_class) == classes_per_batch
    assert all(count == samples_per_class for count in per_class.values())
    for label in per_class:
        items = [index for index in batch if LABELS[index] == label]
        if COUNTS[label] >= samples_per_class:
            assert len(set(items)) == samples_per_class  # without replacement when the class has enough
        else:
            assert len(set(items)) <= COUNTS[label]  # with replacement otherwise


def test_every_batch_has_p_classes_of_k_items():
    sampler = ClassBalancedSampler(LABELS, classes_per_batch=4, samples_per_class=3, seed=0)
    assert len(sampler) == 45 // 12 == 3
    assert sampler.batch_size == 12
    for epoch in range(30):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        for batch in batches:
            check_batch(batch, 4, 3)


def test_small_classes_are_sampled_with_replacement():
    sampler = ClassBalancedSampler(LABELS, classes_per_batch=10, samples_per_class=3, seed=1)
    (batch,) = list(sampler)
    check_batch(batch, 10, 3)
    only_item_of_class_7 = int(np.flatnonzero(LABELS == 7)[0])
    assert batch.count(only_item_of_class_7) == 3


def test_batches_are_deterministic_by_seed_and_epoch():
    def batches(seed, epoch):
        sampler = ClassBalancedSampler(LABELS, 4, 3, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert batches(0, 0) == batches(0, 0)
    assert batches(0, 5) == batches(0, 5)
    assert batches(0, 0) != batches(0, 1)
    assert batches(0, 0) != batches(1, 0)
    sampler = ClassBalancedSampler(LABELS, 4, 3, seed=0)
    assert list(sampler) == list(sampler) == batches(0, 0)  # without set_epoch, epoch 0 repeats


def test_all_classes_and_items_are_reached_over_epochs():
    sampler = ClassBalancedSampler(LABELS, 4, 2, seed=3)
    seen = set()
    for epoch in range(40):
        sampler.set_epoch(epoch)
        seen.update(index for batch in sampler for index in batch)
    assert seen == set(range(len(LABELS)))


def test_at_least_one_batch_when_the_dataset_is_smaller_than_a_batch():
    sampler = ClassBalancedSampler([0, 0, 1, 2], classes_per_batch=3, samples_per_class=4)
    assert len(sampler) == 1
    (batch,) = list(sampler)
    assert len(batch) == 12


def test_works_as_a_dataloader_batch_sampler():
    dataset = torch.utils.data.TensorDataset(torch.arange(len(LABELS)), torch.from_numpy(LABELS))
    sampler = ClassBalancedSampler(LABELS, 3, 2, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    batches = list(loader)
    assert len(batches) == len(sampler) == 45 // 6
    for (indices, labels), expected in zip(batches, list(sampler), strict=True):
        assert indices.tolist() == expected
        assert torch.equal(labels, torch.from_numpy(LABELS[expected]))


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((LABELS, 11, 2), {}, "classes_per_batch=11 exceeds the 10 classes in labels"),
        ((LABELS, 0, 2), {}, "classes_per_batch must be a positive integer, got 0"),
        ((LABELS, 2, 0), {}, "samples_per_class must be a positive integer, got 0"),
        ((LABELS, 2, 1.5), {}, "samples_per_class must be a positive integer, got 1.5"),
        ((LABELS.reshape(5, 9), 2, 2), {}, r"labels must be a non-empty 1-D sequence of integers, got shape \(5, 9\)"),
        (([], 2, 2), {}, "labels must be a non-empty 1-D sequence"),
        (([0.5, 1.0], 1, 1), {}, "labels must be a non-empty 1-D sequence of integers"),
        ((LABELS, 2, 2), {"seed": -1}, "seed must be a non-negative integer, got -1"),
    ],
)
def test_bad_arguments_are_rejected(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClassBalancedSampler(*args, **kwargs)


def test_negative_epoch_is_rejected():
    sampler = ClassBalancedSampler(LABELS, 2, 2)
    with pytest.raises(ValueError, match="epoch must be a non-negative integer, got -1"):
        sampler.set_epoch(-1)
