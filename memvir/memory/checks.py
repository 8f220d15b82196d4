"""What MemVir accepts besides the step's tensor contract (memvir._validate): its counts N, M, U, and each step's
label range and finite values, checked in one host sync at the call, or, where a host sync at every step would make a
GPU wait (``check_values=False``), on the device as the step is stored and read back later (`DeferredChecks`).

Every refusal is a ValueError that says which input is wrong and how, raised before the memory changes (a deferred
one when it is read: the step it refused was stored as zeros, never as the values it refused).
"""

from __future__ import annotations

import torch


class NonFiniteError(ValueError):
    """A step's embeddings or class weights hold NaN or inf; the step is refused and nothing is stored."""


def check_count(name: str, value, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"MemVir: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_values(embeddings, labels, class_weights, storing: bool) -> None:
    """Labels within the class count (in memvir._validate's words); NaN/inf refused in a step that will be stored.
    One host sync for both."""
    batch, num_classes = embeddings.shape[0], class_weights.shape[0]
    checks = [((labels < 0) | (labels >= num_classes)).any()]
    if storing:
        # a sum is NaN or inf wherever a value is, in one pass (isfinite().all() takes several, and its own tensor);
        # a sum that overflowed with every value finite is told apart below, before anything is refused
        checks += [~torch.isfinite(embeddings.sum()), ~torch.isfinite(class_weights.sum())]
    labels_out_of_range, *non_finite = torch.stack(checks).tolist()  # one device sync for all the checks
    if labels_out_of_range:
        low, high = int(labels.min()), int(labels.max())
        raise ValueError(
            f"MemVir: labels must lie in [0, {num_classes}) (one class per row of class_weights "
            f"{tuple(class_weights.shape)}), got labels from {low} to {high}"
        )
    if any(non_finite):
        rows = int((~torch.isfinite(embeddings)).any(1).sum()), int((~torch.isfinite(class_weights)).any(1).sum())
        if rows == (0, 0):  # the sums overflowed, every value finite
            return
        raise NonFiniteError(
            f"MemVir: this step holds NaN or inf ({rows[0]} of {batch} embedding rows, {rows[1]} of {num_classes} "
            "class-weight rows); it is refused and nothing is stored, so the memory stays clean for later steps. "
            "The network or the class weights diverged: lower the learning rate or the loss scale, or skip this "
            "batch"
        )


def describe(value) -> str:
    """`value`'s kind, dimensions, dtype and shape, for an error message."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}-D {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__}"


class DeferredChecks:
    """The checks of the steps MemVir stored without a host sync: each step's finite values and label range are
    computed on the device as it is stored (`storable`), folded into one small device tensor, and read in one host
    sync by `check`, at the caller's cadence (the Trainer's logging, snapshots and saves)."""

    def __init__(self) -> None:
        self._record: torch.Tensor | None = None  # [first refused step or -1, any non-finite, any label out of range]

    @staticmethod
    def storable(embeddings, labels, class_weights) -> tuple[torch.Tensor, torch.Tensor]:
        """(all values finite, all labels in [0, C)) as device booleans: no host sync."""
        finite = torch.isfinite(embeddings).all() & torch.isfinite(class_weights).all()
        in_range = ((labels >= 0) & (labels < class_weights.shape[0])).all()
        return finite, in_range

    def note(self, step: int, finite: torch.Tensor, in_range: torch.Tensor) -> None:
        """Record step `step`'s checks, on the device."""
        record = self._record
        if record is None:
            record = torch.tensor([-1, 0, 0], device=finite.device)
        refused = ~(finite & in_range)
        first = torch.where((record[0] < 0) & refused, step, record[0])
        self._record = torch.stack([first, record[1] | (~finite).long(), record[2] | (~in_range).long()])

    def to(self, fn) -> None:
        """Follow the memory to another device (`fn`, a Module._apply function)."""
        if self._record is not None:
            self._record = fn(self._record)

    def clear(self) -> None:
        self._record = None

    def check(self) -> None:
        """NonFiniteError (or a ValueError for labels out of range) for the steps noted since the last check: one host
        sync. The record starts again either way."""
        if self._record is None:
            return
        first, non_finite, labels_out_of_range = self._record.tolist()
        self._record = None
        if non_finite:
            raise NonFiniteError(
                f"MemVir: a step stored since the last check held NaN or inf (the first refused: step {first}) and was "
                "refused: the memory holds zeros in its place, so it stays clean for later steps. The network or the "
                "class weights diverged: lower the learning rate or the loss scale"
            )
        if labels_out_of_range:
            raise ValueError(
                f"MemVir: a step stored since the last check held labels outside [0, C), C the rows of class_weights "
                f"(the first refused: step {first}), and was refused: the memory holds zeros in its place"
            )
