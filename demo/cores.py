"""How the machine's cores are shared between the web server and the runs' training processes.

Training runs in a process of its own (demo/run_process.py), so the two no longer share one interpreter lock or one
OpenMP pool. The server needs little CPU: serving the polls and drawing the figures once a second took about 5% of
one core while a run trained (docs/benchmarks.md), in bursts of a few milliseconds. So a training process takes
every core on a machine of up to `SMALL_MACHINE_CORES` cores, where keeping a whole core for the server would cost
the run a third to a half of its speed; on larger machines one core stays free for the server, a small share of the
run's speed that keeps pages answering at once however busy the run is. The server itself keeps torch and faiss to
one thread: its tensor work (projecting a snapshot, embedding a query) is small, and threads it spun up would
compete with the run's for the same cores.
"""

from __future__ import annotations

import os
import sys
import threading

SMALL_MACHINE_CORES = 4
SERVER_CORES_ON_LARGER_MACHINES = 1
# How much lower than the rest of its process a background thread runs (Linux niceness, added to the process's).
BACKGROUND_NICENESS = 10


def machine_cores() -> int:
    """The cores this process may run on (a container's or a taskset's share, not the whole machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def training_threads(configured: int | None = None, cores: int | None = None) -> int:
    """torch's threads in a run's process: `configured` (MEMVIR_TRAIN_THREADS) when set, else the cores less the
    server's share; at least 1."""
    if configured is not None:
        return max(1, configured)
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
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + BACKGROUND_NICENESS))
    except OSError:
        pass
