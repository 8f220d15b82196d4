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
