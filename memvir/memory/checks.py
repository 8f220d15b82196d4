"""What MemVir accepts besides the step's tensor contract (memvir._validate): its counts N, M, U, and each step's
label range and finite values, checked in one host sync.

Every refusal is a ValueError that says which input is wrong and how, raised before the memory changes.
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
        checks += [~torch.isfinite(embeddings).all(), ~torch.isfinite(class_weights).all()]
    labels_out_of_range, *non_finite = torch.stack(checks).tolist()  # one device sync for all the checks
    if labels_out_of_range:
        low, high = int(labels.min()), int(labels.max())
        raise ValueError(
            f"MemVir: labels must lie in [0, {num_classes}) (one class per row of class_weights "
            f"{tuple(class_weights.shape)}), got labels from {low} to {high}"
        )
    if any(non_finite):
        rows = int((~torch.isfinite(embeddings)).any(1).sum()), int((~torch.isfinite(class_weights)).any(1).sum())
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
