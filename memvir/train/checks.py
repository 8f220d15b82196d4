"""How the Trainer checks its steps' values (labels in range, finite losses) without making a GPU wait for them.

On the CPU a check costs nothing, and MemVir and the loss check every step as it is taken. On a GPU, checking every
step's values would make the GPU wait for the host at every step: there the labels are checked on the CPU, where the
loader made them (`check_labels`), the losses of the steps between two reports stay on the device
(`UncheckedLosses`), and MemVir checks what it stores on the device, storing a bad step as zeros
(memvir.memory.checks.DeferredChecks), until the Trainer next logs, snapshots, evaluates or saves, when one host sync
each checks them all, so a NaN stops the run before any checkpoint holds it.
"""

from __future__ import annotations

import math

import torch


class TrainingDiverged(RuntimeError):
    """The loss, the embeddings or the class weights became NaN or infinite; the last good checkpoint is kept."""


def check_labels(labels: torch.Tensor, num_classes: int) -> None:
    """Labels within the class count, on the CPU tensor the loader made (no device sync)."""
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"the batch holds labels outside [0, {num_classes}): the dataset's labels are damaged")


class UncheckedLosses:
    """The loss and mean target cosine of each step taken since the last check, still on the device."""

    def __init__(self) -> None:
        self._steps: list[tuple[int, torch.Tensor]] = []

    def add(self, step: int, loss: torch.Tensor, mean_target_cosine: torch.Tensor) -> None:
        self._steps.append((step, torch.stack([loss.detach(), mean_target_cosine])))

    def check(self) -> tuple[tuple[int, float] | None, tuple[float, float] | tuple[None, None]]:
        """Read every unchecked step in one host sync: the first step whose loss is NaN or inf, as (step, loss), or
        None; and the latest step's (loss, mean target cosine), (None, None) when no step was unchecked."""
        if not self._steps:
            return None, (None, None)
        steps, self._steps = self._steps, []
        values = torch.stack([stats for _, stats in steps]).tolist()
        diverged = next(((step, loss) for (step, _), (loss, _) in zip(steps, values, strict=True)
                         if not math.isfinite(loss)), None)
        return diverged, (values[-1][0], values[-1][1])
