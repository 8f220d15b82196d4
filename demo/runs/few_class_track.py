"""The few-class view of one run's snapshots, as the page keeps it: `FewClassTrack`.

Each snapshot's focus classes (a few training classes: their current embeddings, live class weights, and each virtual
set's stored weights and embeddings of them; memvir.analysis.projection.few_class_points) are projected with PCA at
once, on the trainer's side of the listener (milliseconds for a few hundred points), and with UMAP when the page's UMAP
process gets to them (demo.umap.service, which asks `next_umap_job` and hands back `set_umap`). A few hundred points
make it cheap enough to lay out many snapshots while the run trains, and few enough classes that each virtual set shows
beside its live class: the paper's Fig. 7 (docs/method.md, "What the app shows").

A snapshot without a few-class view (none asked for) is simply not kept here; the all-classes picture still is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from memvir.analysis.projection import (
    FewClassPoints,
    FewClassProjection,
    few_class_points,
    project_few_classes,
    zoomed_extent,
)

log = logging.getLogger(__name__)

# While training, the newest UMAP is shown if it is at most this many kept snapshots behind the newest one; further
# behind, UMAP cannot keep up and the newest snapshot's PCA is shown instead.
UMAP_LAG = 5


@dataclass
class FewClassEntry:
    step: int
    points: FewClassPoints | None  # dropped once UMAP has had its go: a few hundred kB each, 60 kept per run
    pca: FewClassProjection
    umap: FewClassProjection | None = None
    umap_failed: bool = False


@dataclass(frozen=True)
class FewClassView:
    """What the page draws: a projection, the axis ranges that frame its points, and where it sits."""

    projection: FewClassProjection
    x_range: tuple[float, float]
    y_range: tuple[float, float]
    position: int  # 1-based among the kept snapshots
    count: int
    newest_step: int  # the newest kept snapshot's step (a UMAP shown while training may be older)


class FewClassTrack:
    """The few-class projections of one run's snapshots, thread-safe. `version` grows whenever what a view would show
    changes (a snapshot, or a UMAP layout arriving)."""

    def __init__(self, resting: Callable[[], bool] = lambda: True):
        self.resting = resting  # True while the run does not train (paused or ended): UMAP then fills in every snapshot
        self._lock = threading.Lock()
        self._entries: list[FewClassEntry] = []
        self._laying_out: int | None = None  # the step whose UMAP the UMAP process is making
        self.umap_expected = False  # set once a UMAP process watches this track (demo.umap.service)
        self.version = 0

    # ---------------------------------------------------------------------------------------------- snapshots in
    def add(self, snapshot, history: int) -> None:
        """Keep `snapshot`'s few-class view in PCA (trainer thread); at most `history` views, thinned out from the
        start on as LiveRun thins its snapshots, so that both hold the same steps."""
        try:
            points = few_class_points(snapshot)
        except ValueError as error:
            log.debug("snapshot at step %s has no few-class view: %s", snapshot.step, error)
            return
        with self._lock:
            reference = self._entries[-1].pca if self._entries else None
        projection = project_few_classes(points, "pca", reference)
        with self._lock:
            self._entries.append(FewClassEntry(snapshot.step, points, projection))
            if len(self._entries) > history:
                self._entries = self._entries[:-1][::2] + [self._entries[-1]]
            self.version += 1

    # ---------------------------------------------------------------------------------------------- UMAP
    def next_umap_job(self) -> tuple[int, FewClassPoints, FewClassProjection | None] | None:
        """(step, points, reference) of the next snapshot to lay out with UMAP, or None: while the run trains only the
        newest (older ones stay PCA), at rest every one newest first. One at a time per run. The reference is the UMAP
        nearest in steps, for the layout to start from and be turned onto."""
        resting = self.resting()
        with self._lock:
            if self._laying_out is not None or not self._entries:
                return None
            waiting = [entry for entry in self._entries if entry.umap is None and not entry.umap_failed]
            if not waiting or (not resting and waiting[-1] is not self._entries[-1]):
                return None
            chosen = waiting[-1]
            done = [entry for entry in self._entries if entry.umap is not None]
            reference = min(done, key=lambda entry: abs(entry.step - chosen.step)).umap if done else None
            self._laying_out = chosen.step
            return chosen.step, chosen.points, reference

    def set_umap(self, step: int, projection: FewClassProjection) -> None:
        with self._lock:
            self._laying_out = None
            for entry in self._entries:
                if entry.step == step:  # it may have been thinned out meanwhile
                    entry.umap, entry.points = projection, None
                    self.version += 1

    def umap_failed(self, step: int) -> None:
        with self._lock:
            self._laying_out = None
            for entry in self._entries:
                if entry.step == step:
                    entry.umap_failed, entry.points = True, None

    # ---------------------------------------------------------------------------------------------- views out
    def view(self, step: int | None, umap: bool = False) -> FewClassView | None:
        """The view at the last snapshot taken at or before `step` (the newest when None), in PCA, or with `umap` in
        UMAP where it has one. Following the newest in UMAP while the run trains, the newest UMAP stands in if it is
        at most UMAP_LAG snapshots behind; further behind, UMAP cannot keep up and the newest PCA is shown."""
        with self._lock:
            entries = list(self._entries)
        if not entries:
            return None
        if step is None:
            index = len(entries) - 1
            if umap and entries[index].umap is None and not self.resting():
                recent = [i for i in range(max(0, index - UMAP_LAG), index) if entries[i].umap is not None]
                index = recent[-1] if recent else index
        else:
            earlier = [i for i, entry in enumerate(entries) if entry.step <= step]
            index = earlier[-1] if earlier else 0
        entry = entries[index]
        projection = (entry.umap if umap else None) or entry.pca
        x_range, y_range = zoomed_extent(projection)
        return FewClassView(projection, x_range, y_range, index + 1, len(entries), entries[-1].step)

    def umap_waiting(self) -> int:
        """How many kept views still wait for their UMAP (neither laid out nor failed)."""
        with self._lock:
            return sum(1 for entry in self._entries if entry.umap is None and not entry.umap_failed)

    def steps(self) -> list[int]:
        with self._lock:
            return [entry.step for entry in self._entries]
