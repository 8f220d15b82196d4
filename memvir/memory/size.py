"""How many bytes a MemVir memory takes, and the limit past which a setting is refused before anything is allocated.

A full memory holds N(M+1) past steps, each a batch of embeddings, its labels and a copy of the class weights
(docs/method.md, "Memory cost"). A careless N or M asks the allocator for terabytes, so the size is computed first
(`ring_bytes`) and checked against a limit (`check_ring`): MemVir does so when built, on live changes and at the first
step; the Trainer when it is built; the app against the memory the machine has free.
"""

import os

import torch

# The precisions a memory may be stored in, by the names the config, the command line and the app use.
STORE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_MEMORY_ENV = "MEMVIR_MAX_MEMORY_BYTES"
DEFAULT_MAX_MEMORY_BYTES = 16 * 2**30  # room for 520 steps of 11,318 classes at dimension 512 (SOP-sized), float32


class MemoryLimitError(ValueError):
    """N and M whose full memory would take more bytes than the limit; raised before anything is allocated."""


def ring_bytes(num_steps: int, margin: int, batch_size: int, num_classes: int, dim: int,
               dtype: torch.dtype = torch.float32) -> int:
    """Bytes of a full memory: N(M+1) stored steps, each a [B, D] batch, its [B] int64 labels and a [C, D] weight
    matrix in `dtype`. The same figure `MemVir.memory_bytes()` reports once the ring is allocated; computed without
    allocating, so a setting can be checked before it is tried."""
    element = torch.empty((), dtype=dtype).element_size()
    per_step = batch_size * dim * element + batch_size * 8 + num_classes * dim * element
    return num_steps * (margin + 1) * per_step


def memory_limit(max_memory_bytes: int | None = None) -> int:
    """The largest ring allowed, in bytes: `max_memory_bytes` when given, else the environment variable
    MEMVIR_MAX_MEMORY_BYTES, else DEFAULT_MAX_MEMORY_BYTES (16 GiB)."""
    source = "max_memory_bytes"
    if max_memory_bytes is None:
        text = os.environ.get(MAX_MEMORY_ENV, "").strip()
        if not text:
            return DEFAULT_MAX_MEMORY_BYTES
        source = MAX_MEMORY_ENV
        try:
            max_memory_bytes = int(text)
        except ValueError:
            raise ValueError(f"MemVir: {MAX_MEMORY_ENV} must be a whole number of bytes such as 8589934592, "
                             f"got {text!r}") from None
    if isinstance(max_memory_bytes, bool) or not isinstance(max_memory_bytes, int) or max_memory_bytes < 1:
        raise ValueError(f"MemVir: {source} must be a positive whole number of bytes, got {max_memory_bytes!r}")
    return max_memory_bytes


def check_ring(num_steps: int, margin: int, batch_size: int, num_classes: int, dim: int,
               dtype: torch.dtype = torch.float32, limit: int | None = None, at_least: bool = False) -> int:
    """The bytes of a full memory (`ring_bytes`); MemoryLimitError when they pass `limit` (default `memory_limit()`).

    `at_least`: the batch, class count or dimension is not known yet and the figures given are lower bounds."""
    limit = memory_limit(limit)
    needed = ring_bytes(num_steps, margin, batch_size, num_classes, dim, dtype)
    if needed > limit:
        shape = (f"at least {format_bytes(needed)}, even at batch 1, one class and dimension 1" if at_least else
                 f"{format_bytes(needed)} ({needed:,} bytes) at batch {batch_size}, {num_classes} classes, "
                 f"dimension {dim}, {str(dtype).removeprefix('torch.')}")
        # a memory stored in 32 bits is offered in half precision where that fits, with its size
        half = ring_bytes(num_steps, margin, batch_size, num_classes, dim, torch.float16)
        smaller = (f", store the memory in float16/bfloat16 ({format_bytes(half)})"
                   if not at_least and dtype == torch.float32 and half <= limit else "")
        raise MemoryLimitError(
            f"MemVir: N={num_steps}, M={margin} keep N(M+1) = {num_steps * (margin + 1):,} past steps: {shape}, "
            f"over the memory limit of {format_bytes(limit)} ({limit:,} bytes). Lower N or M{smaller}, or raise "
            f"the limit (max_memory_bytes=..., or the {MAX_MEMORY_ENV} environment variable, in bytes)"
        )
    return needed


def format_bytes(count: int) -> str:
    """`count` bytes in binary units, e.g. 16.0 GiB: every size the library and the app write (MemVir's limit, the
    app's memory budget and upload limits)."""
    if count < 1024:
        return f"{count} bytes"
    value = count / 1024
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} EiB"
