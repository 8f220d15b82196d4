"""UMAP for the page, in a process of its own: its seconds of CPU never hold the interpreter lock the trainer needs.

`UmapProcess` is one child process (a fresh interpreter: it shares no torch threads or locks with the app) that lowers
its own priority, imports umap, pays numba's compile on a tiny layout at once, then lays out the point sets it is sent
(memvir.projection.umap_layout). `layout(points, seed, init)` blocks only the calling thread, which waits on a pipe.

`UmapService` is what the run manager holds: a memvir.projection.UmapWorker for the all-classes picture, laid out in
the child when a run rests (paused or ended), and a thread that lays out each run's few-class views
(demo/few_class_view.py, `FocusTrack`). While a run trains, the `Pacer` lets those layouts take at most a small
share of one core, measured from the child's CPU time, so training keeps its speed (docs/benchmarks.md, "UMAP while
training"); the snapshots in between keep their PCA. When the run rests, every kept snapshot gets its UMAP, newest
first.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref

import numpy as np

from demo.cores import run_in_background
from demo.settings import REPO_ROOT
from memvir.projection import UmapWorker, project_focus, project_snapshot

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


def _serve(requests, answers) -> None:
    """The child: compile, then answer each (points, seed, init) with (xy, error, CPU seconds), pickled on pipes."""
    from memvir.projection import umap_layout

    started = time.process_time()
    umap_layout(np.random.default_rng(0).normal(size=(24, 8)), 0)  # numba compiles here, not in the first real job
    _send(answers, ("ready", None, time.process_time() - started))
    while True:
        try:
            job = pickle.load(requests)
        except EOFError:  # the app closed the pipe, or is gone
            return
        points, seed, init = job
        started = time.process_time()
        try:
            xy, error = umap_layout(points, seed, init), None
        except Exception as exc:  # noqa: BLE001 - a failed layout is an answer; the child serves on
            xy, error = None, f"{type(exc).__name__}: {exc}"
        _send(answers, (xy, error, time.process_time() - started))


def _send(pipe, message) -> None:
    pickle.dump(message, pipe, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.flush()


class UmapProcess:
    """The child process (`python -m demo.umap_process`, so nothing of the app's main module runs again in it) and
    pipes to it; one layout at a time, thread-safe. A child that died is started again on the next call.
    `last_cpu_s` is the child's CPU time for the last layout, `compile_cpu_s` its start's; `layouts` and `layout_cpu_s`
    count them all (docs/benchmarks.md reads them)."""

    def __init__(self, niceness: int = NICENESS):
        self._niceness = niceness
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._closed = False
        self.last_cpu_s = 0.0
        self.compile_cpu_s: float | None = None
        self.layouts = 0
        self.layout_cpu_s = 0.0

    def start(self) -> None:
        """Start the child now: it compiles while nothing waits for it, rather than in the first layout."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._closed:
            raise UmapFailed("the UMAP process is closed")
        if self._process is not None and self._process.poll() is None:
            return
        self._process = subprocess.Popen(
            [sys.executable, "-m", "demo.umap_process", str(self._niceness)], cwd=REPO_ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.compile_cpu_s = None

    def layout(self, points: np.ndarray, seed: int, init: np.ndarray | None = None) -> np.ndarray:
        """UMAP of `points` [n, D] to [n, 2] in the child (memvir.projection.umap_layout's arguments)."""
        with self._lock:
            self._ensure_started()
            process = self._process
            try:
                if self.compile_cpu_s is None:
                    _, _, self.compile_cpu_s = pickle.load(process.stdout)
                _send(process.stdin, (np.ascontiguousarray(points, dtype=np.float64), seed, init))
                xy, error, self.last_cpu_s = pickle.load(process.stdout)
                self.layouts += 1
                self.layout_cpu_s += self.last_cpu_s
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                process.kill()
                self._process = None  # started again on the next call
                raise UmapFailed(f"the UMAP process ended ({type(exc).__name__})") from exc
        if error is not None:
            raise UmapFailed(error)
        return xy

    def close(self) -> None:
        """End the child: at once if it is idle, else after at most 2 s of the layout it is making."""
        self._closed = True
        process = self._process
        if process is None:
            return
        try:
            process.stdin.close()  # the child reads the end of its input and returns
        except OSError:
            pass
        try:
            process.wait(2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(2)


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
                 pacer: Pacer | None = None):
        self.process = process or UmapProcess()
        self.seed = seed
        self.pacer = pacer or Pacer()

        def project_in_child(snapshot, reference):
            return project_snapshot(snapshot, "umap", max_points=max_points, seed=seed, reference=reference,
                                    layout=self.process.layout)

        super().__init__(project=project_in_child)
        self.process.start()
        self._tracks: weakref.WeakSet = weakref.WeakSet()
        self._wake = threading.Condition()
        self._stopping = False
        self._focus_thread = threading.Thread(target=self._lay_out_focus, name="memvir-umap-focus", daemon=True)
        self._focus_thread.start()

    def watch(self, track) -> None:
        """Lay out `track`'s few-class views from now on (a FocusTrack; kept only while its run is)."""
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

    def _lay_out_focus(self) -> None:
        run_in_background()
        while True:
            with self._wake:
                track, job = self._next_job()
                while track is None and not self._stopping:
                    self._wake.wait(job)
                    track, job = self._next_job()
                if self._stopping:
                    return
            step, points, reference = job
            try:
                projection = project_focus(points, "umap", reference, seed=self.seed, layout=self.process.layout)
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
        self._focus_thread.join(timeout)


if __name__ == "__main__":
    os.nice(int(sys.argv[1]))
    # The answers go on the original stdout; anything a library prints goes to stderr, not into the pipe.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, answers)
