"""Validation classes held out from the training half: which images they hold, how they are read, and the Trainer's
val_* metrics, checked against hand-made expectations from the clean renders."""

import numpy as np
import pytest
import torch

from memvir import TrainConfig, Trainer
from memvir.data import DatasetError, load_dataset
from memvir.data.glyphs.dataset import GLYPH_MEAN, GLYPH_STD
from memvir.data.validation import hold_out_validation, validation_classes
from memvir.retrieval.metrics import retrieval_metrics


def clean_pixels(render: np.ndarray) -> torch.Tensor:
    """A clean render as the test split reads it, written out by hand: [0, 255] -> [0, 1] -> (x - mean) / std."""
    return ((torch.from_numpy(render).float() / 255 - GLYPH_MEAN[0]) / GLYPH_STD[0]).unsqueeze(0)


def test_held_out_classes_are_fixed_disjoint_and_read_clean():
    full = load_dataset("glyphs-mini")
    splits, validation = hold_out_validation(full, 6)
    held = validation_classes(24, 6)
    assert len(held) == 6 and len(set(held.tolist())) == 6 and np.all(np.diff(held) > 0)
    assert np.array_equal(validation_classes(24, 6), held)  # the same classes in every run, whatever its seed
    kept = [c for c in range(24) if c not in set(held.tolist())]

    assert splits.info.num_train_classes == 18 and splits.test is full.test
    assert validation.class_names == [full.train.class_names[c] for c in held]
    assert splits.train.class_names == [full.train.class_names[c] for c in kept]
    assert len(validation) == 6 * 12 and len(splits.train) == 18 * 12
    # every validation item is its original class's clean render, as the test split would read it
    renders = full.train.renders
    for index in range(0, len(validation), 5):
        pixels, label = validation[index]
        original, face = held[index // 12], index % 12
        assert label == index // 12
        torch.testing.assert_close(pixels, clean_pixels(renders[original, face]))
    # training items keep their batch augmentation and raw renders, under new consecutive labels
    assert splits.train.batch_transform is full.train.batch_transform
    for index in range(0, len(splits.train), 7):
        raw, label = splits.train.raw(index)
        assert label == index // 12
        assert torch.equal(raw[0], torch.from_numpy(renders[kept[index // 12], index % 12]))
    assert validation.batch_transform is None and full.train.batch_transform is not None  # the original is untouched


@pytest.mark.parametrize("count", [1, 23, 30])
def test_too_few_or_too_many_validation_classes_say_what_to_use(count):
    with pytest.raises(DatasetError, match=r"hold out between 2 and 22 \(--val-classes\), or 0 for none"):
        hold_out_validation(load_dataset("glyphs-mini"), count)


def test_trainer_trains_without_the_validation_classes_and_scores_them():
    config = TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=1, memvir_n=1, memvir_m=0, warmup_epochs=0,
                         snapshot_every=0, eval_every=0, eval_at_start=False, val_classes=4)
    trainer = Trainer(config)
    assert trainer.class_weights.shape[0] == 20
    trainer.run()
    metrics = trainer.last_metrics
    assert {"recall@1", "val_recall@1", "val_map@r", "val_r_precision"} <= set(metrics)

    full = load_dataset("glyphs-mini")
    held = validation_classes(24, 4)
    images = torch.stack([clean_pixels(full.train.renders[c, f]) for c in held for f in range(12)])
    labels = torch.arange(4).repeat_interleave(12)
    trainer.model.eval()
    with torch.no_grad():
        embeddings = trainer.model(images)
    expected = retrieval_metrics(embeddings, labels, ks=(1, 2, 4, 8))
    for name in ("recall@1", "r_precision", "map@r"):
        assert metrics[f"val_{name}"] == pytest.approx(expected[name], abs=1e-6)


def test_photo_validation_items_are_read_with_the_test_transform(tmp_path):
    """A class folder: validation photos get the deterministic resize + centre crop, not the random train crop."""
    from test_loaders import SIZE, reference_test_tensor, write_image

    for c in range(8):
        for i in range(2):
            write_image(tmp_path / f"class{c}" / f"{i}.png", seed=10 * c + i, size=(48 + 4 * c, 40))
    full = load_dataset(f"folder:{tmp_path}", image_size=SIZE)
    splits, validation = hold_out_validation(full, 2)
    held = validation_classes(4, 2)
    assert validation.class_names == [f"class{c}" for c in held]
    for index in range(len(validation)):
        pixels, label = validation[index]
        path = tmp_path / f"class{held[index // 2]}" / f"{index % 2}.png"
        assert label == index // 2
        np.testing.assert_allclose(pixels.numpy(), reference_test_tensor(path), atol=1e-5)
        assert torch.equal(validation[index][0], pixels)  # deterministic: the same pixels at every read
    assert len(splits.train) == 4 and splits.info.num_train_classes == 2


def test_validation_classes_of_one_image_each_are_refused_before_training(tmp_path):
    """The validation split is scored like the test split: held-out classes of single images could not be."""
    from test_loaders import SIZE, write_image

    for c in range(8):  # the training half (class0-class3) has single images, the test half pairs
        for i in range(1 if c < 4 else 2):
            write_image(tmp_path / f"class{c}" / f"{i}.png", seed=10 * c + i, size=(40, 40))
    full = load_dataset(f"folder:{tmp_path}", image_size=SIZE)
    with pytest.raises(DatasetError, match=r"the validation split \(2 classes held out, fold 0\) has no class "
                                           r"with two or more images \(its 2 classes have one each\)"):
        hold_out_validation(full, 2)


def test_training_without_augmentation_reads_clean_renders():
    """augment=False: the Trainer's batches are the clean renders, as the test split reads its own, every epoch."""
    trainer = Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, augment=False, val_classes=6, max_steps=1,
                                  eval_at_start=False, eval_every=0, snapshot_every=0))
    assert trainer.data.train.batch_transform is None
    renders = load_dataset("glyphs-mini").train.renders
    kept = [c for c in range(24) if c not in set(validation_classes(24, 6).tolist())]
    def first_batch_items(epoch):  # the Trainer's seeded permutation of the epoch, written out
        seed = ((trainer.config.seed * 1_000_003 + epoch) * 10_000_019) % (2**63 - 1)
        order = torch.randperm(len(trainer.data.train), generator=torch.Generator().manual_seed(seed))[:32]
        return [divmod(index, 12) for index in order.tolist()]

    for epoch in (0, 1):
        images, labels = next(trainer.batches.epoch(epoch, 0))
        assert images.shape == (32, 1, 32, 32)
        for row, (label, face) in enumerate(first_batch_items(epoch)):
            assert labels[row] == label
            torch.testing.assert_close(images[row], clean_pixels(renders[kept[label], face]))
    augmented = Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, val_classes=6, max_steps=1))
    images, _ = next(augmented.batches.epoch(0, 0))
    label, face = first_batch_items(0)[0]
    assert not torch.allclose(images[0], clean_pixels(renders[kept[label], face]))


def test_validation_folds_are_class_disjoint_blocks_of_one_fixed_permutation():
    full = load_dataset("glyphs-mini")
    folds = [validation_classes(24, 6, fold) for fold in range(4)]
    assert sorted(np.concatenate(folds).tolist()) == list(range(24))  # four folds of six cover the 24 classes once
    order = np.random.default_rng(2022).permutation(24)  # the project's validation seed, written out
    for fold, held in enumerate(folds):
        assert held.tolist() == sorted(order[6 * fold:6 * (fold + 1)].tolist())
        _, validation = hold_out_validation(full, 6, fold)
        assert validation.class_names == [full.train.class_names[c] for c in held]
    assert np.array_equal(folds[0], validation_classes(24, 6))  # fold 0 is the classes a plain --val-classes holds


def test_a_fold_past_the_last_says_how_many_there_are():
    with pytest.raises(DatasetError, match=r"make 3 class-disjoint folds of that size \(--val-fold 0 to 2\)"):
        hold_out_validation(load_dataset("glyphs-mini"), 7, 3)
    with pytest.raises(ValueError, match="val_fold 1 needs val_classes"):
        TrainConfig(dataset="glyphs-mini", val_fold=1)
