"""MemVir's memory against a budget: a setting whose full memory would not fit is refused before it is tried.

The memory keeps N(M+1) past steps, each a batch of embeddings, its labels and a copy of the class weights
(`memvir.memory.size.ring_bytes`): on the default dataset N = 50, M = 200 needs some 6 GB. Allocating that on a machine
without it ends the run (and, live, loses what it trained since its last checkpoint), so the app computes the size
first and refuses a start or a live change past the budget, naming the size, the budget, and the float16 memory when
that would fit. The budget is MEMVIR_MEMORY_BUDGET when set, else half of the memory free on the run's device at the
time of the check (MemAvailable in /proc/meminfo, or the GPU's free memory); where neither is known, nothing is
refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FREE_MEMORY_SHARE = 0.5  # the rest is for the model, activations, datasets and other visitors' searches


class MemoryBudgetExceeded(ValueError):
    """A MemVir setting whose memory would exceed the budget; the message gives both and what would fit."""


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str  # how it was set, for the message


@dataclass(frozen=True)
class RingShape:
    """What a full memory's size depends on besides N and M: the dataset's training classes C, the embedding
    dimension D, the batch B and the dtype it stores."""

    num_classes: int
    dim: int
    batch_size: int
    store_dtype: str

    def bytes(self, num_steps: int, margin: int, store_dtype: str | None = None) -> int:
        from memvir.memory.size import STORE_DTYPES, ring_bytes

        dtype = STORE_DTYPES[store_dtype or self.store_dtype]
        return ring_bytes(num_steps, margin, self.batch_size, self.num_classes, self.dim, dtype)


def size_text(num_bytes: float) -> str:
    """'5.9 GB', '290.7 MB', '850 kB' (powers of 1000, as memory is usually quoted)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes / 1e3:.0f} kB"


def _available_system_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_budget(configured: int | None, device) -> Budget | None:
    """The budget for a run on `device` (a torch.device): `configured` (MEMVIR_MEMORY_BUDGET) when set, else a
    share of the free memory now; None when that is unknown."""
    if configured is not None:
        return Budget(configured, "set by MEMVIR_MEMORY_BUDGET")
    if device.type == "cuda":
        import torch

        free = torch.cuda.mem_get_info(device)[0]
        where = "the GPU's free memory"
    else:
        free = _available_system_memory()
        where = "this machine's free memory"
        if free is None:
            return None
    return Budget(int(free * FREE_MEMORY_SHARE), f"{FREE_MEMORY_SHARE:.0%} of {where}; MEMVIR_MEMORY_BUDGET sets it")


def check_memory(shape: RingShape, num_steps: int, margin: int, budget: Budget | None, dataset: str,
                 running: tuple[int, int] | None = None) -> None:
    """Refuse (MemoryBudgetExceeded) N = `num_steps`, M = `margin` when their full memory exceeds `budget`.

    running: the (N, M) of a training run being changed live. A change that needs no more memory than the run has
    is never refused, and the run's memory dtype stays as it started until a new Start.
    """
    needed = shape.bytes(num_steps, margin)
    if budget is None or needed <= budget.bytes or (running is not None and needed <= shape.bytes(*running)):
        return
    message = (f"N = {num_steps} and M = {margin} keep {num_steps * (margin + 1):,} past steps: a memory of "
               f"{size_text(needed)} for {dataset} ({shape.num_classes:,} training classes, {shape.dim}-d "
               f"embeddings, batch {shape.batch_size}, {shape.store_dtype}), above the budget of "
               f"{size_text(budget.bytes)} ({budget.source}). Lower N or M")
    if shape.store_dtype == "float32":
        half = shape.bytes(num_steps, margin, "float16")
        if half <= budget.bytes:
            where = "choose it under Advanced for a new Start" if running else "choose it under Advanced"
            message += f", or use the float16 memory, which needs {size_text(half)} ({where})"
    message += "."
    if running is not None:
        message += f" The run trains on with N = {running[0]} and M = {running[1]}."
    raise MemoryBudgetExceeded(message)
