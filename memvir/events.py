"""What a Trainer tells the world: plain dataclasses that a UI, the CLI or a test consume without the Trainer
knowing which. Tensors in snapshots are detached CPU copies, safe to keep or hand to another thread."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch


@dataclass(frozen=True)
class StepEvent:
    """One optimisation step."""

    step: int  # steps done, this one included
    epoch: int  # 0-based epoch this step belongs to
    loss: float | None  # None on a GPU between the steps the Trainer checks (memvir.train.trainer, `_checked`)
    num_classes: int  # s(i): real plus virtual classes the loss saw (paper Fig. 3)
    num_virtual_sets: int  # k, the past steps used as virtual classes
    mean_target_cosine: float | None  # mean cos(x, W_y) of the live rows (paper Fig. 5a); None as loss
    images_per_s: float  # moving average
    lr: float
    warmup: bool  # True while MemVir is still in its warm-up
    # at the spread cadence: memvir.analysis.spread's figures (virtual_weight_cos_j, virtual_embedding_cos_j per set j
    # in use, weight_mean_cos, weight_uniformity); empty on other steps
    spread: dict = field(default_factory=dict)
    # on logged steps: memvir.train.adam_regime's shares of parameters whose Adam step grows with the gradient
    adam: dict = field(default_factory=dict)
    logged: bool = False  # whether the Trainer wrote this step's record to metrics.jsonl (not every step's)
    # what the step multiplied its loss by before the backward (the loss-scale ablations); None in a run without them
    loss_scale: float | None = None

    def record(self) -> dict:
        fields = asdict(self)
        dropped = ("spread", "adam", "logged") + (("loss_scale",) if self.loss_scale is None else ())
        kept = {k: v for k, v in fields.items() if k not in dropped}
        return {"type": "step", **kept, **self.spread, **self.adam}


@dataclass(frozen=True)
class EvalEvent:
    """Retrieval metrics on the test classes."""

    step: int
    epoch: int
    metrics: dict

    def record(self) -> dict:
        return {"type": "eval", "step": self.step, "epoch": self.epoch, **self.metrics}


@dataclass(frozen=True)
class SnapshotEvent:
    """Embeddings for a projection (paper Fig. 7): the live batch (age 0), the memory's steps this step used
    (age j = 1..k, from step t - j(M+1)), and class weights (real: age 0, virtual: age j); a fixed probe set of
    test-class images as a stable reference; and, for a few-class view, the clean training images of a few classes."""

    step: int
    margin: int  # M, so that age j can be shown as "-j(M+1) steps"
    embeddings: torch.Tensor  # [n, D] batch and memory rows
    labels: torch.Tensor  # [n] real class of each row
    ages: torch.Tensor  # [n] 0 = live batch, j = virtual set j
    class_weights: torch.Tensor  # [(k+1)C, D]
    class_weight_labels: torch.Tensor  # [(k+1)C] real class index
    class_weight_ages: torch.Tensor  # [(k+1)C]
    probe_embeddings: torch.Tensor  # [p, D]
    probe_labels: torch.Tensor  # [p] (test-class labels)
    # the few-class view: a few training classes, and the current model's embeddings of their clean training images
    # (their live and virtual weights and stored embeddings are among the rows above, by label)
    focus_classes: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [f]
    focus_embeddings: torch.Tensor = field(default_factory=lambda: torch.empty(0, 0))  # [q, D]
    focus_labels: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [q]
    # which images those are: the probe's indices in the test split, the few-class view's in the training split (as
    # memvir.train.trainer.training_data gives the splits), so that a picture's point can be shown as its image
    probe_items: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [p]
    focus_items: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [q]


@dataclass(frozen=True)
class ControlEvent:
    """A live change (N, M, warm-up, learning rate) took effect before `step`, or a pause/resume happened.
    `previous` holds what each changed setting was before, so that a run's story reads from its records alone."""

    step: int
    changes: dict
    message: str
    previous: dict = field(default_factory=dict)

    def record(self) -> dict:
        kept = {"previous": self.previous} if self.previous else {}
        return {"type": "control", "step": self.step, "message": self.message, **self.changes, **kept}

    @classmethod
    def from_record(cls, record: dict) -> ControlEvent:
        """The event a control record (`record()`) was written from: every field but its own is a change. A record
        written before records carried `previous` reads with none."""
        changes = {name: value for name, value in record.items()
                   if name not in ("type", "step", "message", "previous")}
        return cls(int(record["step"]), changes, str(record.get("message", "")), dict(record.get("previous") or {}))


@dataclass(frozen=True)
class ControlRefused:
    """A live change asked for was not applied before `step`: the memory of its N or M could not be allocated, say.
    The run trains on with the settings it had; `changes` are those refused."""

    step: int
    changes: dict
    reason: str  # why, e.g. the allocator's words
    message: str

    def record(self) -> dict:
        return {"type": "control_refused", "step": self.step, "message": self.message, **self.changes}


@dataclass(frozen=True)
class StatusEvent:
    """The run's state changed: 'running', 'paused', 'stopped', 'finished', 'failed'."""

    state: str
    step: int
    message: str = ""
    checkpoint: str | None = None

    def record(self) -> dict:
        return {"type": "status", "state": self.state, "step": self.step, "message": self.message}
