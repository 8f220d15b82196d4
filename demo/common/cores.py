"""How the machine's cores are shared between the web server and the runs' training processes.

Training runs in a process of its own (demo.runs.process), so the two share no interpreter lock and no OpenMP
pool. A training process takes every core on a machine of up to `SMALL_MACHINE_CORES` cores, where keeping a whole
core for the server would cost the run much of its speed; on larger machines one core stays free for the server.
On the small machines the server instead runs below its runs (`yield_to_training`: niced by default,
or in Linux's idle scheduling class, only where a run leaves a core idle), and its background threads below its own
(`run_in_background`): the server needs little CPU, but each time it wakes it takes a core from one of the run's
OpenMP threads, whose partners then wait at the next barrier, so at equal priority a few percent of one core cost a
run far more of its speed (docs/benchmarks.md has the figures).
The server keeps torch and faiss to one thread: its tensor work (projecting a snapshot, embedding a query) is small,
and threads it spun up would compete with the run's for the same cores.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

SMALL_MACHINE_CORES = 4
SERVER_CORES_ON_LARGER_MACHINES = 1
# How much lower than the rest of its process a background thread runs (Linux niceness, added to the process's).
BACKGROUND_NICENESS = 10
# How much lower than the runs' processes the whole server runs on a machine of up to SMALL_MACHINE_CORES cores: a
# little, so that a crowd opening pages is served in a second or two while a page polling every second still costs a
# run little; far below, a crowd's pages waited many seconds (docs/benchmarks.md, "Many watchers").
SERVER_NICENESS = 2
# How the server yields to its runs there (yield_to_training): the idle scheduling class, a lower niceness, or not.
SERVER_PRIORITIES = ("idle", "low", "normal")


CGROUP_ROOT_ENV = "MEMVIR_CGROUP_ROOT"


def cgroup_root() -> Path:
    """Where the cgroup file systems are mounted: MEMVIR_CGROUP_ROOT when set (a test points it at a folder of its
    own), else /sys/fs/cgroup."""
    return Path(os.environ.get(CGROUP_ROOT_ENV) or "/sys/fs/cgroup")


def cgroup_folders(controller: str, pid: int | str = "self", root: Path | None = None) -> Iterator[tuple[Path, bool]]:
    """(folder, is_v1) of `pid`'s cgroups that may limit `controller` ("memory", "cpu"), from its own up to the
    mount's root: cgroup v2's unified hierarchy, and v1's hierarchy of that controller. The path comes from
    /proc/PID/cgroup; inside a container it may name the host's hierarchy while the container sees its own cgroup at
    the mount's root, so every folder from the path up to the root counts."""
    root = cgroup_root() if root is None else root
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            base, v1 = root, False
        elif controller in controllers.split(","):
            base, v1 = root / controllers, True
            if not base.is_dir():  # v1 mounts "cpu,cpuacct" also as "cpu"
                base = root / controller
        else:
            continue
        folder = base / path.strip("/")
        while True:
            yield folder, v1
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent


def _cpu_quota(folder: Path, v1: bool) -> float | None:
    """The cores a cgroup folder's CPU quota allows (quota / period), None without one: v2's cpu.max ("max 100000"
    or "200000 100000"), v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us."""
    try:
        if v1:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        else:
            quota_text, period_text = (folder / "cpu.max").read_text().split()
            if quota_text == "max":
                return None
            quota, period = int(quota_text), int(period_text)
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


@dataclass(frozen=True)
class Cores:
    """What a process may use: the cores of its CPU affinity set, and its cgroup's CPU quota in cores (None without
    one). `count` is the lesser, rounded up as joblib's cpu_count does (a quota of 1.5 cores gives 2 threads)."""

    affinity: int
    quota: float | None

    @property
    def count(self) -> int:
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.ceil(self.quota)))

    def describe(self) -> str:
        quota = "no CPU quota" if self.quota is None else f"a CPU quota of {_cores(self.quota)}"
        return f"{_cores(self.affinity)} in the affinity set, {quota}: {_cores(self.count)} to use"


def _cores(count: float) -> str:
    return f"{count:g} core" + ("" if count == 1 else "s")


def available_cores(root: Path | None = None) -> Cores:
    """This process's cores: a Space's or a container's CPU quota (cgroup `cpu.max`) can be far below the host's
    cores that its affinity set shows, and threads counted from those would crowd the quota."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    quotas = [q for folder, v1 in cgroup_folders("cpu", root=root) if (q := _cpu_quota(folder, v1)) is not None]
    return Cores(affinity, min(quotas) if quotas else None)


def machine_cores() -> int:
    """The cores this process may use: its affinity set's (a taskset's share, not the whole machine's), no more than
    its cgroup's CPU quota allows (`available_cores`)."""
    return available_cores().count


