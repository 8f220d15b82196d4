"""UMAP for the page, in a process of its own: its seconds of CPU never hold the interpreter lock the trainer needs.

`UmapProcess` is one child process (a fresh interpreter: it shares no torch threads or locks with the app;
demo.umap.child is its side) that lowers its own priority, imports umap, pays numba's compile on a tiny layout at
once, then lays out the point sets it is sent (memvir.analysis.projection.umap_layout). `layout(points, seed, init)`
blocks only the calling thread, which waits on a pipe. While a run trains, the child is held stopped between layouts
(`hold`).

`UmapService` is what the run manager holds: a demo.umap.worker.UmapWorker for the all-classes picture, laid out in the
child when a run rests (paused or ended), and a thread that lays out each run's few-class views
(demo.runs.few_class_track, `FewClassTrack`). While a run trains, the `Pacer` lets those layouts take at most a small
share of one core, measured from the child's CPU time, so training keeps its speed (docs/benchmarks.md, "UMAP while
training"); the snapshots in between keep their PCA. When the run rests, every kept snapshot gets its UMAP, newest
first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable

import numpy as np

from demo.common.cores import machine_cores, run_in_background
from demo.common.settings import REPO_ROOT
from demo.umap.child import DIES_WITH_THE_SERVER, send
from demo.umap.worker import UmapWorker
from memvir.analysis.projection import project_few_classes, project_snapshot

log = logging.getLogger(__name__)

# The child's niceness: the scheduler gives the trainer's threads the cores first, and the child the time they leave.
NICENESS = 19
# The most of one core the few-class layouts may take while a run trains, should the trainer leave that much idle: at
# about 0.15 s of CPU a layout, one every 3 s, so that UMAP keeps up with every third snapshot of a run that snapshots
# every second (docs/benchmarks.md, "UMAP while training").
TRAINING_SHARE = 0.05
# How often the few-class thread looks for new snapshots and runs come to rest (the page polls once a second).
IDLE_WAIT_S = 0.5


class UmapFailed(RuntimeError):
    """The child could not lay the points out; the message is its error."""


class UmapProcess:
    """The child process (`python -m demo.umap.child`, so nothing of the app's main module runs again in it) and
    pipes to it; one layout at a time, thread-safe. A child that died is started again on the next call.
    `last_cpu_s` is the child's CPU time for the last layout, `compile_cpu_s` its start's; `layouts` and `layout_cpu_s`
    count them all (docs/benchmarks.md reads them). While `hold`ing, the child is stopped between layouts."""

    def __init__(self, niceness: int = NICENESS):
        self._niceness = niceness
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._closed = False
        self._held = False
        self.last_cpu_s = 0.0
        self.compile_cpu_s: float | None = None
        self.layouts = 0
        self.layout_cpu_s = 0.0

    def start(self) -> None:
        """Start the child now: it compiles while nothing waits for it, rather than in the first layout. Call it
        (and `layout`, which starts a child that ended) from a thread that lasts: on Linux the child ends with the
        thread that started it (demo.umap.child)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._closed:
            raise UmapFailed("the UMAP process is closed")
        if self._process is not None and self._process.poll() is None:
            return
        # numba's threads from the cores this container may use (its CPU quota), not every core the host shows
        environment = {**os.environ, "NUMBA_NUM_THREADS": str(machine_cores())}
        process = subprocess.Popen(
            [sys.executable, "-m", "demo.umap.child", str(self._niceness), str(os.getpid())], cwd=REPO_ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment)
        try:
            pickle.load(process.stdout)  # "alive": it ends with the server from now on, and may be held
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            process.kill()
            raise UmapFailed(f"the UMAP process did not start ({type(exc).__name__})") from exc
        self._process = process
        self.compile_cpu_s = None
        if self._held:
            self._signal(stop=True)

    def hold(self, held: bool) -> None:
        """Stop the child between layouts while `held` (SIGSTOP, and SIGCONT once released); a layout asked for
        meanwhile still runs. Why: even at the lowest priority, the child takes the moments a training run leaves a
        core idle (numba's compile at its start alone takes seconds of CPU), and each time the run's thread wakes on
        that core, it has to wait for the child to be put aside, in a cache the child has filled (docs/benchmarks.md,
        "UMAP while training", has what it cost a run). Stopped, it costs nothing.
        Waits for a layout in progress to end."""
        if not DIES_WITH_THE_SERVER:  # a stopped child the server left behind would stay, stopped, for good
            return
        with self._lock:
            if held != self._held:
                self._held = held
                self._signal(stop=held)

    def _signal(self, stop: bool) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(process.pid, signal.SIGSTOP if stop else signal.SIGCONT)

    def layout(self, points: np.ndarray, seed: int, init: np.ndarray | None = None, **options) -> np.ndarray:
        """UMAP of `points` [n, D] to [n, 2] in the child (memvir.analysis.projection.umap_layout's arguments, its
        keyword options such as n_neighbors among them)."""
        with self._lock:
            self._ensure_started()
            process = self._process
            if self._held:
                self._signal(stop=False)
            try:
                if self.compile_cpu_s is None:
                    _, _, self.compile_cpu_s = pickle.load(process.stdout)
                send(process.stdin, (np.ascontiguousarray(points, dtype=np.float64), seed, init, options))
                xy, error, self.last_cpu_s = pickle.load(process.stdout)
                self.layouts += 1
                self.layout_cpu_s += self.last_cpu_s
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                process.kill()
                self._process = None  # started again on the next call
                raise UmapFailed(f"the UMAP process ended ({type(exc).__name__})") from exc
            finally:
                if self._held:
                    self._signal(stop=True)
        if error is not None:
            raise UmapFailed(error)
        return xy

    def close(self) -> None:
        """End the child: at once if it is idle, else after at most 2 s of the layout it is making."""
        self._closed = True
        process = self._process
        if process is None:
            return
        self._signal(stop=False)  # a stopped child could not read the end of its input
        try:
            process.stdin.close()  # the child reads the end of its input and returns
        except OSError:
            pass
        try:
            process.wait(2)
        except subprocess.TimeoutExpired:
            process.kill()
            # SIGKILL cannot be refused, but on a loaded machine the child may take more than 2 s to be reaped: a
            # close that raised here left the app's own close half done
            process.wait()


class Pacer:
    """Spacing between layouts: after one that took `cost` CPU seconds, the next may start `cost * (1/share - 1)`
    seconds after it ended, so layouts take at most `share` of one core however long each is."""

    def __init__(self, share: float = TRAINING_SHARE):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.share = share
        self._next = 0.0

    def ready_in(self, now: float) -> float:
        """Seconds until a layout may start (0: now)."""
        return max(0.0, self._next - now)

    def spent(self, cost: float, ended: float) -> None:
        self._next = ended + cost * (1 / self.share - 1)


class UmapService(UmapWorker):
    """The page's UMAP: the all-classes picture through UmapWorker's queue (submitted by LiveRun.use_umap when a run
    rests), and the few-class views of the tracks `watch`ed, all laid out in one `UmapProcess`."""

    def __init__(self, max_points: int = 3000, seed: int = 0, process: UmapProcess | None = None,
                 pacer: Pacer | None = None, training: Callable[[], bool] = lambda: False):
        self.process = process or UmapProcess()
        self._training = training  # whether a run trains now: the process is held (stopped) between layouts then
        self.seed = seed
        self.pacer = pacer or Pacer()

        def project_in_child(snapshot, reference):
            return project_snapshot(snapshot, "umap", max_points=max_points, seed=seed, reference=reference,
                                    layout=self.process.layout)

        super().__init__(project=project_in_child)
        self._tracks: weakref.WeakSet = weakref.WeakSet()
        self._wake = threading.Condition()
        self._stopping = False
        self._few_class_thread = threading.Thread(target=self._lay_out_few_classes, name="memvir-umap-few-classes",
                                                  daemon=True)
        self._few_class_thread.start()

    def watch(self, track) -> None:
        """Lay out `track`'s few-class views from now on (a FewClassTrack; kept only while its run is)."""
        track.umap_expected = True
        with self._wake:
            self._tracks.add(track)
            self._wake.notify_all()

    def _next_job(self):
        """(track, job) to lay out now, or (None, seconds to wait)."""
        now = time.monotonic()
        wait = IDLE_WAIT_S
        for track in list(self._tracks):
            if not track.resting():
                ready_in = self.pacer.ready_in(now)
                if ready_in > 0:  # asked only when it may run: asking claims the track's next snapshot
                    wait = min(wait, ready_in)
                    continue
            job = track.next_umap_job()
            if job is not None:
                return track, job
        return None, wait

    def _lay_out_few_classes(self) -> None:
        run_in_background()
        # The child starts now, so that it compiles before the first snapshot needs it, and from this thread, which
        # lasts as long as the service: the kernel ends the child with the thread that started it (DIES_WITH_THE_SERVER)
        try:
            self.process.start()
        except (UmapFailed, OSError) as error:  # closed already, or no process to be had: each layout tries again
            log.warning("the UMAP process did not start: %s", error)
        while True:
            # Outside the lock that `watch` takes: holding waits for an all-classes layout in progress
            self.process.hold(self._training())
            with self._wake:
                if self._stopping:
                    return
                track, job = self._next_job()
                if track is None:
                    self._wake.wait(job)
                    continue
            step, points, reference = job
            try:
                projection = project_few_classes(points, "umap", reference, seed=self.seed, layout=self.process.layout)
            except (UmapFailed, ValueError) as error:
                log.warning("few-class UMAP of step %s failed: %s", step, error)
                track.umap_failed(step)
                continue
            finally:
                self.pacer.spent(self.process.last_cpu_s, time.monotonic())
            track.set_umap(step, projection)

    def close(self, timeout: float | None = 5.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        self.process.close()
        super().close(timeout)
        self._few_class_thread.join(timeout)
