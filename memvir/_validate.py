"""The argument and tensor checks that memvir's parts share, each a ValueError that names the argument and says
what it accepts: the losses' hyper-parameters, and the one contract of a training step's tensors (embeddings [B, D],
labels [B] in [0, C), class weights [C, D]) that the losses (memvir.losses) and MemVir (memvir.memory) both take,
in one wording, prefixed with who refuses them."""

import math

import torch


def _real(name: str, value) -> float:
    """``value`` as a finite float, or a ValueError naming the hyper-parameter."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def positive(name: str, value) -> float:
    value = _real(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def non_negative(name: str, value) -> float:
    value = _real(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def angular_margin(value) -> float:
    """An additive angle: theta + m must stay a meaningful angle, so 0 <= m < pi."""
    value = non_negative("margin", value)
    if value >= math.pi:
        raise ValueError(f"margin is an angle in radians and must be < pi ({math.pi:.6f}), got {value!r}")
    return value


def check_classes_per_set(classes_per_set, num_classes: int) -> None:
    valid = isinstance(classes_per_set, int) and not isinstance(classes_per_set, bool) and classes_per_set >= 1
    if not valid or num_classes % classes_per_set:
        raise ValueError(
            f"classes_per_set must be a positive integer that divides the {num_classes} class-weight rows "
            f"(MemVir's sets of C classes each), got {classes_per_set!r}"
        )


def check_inputs(embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor,
                 check_values: bool = True, who: str = "") -> None:
    """ValueError naming the argument and the shapes given, for anything the step's contract does not accept;
    `check_values` adds the label range (a host sync). `who` ("MemVir") starts each message."""
    try:
        _check_inputs(embeddings, labels, class_weights, check_values)
    except ValueError as error:
        raise ValueError(f"{who}: {error}" if who else str(error)) from None


def _check_inputs(embeddings, labels, class_weights, check_values: bool) -> None:
    for arg_name, tensor in (("embeddings", embeddings), ("labels", labels), ("class_weights", class_weights)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{arg_name} must be a torch.Tensor, got {type(tensor).__name__}")
    if embeddings.dim() != 2 or not embeddings.is_floating_point():
        raise ValueError(
            f"embeddings must be a 2-D floating tensor [B, D], got shape {tuple(embeddings.shape)} "
            f"and dtype {embeddings.dtype}"
        )
    if class_weights.dim() != 2 or not class_weights.is_floating_point():
        raise ValueError(
            f"class_weights must be a 2-D floating tensor [C, D], got shape {tuple(class_weights.shape)} "
            f"and dtype {class_weights.dtype}"
        )
    if embeddings.shape[1] != class_weights.shape[1]:
        raise ValueError(
            f"embeddings [B, D] and class_weights [C, D] must have the same D, got embeddings "
            f"{tuple(embeddings.shape)} and class_weights {tuple(class_weights.shape)}"
        )
    if embeddings.shape[0] == 0 or class_weights.shape[0] == 0:
        raise ValueError(
            f"need at least one embedding row and one class, got embeddings {tuple(embeddings.shape)} "
            f"and class_weights {tuple(class_weights.shape)}"
        )
    if labels.dim() != 1 or labels.shape[0] != embeddings.shape[0]:
        raise ValueError(
            f"labels must be 1-D with one label per embedding row, got labels {tuple(labels.shape)} "
            f"for embeddings {tuple(embeddings.shape)}"
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor (int64), got dtype {labels.dtype}")
    if not check_values:
        return
    num_classes = class_weights.shape[0]
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise ValueError(
            f"labels must lie in [0, {num_classes}) (one class per row of class_weights {tuple(class_weights.shape)}), "
            f"got labels from {low} to {high}"
        )
