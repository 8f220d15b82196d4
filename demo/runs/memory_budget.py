"""The memory budget of a run's process: how much MemVir's memory may take there, measured by that process itself.

The memory keeps N(M+1) past steps, each a batch of embeddings, its labels and a copy of the class weights
(`memvir.memory.size.ring_bytes`): on the default dataset N = 50, M = 200 needs 5.5 GiB. Allocating that on a machine
without it ends the run (and, live, loses what it trained since its last checkpoint). So the run's process
(demo.runs.child) measures its budget before it builds its Trainer and hands it over as the Trainer's
`max_memory_bytes`: the library refuses N and M past it, at the start and live, in its own words (sizes, and the
float16 memory where that would fit), and nothing else checks them. The budget is MEMVIR_MEMORY_BUDGET when set, else
half of what the process may really take: the least of the machine's free memory, its cgroup's limit less its usage
and its address-space limit less its size (and on a GPU, the device's free memory, asked by the process that holds the
device, never by the web server), the one that bounds it named (`memory_budget`). A process under a container's limit
or a `prlimit` sees the host's free memory in /proc/meminfo, and a budget from that alone let a run start that failed
at its first step. Where nothing is known, the library's own limit stands.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from demo.common.cores import cgroup_folders, cgroup_root
from memvir.memory.size import format_bytes

FREE_MEMORY_SHARE = 0.5  # the rest is for the model, activations, datasets and other visitors' searches
UNLIMITED_CGROUP = 2**62  # cgroup v1 writes "no limit" as the largest page-aligned int64, about 9.2e18


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str  # how it was set, for the message
    bound: str = ""  # which limit set it: MEMVIR_MEMORY_BUDGET, MemAvailable, cgroup, RLIMIT_AS or GPU


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
