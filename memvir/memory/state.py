"""MemVir's part of a state_dict: its settings, call counter and stored steps, written out and read back checked.

With it a resumed run continues the curriculum where it stopped (docs/method.md, "Algorithm"); the reference code
forgets the memory on resume. Reading checks the whole state before MemVir changes anything, so a damaged state is
a ValueError that says what does not fit and leaves the memory as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memvir.memory.checks import check_count, describe

STATE_VERSION = 1


@dataclass(frozen=True)
class SavedMemory:
    """What a MemVir state holds. `stored`: the stored steps oldest first, as embeddings [L, B, D], labels [L, B]
    and class weights [L, C, D] with B the widest batch the ring holds (None when L = 0); `batch_sizes`: each
    step's own batch size, L of them."""

    num_steps: int
    margin: int
    warmup_steps: int
    schedule: str
    step: int
    num_virtual_sets: int
    batch_sizes: list[int]
    stored: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    # the contents' identity (`StoredSets.memory`) when saved: a loss's kept pairs saved beside it (memvir.losses,
    # "Cache") hold for the memory loaded from it; None in states saved before it was kept
    contents: str | None = None

    def to_state(self) -> dict:
        state = {
            "version": STATE_VERSION,
            "step": self.step,
            "num_virtual_sets": self.num_virtual_sets,
            "num_steps": self.num_steps,
            "margin": self.margin,
            "warmup_steps": self.warmup_steps,
            "schedule": self.schedule,
            "batch_sizes": torch.tensor(self.batch_sizes, dtype=torch.long),
        }
        if self.stored is not None:
            state["embeddings"], state["labels"], state["class_weights"] = self.stored
        if self.contents is not None:
            state["contents"] = self.contents
        return state

    @classmethod
    def from_state(cls, state: dict, schedules: tuple[str, ...]) -> SavedMemory:
        """The state's contents, every part checked: ValueError for an unknown version, a schedule not among
        `schedules` (MemVir's, passed in since MemVir imports this module) or parts that do not fit."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError("MemVir: this state_dict was not written by this version of MemVir (unknown 'version')")
        num_steps = check_count("num_steps (N)", _state_int(state, "num_steps"))
        margin = check_count("margin (M)", _state_int(state, "margin"))
        warmup_steps = check_count("warmup_steps (U)", _state_int(state, "warmup_steps"))
        schedule = state.get("schedule", "curriculum")  # states saved before schedules existed
        if schedule not in schedules:
            raise ValueError(f"MemVir: the state's schedule {schedule!r} is not one of {', '.join(schedules)}")
        step, num_virtual_sets = _state_int(state, "step"), _state_int(state, "num_virtual_sets")
        sizes = state.get("batch_sizes")
        if not isinstance(sizes, torch.Tensor) or sizes.dim() != 1:
            raise ValueError("MemVir: the state's batch_sizes is not a 1-D tensor")
        sizes = [int(size) for size in sizes]
        stored = None
        if sizes:
            stored = _stored_steps(state, len(sizes), num_steps * (margin + 1))
            max_batch = stored[0].shape[1]
            if not all(1 <= size <= max_batch for size in sizes):
                raise ValueError(f"MemVir: the state's batch sizes must lie in [1, {max_batch}], got {sizes}")
        contents = state.get("contents")
        if contents is not None and not isinstance(contents, str):
            raise ValueError(f"MemVir: the state's contents identity must be a string, got {describe(contents)}")
        return cls(num_steps, margin, warmup_steps, schedule, step, num_virtual_sets, sizes, stored, contents)


def _state_int(state: dict, key: str) -> int:
    value = state.get(key)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"MemVir: the state's {key} must be an integer, got {value!r}")
    return value


def _stored_steps(state: dict, count: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The state's stored steps (embeddings [L, B, D], labels [L, B], class weights [L, C, D]), shapes checked."""
    if count > capacity:
        raise ValueError(f"MemVir: the state holds {count} steps but N(M+1) = {capacity}")
    embeddings, labels, weights = (state.get(key) for key in ("embeddings", "labels", "class_weights"))
    fits = (
        isinstance(embeddings, torch.Tensor) and embeddings.is_floating_point() and embeddings.dim() == 3
        and isinstance(weights, torch.Tensor) and weights.is_floating_point() and weights.dim() == 3
        and isinstance(labels, torch.Tensor) and labels.dim() == 2 and not labels.is_floating_point()
        and embeddings.shape[0] == labels.shape[0] == weights.shape[0] == count
        and labels.shape[1] == embeddings.shape[1] and weights.shape[2] == embeddings.shape[2]
    )
    if not fits:
        described = ", ".join(f"{key} {describe(value)}" for key, value in
                              (("embeddings", embeddings), ("labels", labels), ("class_weights", weights)))
        raise ValueError(
            f"MemVir: the state's stored steps do not fit together: {count} steps need embeddings [{count}, B, D], "
            f"labels [{count}, B] and class_weights [{count}, C, D]; got {described}"
        )
    return embeddings, labels, weights