def training_threads(configured: int | None = None, cores: int | None = None) -> int:
    """torch's threads in a run's process: `configured` (MEMVIR_TRAIN_THREADS) when set, else OMP_NUM_THREADS where
    the environment sets it to a whole number (the variable torch itself reads, so a run in the app takes the threads
    the command line would), else the cores less the server's share; at least 1."""
    if configured is not None:
        return max(1, configured)
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit():
        return max(1, int(omp))
    cores = machine_cores() if cores is None else cores
    reserved = 0 if cores <= SMALL_MACHINE_CORES else SERVER_CORES_ON_LARGER_MACHINES
    return max(1, cores - reserved)


def limit_server_threads() -> None:
    """One thread for torch and faiss in the server process (call it before serving)."""
    import torch

    torch.set_num_threads(1)
    try:
        import faiss
    except ImportError:  # faiss is optional: the metrics fall back to torch
        return
    faiss.omp_set_num_threads(1)


def _lower(thread: int, by: int) -> None:
    """Raise `thread`'s niceness by `by` (at most to 19); OSError when refused."""
    os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + by))


def run_in_background() -> None:
    """Lower the calling thread's scheduling priority (by BACKGROUND_NICENESS), for work nobody waits on to the
    millisecond: drawing figures, reading a run's events, sending them from the run's process.

    On a machine whose every core runs a training step, such work has to take a core from one of the run's OpenMP
    threads, and its partners then wait at the next barrier for as long as it runs: a millisecond of it costs the run
    up to a millisecond per thread. At a lower priority the kernel seldom preempts a training thread for it and runs
    it where a core falls idle (between the run's steps, while a batch is assembled), so it costs the run less. The
    work itself is not slowed on an idle machine. Linux only (elsewhere the call would lower the whole process), and
    a refusal changes nothing: the thread just keeps its priority."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError):
        _lower(threading.get_native_id(), BACKGROUND_NICENESS)


# The thread that keeps the priority the server started with, and starts the runs' processes: a new process takes
# its priority from the thread that starts it, and only a privileged user may raise a priority.
_launcher: ThreadPoolExecutor | None = None


def yield_to_training(priority: str = "low", cores: int | None = None) -> bool:
    """Run the server below its runs' processes: on a machine of up to SMALL_MACHINE_CORES cores, where a run's
    threads take every core, lower this thread, and every thread it starts from now on, while the runs' processes are
    started at the priority the server had (`launch`). Call it first thing, before the server starts its threads.
    `priority` (SERVER_PRIORITIES, MEMVIR_SERVER_PRIORITY): "idle" lowers the niceness by SERVER_NICENESS and takes
    Linux's idle scheduling class, "low" only lowers the niceness, "normal" changes nothing. True when lowered.

    Why: there a run's OpenMP threads hold every core, and each time the server wakes (a poll, an event read, its
    event loop's timers) the kernel preempts one of them, and its partners wait at the next barrier. Niced ("low"),
    the server still takes its share by preempting a training thread, at a lower rate. In the idle class, a training
    thread that wakes always takes its core back at once, and the server runs only where a core is left idle: the
    run trains nearest the command line's speed, but a page's answers wait for such moments while the run takes its
    steps, and its first loss point shows much later, which is why "low" is the default (docs/benchmarks.md,
    "the server below its runs", has the measured speeds and delays). On a larger machine a core is kept for the server
    instead, and nothing changes."""
    global _launcher
    if priority not in SERVER_PRIORITIES:
        raise ValueError(f"the server's priority is one of {', '.join(SERVER_PRIORITIES)}, got {priority!r}")
    cores = machine_cores() if cores is None else cores
    if priority == "normal" or sys.platform != "linux" or cores > SMALL_MACHINE_CORES or _launcher is not None:
        return False
    _launcher = ThreadPoolExecutor(1, thread_name_prefix="memvir-launcher")
    _launcher.submit(int).result()  # its thread made now, before the lowering: it keeps the first priority
    try:
        _lower(threading.get_native_id(), SERVER_NICENESS)
    except OSError:
        return False
    if priority == "idle":
        with contextlib.suppress(OSError):  # refused: the niceness alone stays
            os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    return True


def launch(start: Callable[[], T]) -> T:
    """`start()` (a process's start, say) from the thread that kept the server's first priority when the server
    yields to training (`yield_to_training`); in the calling thread otherwise."""
    return start() if _launcher is None else _launcher.submit(start).result()
