"""What MemVir accepts: its counts N, M, U, and each step's inputs (shapes, dtypes, label range, finite values).

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


def check_inputs(embeddings, labels, class_weights) -> None:
    """ValueError unless embeddings [B, D], labels [B] and class_weights [C, D] fit together, with B and C > 0."""
    if not _is_float_matrix(embeddings):
        raise ValueError(f"MemVir: embeddings must be a 2-D floating tensor [B, D], got {describe(embeddings)}")
    if not _is_float_matrix(class_weights):
        raise ValueError(f"MemVir: class_weights must be a 2-D floating tensor [C, D], got {describe(class_weights)}")
    integer = isinstance(labels, torch.Tensor) and not (
        labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool  # as the losses refuse
    )
    if not integer or labels.dim() != 1:
        raise ValueError(f"MemVir: labels must be a 1-D integer tensor [B], got {describe(labels)}")
    batch, dim = embeddings.shape
    if batch == 0:
        raise ValueError("MemVir: the batch is empty (embeddings has 0 rows)")
    if labels.shape[0] != batch:
        raise ValueError(f"MemVir: labels has {labels.shape[0]} entries but embeddings has {batch} rows")
    if class_weights.shape[1] != dim:
        raise ValueError(
            f"MemVir: embeddings have dimension {dim} but class_weights have dimension {class_weights.shape[1]}"
        )
    if class_weights.shape[0] == 0:
        raise ValueError("MemVir: class_weights has 0 classes")


def check_values(embeddings, labels, class_weights, storing: bool) -> None:
    """Labels within the class count; NaN/inf refused in a step that will be stored. One host sync for both."""
    batch, num_classes = embeddings.shape[0], class_weights.shape[0]
    checks = [((labels < 0) | (labels >= num_classes)).any()]
    if storing:
        checks += [~torch.isfinite(embeddings).all(), ~torch.isfinite(class_weights).all()]
    labels_out_of_range, *non_finite = torch.stack(checks).tolist()  # one device sync for all the checks
    if labels_out_of_range:
        low, high = int(labels.min()), int(labels.max())
        raise ValueError(
            f"MemVir: labels must lie in [0, {num_classes}) for {num_classes} classes, got values in [{low}, {high}]"
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


def _is_float_matrix(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 2 and value.is_floating_point()
