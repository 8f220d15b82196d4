"""What a snapshot holds of its step (memvir.analysis.snapshots.SnapshotMaker, through a real Trainer): the class
weights as they were at that step, also when they are the trainer's own parameter (no virtual set in use)."""

import torch

from memvir.config import TrainConfig
from memvir.events import SnapshotEvent
from memvir.train.trainer import Trainer


def test_a_baseline_snapshot_keeps_its_step_s_class_weights_while_training_goes_on():
    trainer = Trainer(TrainConfig(dataset="glyphs-mini", memvir_n=0, batch_size=32, max_steps=4, snapshot_every=1,
                                  eval_every=0, eval_at_start=False))
    taken = []  # (snapshot, the trainer's class weights when it arrived)

    def keep(event):
        if isinstance(event, SnapshotEvent):
            taken.append((event, trainer.class_weights.detach().clone()))

    trainer.add_listener(keep)
    trainer.run()
    assert [snapshot.step for snapshot, _ in taken] == [1, 2, 3, 4]
    for snapshot, weights in taken:
        torch.testing.assert_close(snapshot.class_weights, weights, rtol=0, atol=0)
    # and the weights did move: the first snapshot is not the last one's weights
    assert not torch.equal(taken[0][0].class_weights, taken[-1][0].class_weights)


def test_a_snapshot_names_the_images_its_probe_and_few_class_rows_are():
    """probe_items index the test split and focus_items the (clean) training split of training_data(config): the
    images there, embedded by the model by hand, are the snapshot's rows, and their labels its labels."""
    from memvir.data.splits import without_augmentation
    from memvir.train.trainer import training_data

    config = TrainConfig(dataset="glyphs-mini", memvir_n=0, batch_size=32, max_steps=1, snapshot_every=1,
                         eval_every=0, eval_at_start=False, val_classes=6, focus_classes=[1, 4])
    trainer = Trainer(config)
    taken = []
    trainer.add_listener(lambda event: taken.append(event) if isinstance(event, SnapshotEvent) else None)
    trainer.run()
    (snapshot,) = taken
    data, validation = training_data(config)
    assert validation is not None and data.info.num_train_classes == trainer.data.info.num_train_classes
    clean = without_augmentation(data)
    model = trainer.model.eval()
    for items, labels, rows, split in ((snapshot.probe_items, snapshot.probe_labels, snapshot.probe_embeddings,
                                        clean.test),
                                       (snapshot.focus_items, snapshot.focus_labels, snapshot.focus_embeddings,
                                        clean.train)):
        assert len(items) == len(rows) > 0
        assert [split.labels[int(i)] for i in items] == labels.tolist()
        with torch.no_grad():
            images = torch.stack([split[int(i)][0] for i in items])
            expected = torch.nn.functional.normalize(model(images).float(), dim=1)
        torch.testing.assert_close(torch.nn.functional.normalize(rows, dim=1), expected, rtol=1e-4, atol=1e-5)
    assert set(snapshot.focus_labels.tolist()) == {1, 4}
