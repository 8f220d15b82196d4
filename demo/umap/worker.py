"""`UmapWorker`: one daemon thread that lays out UMAP projections of snapshots (memvir.analysis.projection) off the
caller's thread, newest job first, each aligned to the previous finished one. The app's UMAP service
(demo.umap.service) is one, whose projections run in its UMAP process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from memvir.analysis.projection import ProjectedSnapshot, project_snapshot
from memvir.events import SnapshotEvent


class UmapWorker:
    """One daemon thread that runs UMAP projections so the caller (the app's poll) never waits for one.

    ``submit(key, snapshot)`` queues a job; only the newest queued job is kept (a pending older one is dropped,
    because while scrubbing only the snapshot on screen matters). ``result(key)`` is the finished projection or
    None; ``error(key)`` is the message of a failed one, which never stops the thread. Each new projection is
    aligned to the previous finished one, so consecutive UMAP pictures keep their orientation. The most recent
    ``max_results`` outcomes are kept.
    """

    def __init__(self, max_points: int = 3000, seed: int = 0,
                 project: Callable[[SnapshotEvent, ProjectedSnapshot | None], ProjectedSnapshot] | None = None,
                 max_results: int = 128):
        """``project(snapshot, reference)`` replaces real UMAP (tests inject a fake one)."""
        if project is None:
            def project(snapshot, reference):
                return project_snapshot(snapshot, "umap", max_points=max_points, seed=seed, reference=reference)
        self._project = project
        self._max_results = max_results
        self._changed = threading.Condition()
        self._pending: tuple[Hashable, SnapshotEvent] | None = None
        self._running: Hashable | None = None
        self._outcomes: OrderedDict[Hashable, tuple[ProjectedSnapshot | None, str | None]] = OrderedDict()
        self._latest: ProjectedSnapshot | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="memvir-umap", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, snapshot: SnapshotEvent) -> None:
        """Queue ``snapshot`` under ``key``, replacing any job still waiting. A key that is running or already
        finished (or failed) is not queued again: the app can submit on every poll without repeating work."""
        with self._changed:
            if self._closed:
                raise RuntimeError("this UmapWorker is closed; create a new one to project more snapshots")
            if key == self._running or key in self._outcomes:
                return
            self._pending = (key, snapshot)
            self._changed.notify_all()

    def result(self, key: Hashable) -> ProjectedSnapshot | None:
        """The finished projection for ``key``; None while queued, running, dropped, failed or never submitted."""
        with self._changed:
            outcome = self._outcomes.get(key)
        return outcome[0] if outcome else None

    def error(self, key: Hashable) -> str | None:
        """Why the projection for ``key`` failed ("ExceptionType: message"), or None."""
        with self._changed:
            outcome = self._outcomes.get(key)
        return outcome[1] if outcome else None

    def pending(self, key: Hashable) -> bool:
        """True while ``key`` is queued or running (the app shows "UMAP running..." then)."""
        with self._changed:
            return key == self._running or (self._pending is not None and self._pending[0] == key)

    def wait(self, key: Hashable, timeout: float | None = None) -> bool:
        """Block until ``key`` is no longer pending (finished, failed or dropped); False if ``timeout`` ran out."""
        with self._changed:
            return self._changed.wait_for(
                lambda: key != self._running and (self._pending is None or self._pending[0] != key), timeout)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop the thread after its current job (a queued job is dropped). Waits up to ``timeout`` seconds; the
        thread is a daemon, so a UMAP still running then cannot keep the process alive."""
        with self._changed:
            self._closed = True
            self._pending = None
            self._changed.notify_all()
        self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending is not None or self._closed)
                if self._closed:
                    return
                key, snapshot = self._pending
                self._pending, self._running = None, key
                reference = self._latest
            try:
                outcome = (self._project(snapshot, reference), None)
            except Exception as exc:  # noqa: BLE001 - any failure becomes a message; the thread must live on
                outcome = (None, f"{type(exc).__name__}: {exc}")
            with self._changed:
                self._outcomes[key] = outcome
                while len(self._outcomes) > self._max_results:
                    self._outcomes.popitem(last=False)
                if outcome[0] is not None:
                    self._latest = outcome[0]
                self._running = None
                self._changed.notify_all()
