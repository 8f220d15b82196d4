"""MemVir's memory against a budget: a setting whose full memory would not fit is refused before it is tried.

The memory keeps N(M+1) past steps, each a batch of embeddings, its labels and a copy of the class weights
(`memvir.memory.size.ring_bytes`): on the default dataset N = 50, M = 200 needs 5.5 GiB. Allocating that on a machine
without it ends the run (and, live, loses what it trained since its last checkpoint), so the app computes the size
first and refuses a start or a live change past the budget, naming the size, the budget, and the float16 memory when
that would fit. The budget is MEMVIR_MEMORY_BUDGET when set, else half of what the run's process may really take at the
time of the check: the least of the machine's free memory, its cgroup's limit less its usage and its address-space
limit less its size (and on a GPU, the device's free memory), the one that bounds it named in the refusal
(`memory_budget`). A process under a container's limit or a `prlimit` sees the host's free memory in /proc/meminfo,
and a budget from that alone let a run start that failed at its first step. Where nothing is known, nothing is
refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from demo.common.cores import cgroup_folders, cgroup_root

FREE_MEMORY_SHARE = 0.5  # the rest is for the model, activations, datasets and other visitors' searches
UNLIMITED_CGROUP = 2**62  # cgroup v1 writes "no limit" as the largest page-aligned int64, about 9.2e18


class MemoryBudgetExceeded(ValueError):
    """A MemVir setting whose memory would exceed the budget; the message gives both and what would fit."""


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str  # how it was set, for the message
    bound: str = ""  # which limit set it: MEMVIR_MEMORY_BUDGET, MemAvailable, cgroup, RLIMIT_AS or GPU


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


def _read_int(path: Path) -> int | None:
    """The number in a /proc or cgroup file; None when it is missing, unreadable or "max" (no limit)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _available_system_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reclaimable(folder: Path, v1: bool) -> int:
    """The cgroup's inactive file cache: counted in its usage, but the kernel reclaims it before the limit bites."""
    key = "total_inactive_file" if v1 else "inactive_file"
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return 0
    return 0


def _cgroup_headroom(pid: int, root: Path) -> tuple[int, int, int] | None:
    """(limit less usage, limit, usage) of the tightest memory limit on `pid`'s cgroup and its ancestors, in
    cgroup v2 (memory.max, memory.current) or v1 (memory.limit_in_bytes, memory.usage_in_bytes); None without one."""
    tightest = None
    for folder, v1 in cgroup_folders("memory", pid, root):
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes") if v1 else ("memory.max", "memory.current")
        limit, usage = (_read_int(folder / name) for name in files)
        if limit is not None and usage is not None and limit < UNLIMITED_CGROUP:
            usage = max(0, usage - _reclaimable(folder, v1))
            if tightest is None or max(0, limit - usage) < tightest[0]:
                tightest = (max(0, limit - usage), limit, usage)
    return tightest


def _address_space_headroom(pid: int) -> tuple[int, int, int] | None:
    """(limit less size, limit, size) of `pid`'s address space under its RLIMIT_AS; None when it has no limit."""
    import resource

    try:
        limit = resource.prlimit(pid, resource.RLIMIT_AS)[0] if pid != os.getpid() else \
            resource.getrlimit(resource.RLIMIT_AS)[0]
    except (OSError, ValueError, AttributeError):  # AttributeError: no prlimit (not Linux)
        return None
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        size = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return max(0, limit - size), limit, size


def memory_budget(configured: int | None, device, pid: int | None = None, root: Path | None = None) -> Budget | None:
    """The budget for a run on `device` (a torch.device) in process `pid` (default: this one): `configured`
    (MEMVIR_MEMORY_BUDGET) when set, else FREE_MEMORY_SHARE of the least memory the process may take now, of:

    - this machine's free memory (MemAvailable in /proc/meminfo);
    - its cgroup's memory limit less its usage (a container's, a Space's hardware tier; `root`: where the cgroup file
      systems are, default `cgroup_root()`);
    - its address-space limit (RLIMIT_AS, e.g. MEMVIR_RUN_MEMORY_LIMIT or a `prlimit`) less its size;
    - on a GPU, the device's free memory (the memory lives there; checkpoints copy it to the host, so the host's
      limits count too).

    Each is known only where the machine reports it; None when none is."""
    from memvir.memory.size import format_bytes

    if configured is not None:
        return Budget(configured, "set by MEMVIR_MEMORY_BUDGET", "MEMVIR_MEMORY_BUDGET")
    pid = os.getpid() if pid is None else pid
    free = []  # (bytes, what bounds it, in words)
    available = _available_system_memory()
    if available is not None:
        free.append((available, "MemAvailable",
                     f"this machine's free memory, {format_bytes(available)} (MemAvailable)"))
    cgroup = _cgroup_headroom(pid, root or cgroup_root())
    if cgroup is not None:
        left, limit, usage = cgroup
        free.append((left, "cgroup", f"the {format_bytes(left)} that the memory limit of the run's cgroup leaves free, "
                                     f"a limit of {format_bytes(limit)} with {format_bytes(usage)} in use"))
    address_space = _address_space_headroom(pid)
    if address_space is not None:
        left, limit, size = address_space
        free.append((left, "RLIMIT_AS", f"the {format_bytes(left)} that the address-space limit of the run's process "
                                        f"(RLIMIT_AS) leaves it, a limit of {format_bytes(limit)} of which it takes "
                                        f"{format_bytes(size)}"))
    if device.type == "cuda":
        import torch

        gpu = torch.cuda.mem_get_info(device)[0]
        free.append((gpu, "GPU", f"the GPU's free memory, {format_bytes(gpu)}"))
    if not free:
        return None
    least, bound, words = min(free, key=lambda candidate: candidate[0])
    return Budget(int(least * FREE_MEMORY_SHARE), f"{FREE_MEMORY_SHARE:.0%} of {words}; MEMVIR_MEMORY_BUDGET sets "
                                                  "it", bound)


def check_memory(shape: RingShape, num_steps: int, margin: int, budget: Budget | None, dataset: str,
                 running: tuple[int, int] | None = None) -> None:
    """Refuse (MemoryBudgetExceeded) N = `num_steps`, M = `margin` when their full memory exceeds `budget`.

    running: the (N, M) of a training run being changed live. A change that needs no more memory than the run has
    is never refused, and the run's memory dtype stays as it started until a new Start.
    """
    from memvir.memory.size import format_bytes

    needed = shape.bytes(num_steps, margin)
    if budget is None or needed <= budget.bytes or (running is not None and needed <= shape.bytes(*running)):
        return
    message = (f"N = {num_steps} and M = {margin} keep {num_steps * (margin + 1):,} past steps: a memory of "
               f"{format_bytes(needed)} for {dataset} ({shape.num_classes:,} training classes, {shape.dim}-d "
               f"embeddings, batch {shape.batch_size}, {shape.store_dtype}), above the budget of "
               f"{format_bytes(budget.bytes)} ({budget.source}). Lower N or M")
    if shape.store_dtype == "float32":
        half = shape.bytes(num_steps, margin, "float16")
        if half <= budget.bytes:
            where = "choose it under Advanced for a new Start" if running else "choose it under Advanced"
            message += f", or use the float16 memory, which needs {format_bytes(half)} ({where})"
    message += "."
    if running is not None:
        message += f" The run trains on with N = {running[0]} and M = {running[1]}."
    raise MemoryBudgetExceeded(message)
