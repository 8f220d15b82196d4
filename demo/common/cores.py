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
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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


def machine_cores() -> int:
    """The cores this process may run on (a container's or a taskset's share, not the whole machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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
