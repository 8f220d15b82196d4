"""A live change never kills a run (issue 29, item 2): when the memory for a new N or M cannot be allocated, the run
keeps its memory and trains on, and the change is refused with the allocator's reason. Before, the allocation's
RuntimeError ended the run, with what it had trained since its last checkpoint."""

import json

import pytest
import torch

from memvir import TrainConfig, Trainer
from memvir.events import ControlEvent, ControlRefused, StatusEvent, StepEvent
from memvir.memory.virtual_classes import MemVir

CPU_REFUSAL = ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99999999999 bytes. Error code 12 "
               "(Cannot allocate memory)")


def small_config(**overrides):
    values = dict(dataset="glyphs-mini", batch_size=32, epochs=2, memvir_n=2, memvir_m=1, warmup_epochs=0,
                  snapshot_every=0, eval_every=0, eval_at_start=False, log_every=1, checkpoint_every=1000)
    return TrainConfig(**{**values, **overrides})


@pytest.fixture
def allocator_refuses_large_rings(monkeypatch):
    """The memory's allocation fails, as the allocator's does, for a ring of more than 4 steps (the run's own, 4
    steps at N = 2, M = 1, is allocated)."""
    new_ring = MemVir._new_ring

    def refusing(self, capacity, *args, **kwargs):
        if capacity > 4:
            raise RuntimeError(CPU_REFUSAL)
        return new_ring(self, capacity, *args, **kwargs)

    monkeypatch.setattr(MemVir, "_new_ring", refusing)


@pytest.mark.parametrize("error", [RuntimeError(CPU_REFUSAL), MemoryError(), torch.OutOfMemoryError(
    "CUDA out of memory. Tried to allocate 93.13 GiB")])
def test_a_change_whose_memory_cannot_be_allocated_is_refused_and_the_run_trains_on(tmp_path, monkeypatch, error):
    new_ring = MemVir._new_ring

    def refusing(self, capacity, *args, **kwargs):
        if capacity > 4:
            raise error
        return new_ring(self, capacity, *args, **kwargs)

    monkeypatch.setattr(MemVir, "_new_ring", refusing)
    trainer = Trainer(small_config(), tmp_path / "run")
    events = []
    trainer.add_listener(events.append)
    # at step 4 the ring (4 steps) is full; N = 5 needs 10
    trainer.add_listener(lambda e: trainer.update(memvir_n=5, lr=5e-4) if isinstance(e, StepEvent)
                         and e.step == 4 else None)
    assert trainer.run() == "finished"

    (refused,) = [e for e in events if isinstance(e, ControlRefused)]
    reason = str(error) or "MemoryError"
    assert refused.step == 4 and refused.changes == {"memvir_n": 5} and refused.reason == reason.splitlines()[0]
    assert refused.message == (f"memvir_n 2 -> 5: refused at step 5, the memory could not be allocated "
                               f"({reason.splitlines()[0]}); the run trains on with memvir_n 2, memvir_m 1")
    # the rest of the change applies; the memory and N stay as they were
    (control,) = [e for e in events if isinstance(e, ControlEvent)]
    assert control.changes == {"lr": 5e-4} and trainer.config.lr == 5e-4
    assert trainer.config.memvir_n == 2 and trainer.memvir.num_steps == 2 and trainer.memvir.capacity == 4
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert [e.step for e in steps] == list(range(1, trainer.total_steps + 1))
    assert all(e.num_virtual_sets == 2 for e in steps[4:])
    assert isinstance(events[-1], StatusEvent) and events[-1].state == "finished"
    # the run folder says so too
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if r["type"] == "control_refused"] == [
        {"type": "control_refused", "step": 4, "message": refused.message, "memvir_n": 5}]


def test_a_later_change_that_fits_still_applies(allocator_refuses_large_rings):
    trainer = Trainer(small_config(epochs=3))
    events = []
    trainer.add_listener(events.append)

    def steer(event):
        if isinstance(event, StepEvent) and event.step == 4:
            trainer.update(memvir_n=3, memvir_m=2)  # 9 steps: refused
        elif isinstance(event, StepEvent) and event.step == 6:
            trainer.update(memvir_n=1, memvir_m=3)  # 4 steps: fits

    trainer.add_listener(steer)
    assert trainer.run() == "finished"
    assert [e.changes for e in events if isinstance(e, ControlRefused)] == [{"memvir_n": 3, "memvir_m": 2}]
    assert [e.changes for e in events if isinstance(e, ControlEvent)] == [{"memvir_n": 1, "memvir_m": 3}]
    assert (trainer.memvir.num_steps, trainer.memvir.margin) == (1, 3)


def test_an_error_that_is_not_the_allocators_still_ends_the_run(monkeypatch):
    """Only the allocator's refusal is taken for one: any other error in the memory is a bug, and ends the run."""
    def broken(self, *args, **kwargs):
        raise RuntimeError("expected a tensor of dtype float")

    monkeypatch.setattr(MemVir, "_rebuild", broken)
    trainer = Trainer(small_config())
    trainer.add_listener(lambda e: trainer.update(memvir_n=5) if isinstance(e, StepEvent) and e.step == 4 else None)
    with pytest.raises(RuntimeError, match="expected a tensor of dtype float"):
        trainer.run()
