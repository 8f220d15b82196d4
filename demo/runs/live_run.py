"""LiveRun: one training run as the page sees it, kept from the Trainer's events, and thread-safe to read.

The run trains in a process of its own (demo.runs.process), whose event thread hands the Trainer's events to
`LiveRun._on_event`, which keeps what the page shows, built from the events alone: the records of metrics.jsonl (each
event's `record()`), the latest step, the state, and each snapshot projected to 2-D at once with PCA. Raw snapshot
embeddings are not kept, except the latest, which the UMAP worker may project when the run rests (UMAP takes seconds
of CPU that training would otherwise get), and those of the points that are images (the probe set, the few-class
view's images: a few hundred rows), for their neighbours on a click (demo.train.neighbours). Each snapshot's few-class
view goes to `few_classes` (demo.runs.few_class_track). A finished run is read back from its folder alike
(`from_folder`).

Its live settings are keyed by memvir.config.LIVE_SETTINGS. The changes asked for wait in the Trainer, which applies
the newest of each before its next step; the run only notes which are `pending` until the Trainer's ControlEvent
(or ControlRefused) says what became of them, so that the page can say so beside the controls
(demo.runs.live_changes words it all).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from demo.runs import live_changes
from demo.runs.few_class_track import FewClassTrack
from demo.runs.messages import UNNAMED_CLASSES, Ready
from memvir.checkpoint import RunFolder
from memvir.config import LIVE_SETTINGS
from memvir.events import ControlEvent, ControlRefused, SnapshotEvent, StatusEvent, StepEvent

log = logging.getLogger(__name__)
# Live settings whose changes the page answers beside a control of their own (the classes box), not beside N and M's
OWN_NOTE = ("focus_classes",)


class Pace:
    """A run's pace over its recent wall-clock time, evaluations and other runs' load included, for the time left.

    The Trainer's images/s is a moving average of the steps' own time: it leaves out the pauses between steps
    (evaluations, snapshots, checkpoints) and swings with a moment's load, so an estimate from it jumped by minutes
    between two reads. Steps per second over the last `window` seconds of arrivals is the rate the run really went.
    """

    def __init__(self, window: float = 120.0, least: float = 20.0, clock=time.monotonic):
        self.window, self.least, self.clock = window, least, clock
        self._arrivals: collections.deque[tuple[float, int]] = collections.deque()

    def step(self, step: int) -> None:
        now = self.clock()
        self._arrivals.append((now, step))
        while now - self._arrivals[0][0] > self.window:
            self._arrivals.popleft()

    def restart(self) -> None:
        """Forget the arrivals: the run paused, resumed or restarted, so the time before says nothing of its pace."""
        self._arrivals.clear()

    def steps_per_second(self) -> float | None:
        """None until the arrivals span `least` seconds."""
        if len(self._arrivals) < 2:
            return None
        (first_time, first_step), (last_time, last_step) = self._arrivals[0], self._arrivals[-1]
        span = last_time - first_time
        return (last_step - first_step) / span if span >= self.least and last_step > first_step else None



@dataclass(frozen=True)
class ImageSet:
    """One snapshot's points that are images: where each lies in the full embedding space, and which image it is."""

    split: str  # "train" (the few-class view's images) or "test" (the probe set), of trainer.training_data's splits
    items: np.ndarray  # [n] the images' indices in that split
    labels: np.ndarray  # [n]
    embeddings: np.ndarray  # [n, D] float32 unit rows


def snapshot_images(event) -> dict[str, ImageSet]:
    """A SnapshotEvent's image sets, by the name the page's clicks use; a set whose images it does not name (an
    event from before `probe_items` and `focus_items`) is left out."""
    sets = {}
    for name, split, items, labels, embeddings in (
            ("focus", "train", event.focus_items, event.focus_labels, event.focus_embeddings),
            ("probe", "test", event.probe_items, event.probe_labels, event.probe_embeddings)):
        if len(items) and len(items) == len(labels) == embeddings.shape[0]:
            sets[name] = ImageSet(split, items.numpy().copy(), labels.numpy().copy(),
                                  embeddings.float().numpy().copy())
    return sets


@dataclass(frozen=True)
class SnapshotView:
    """One snapshot as the page keeps it: its 2-D projection (PCA, or UMAP once the worker has it), and its points
    that are images, by set name (`ImageSet`)."""

    step: int
    projected: object  # memvir.analysis.projection.ProjectedSnapshot
    images: dict = field(default_factory=dict)


class LiveRun:
    """One training run as the page sees it. The event thread of its process writes through `_on_event`; page
    handlers read under `lock`. `snapshot_version` grows with every change to the snapshots (the page redraws the
    picture)."""

    def __init__(self, run_id: str, owner: str, folder: Path, config, kind: str = "main"):
        self.id = run_id
        self.owner = owner
        self.folder = folder
        self.config = config  # the configuration it started with (live changes are in `live_values`)
        self.kind = kind  # "main" or "baseline"
        self.lock = threading.Lock()
        self.state = "starting"
        self.message = "starting"
        self.records: list[dict] = []
        self.last_step = None  # the latest StepEvent
        self.pace = Pace()
        self.control_message: str | None = None  # the latest live change's outcome: applied at a step, or refused
        self.live_values = {name: getattr(config, name) for name in LIVE_SETTINGS}
        self.changes: list[live_changes.LiveChange] = []  # every live change applied so far, in order
        self.pending: dict = {}  # changes asked for that the Trainer has not yet applied or refused (`asked`)
        # setting -> (the page that asked, the value) of its latest ask: a page's own change, once applied, is not
        # sent back to it (demo.train.poll), as the visitor may have typed a newer one that is on its way
        self.last_asks: dict = {}
        self.class_names = UNNAMED_CLASSES  # its dataset's, once its process is ready (Ready); none read from a folder
        self.snapshots: list[SnapshotView] = []
        self.latest_raw_snapshot = None
        self.snapshot_version = 0
        self.few_classes = FewClassTrack(resting=lambda: self.resting)
        self.total_steps = 0
        self.baseline: LiveRun | None = None
        self.started_at = time.time()
        self.process = None  # the RunProcess training it (demo.runs.process), the latest one when resumed
        self.ready: Ready | None = None  # what its process said of its Trainer once built
        self.reserved = False  # holds a training slot while its process is being started
        self.resumable_failure = False  # it failed by losing its process, and its last checkpoint is kept
        self._project = None
        self._snapshot_history = 60

    # ---------------------------------------------------------------------------------------------- state
    @property
    def training(self) -> bool:
        """True from Start until its Trainer's last word (running, paused, or about to start)."""
        return self.reserved or (self.process is not None and self.process.alive)

    @property
    def resting(self) -> bool:
        """True while the run does not train: paused, or its trainer done. UMAP may take the CPU then."""
        return not self.training or self.state == "paused"

    @property
    def busy(self) -> bool:
        """True while this run or its baseline trains: it holds a training slot."""
        return self.training or (self.baseline is not None and self.baseline.training)

    @property
    def can_resume(self) -> bool:
        resting = self.state == "stopped" or (self.state == "failed" and self.resumable_failure)
        return not self.training and resting and RunFolder(self.folder).has_state()

    def snapshot_at(self, step: int | None) -> SnapshotView | None:
        """The last snapshot taken at or before `step` (the latest when None; the first when all are later)."""
        with self.lock:
            if not self.snapshots:
                return None
            if step is None:
                return self.snapshots[-1]
            earlier = [view for view in self.snapshots if view.step <= step]
            return earlier[-1] if earlier else self.snapshots[0]

    # ---------------------------------------------------------------------------------------------- its process
    def starting(self) -> tuple[str, str]:
        """Show the run as starting while its process loads (a few seconds); the (state, message) it had."""
        with self.lock:
            previous = self.state, self.message
            self.state, self.message = "starting", "starting"
        return previous

    def launch(self, process, ready: Ready, project, snapshot_history: int) -> None:
        """Follow `process` (a RunProcess whose listener is `self._on_event`), whose Trainer is `ready`: a resumed
        run continues the records its checkpoint holds, and the listener adds the rest."""
        self.process = process
        self.ready = ready
        self._project = project
        self._snapshot_history = snapshot_history
        with self.lock:
            self.records = list(ready.history)
            self.live_values = {name: ready.config.get(name, value) for name, value in self.live_values.items()}
            self.class_names = ready.class_names
            self.changes = live_changes.record_changes(self.records)
            self.total_steps = ready.total_steps
            self.resumable_failure = False
            self.pending = {}  # what a previous process was asked died with it
        self.reserved = False

    def asked(self, changes: dict, page: str | None = None) -> dict:
        """Its process is being asked for these live changes (they apply before its next step): pending until its
        Trainer applies or refuses them. Noted before the ask is sent, as the answer may come before the ask returns.
        A setting asked back to the value it has is no change: the Trainer applies nothing and says nothing of it.
        `page`: the page that asks (its session), None for a client of the API. Returns what was pending before, for
        `withdraw`."""
        with self.lock:
            before = dict(self.pending)
            for name, value in changes.items():
                self.last_asks[name] = (page, value)
                if value == self.live_values.get(name):
                    self.pending.pop(name, None)
                else:
                    self.pending[name] = value
        return before

    def withdraw(self, changes: dict, before: dict) -> None:
        """Its process did not take `changes` (it refused them, or it is gone): what was pending before them stands
        again."""
        with self.lock:
            for name, value in changes.items():
                if self.pending.get(name) == value or (name not in self.pending and value == self.live_values[name]):
                    if name in before:
                        self.pending[name] = before[name]
                    else:
                        self.pending.pop(name, None)

    def refused(self, changes: dict, why: str) -> None:
        """`changes` were refused before they reached its Trainer's steps (`why`: the refusal's own words)."""
        with self.lock:
            self.control_message = f"{live_changes.changes_words(changes, self.live_values)} refused: {why}"

    def controls_note(self) -> str:
        """What the page says beside the live controls: the changes pending, else how the latest one went (applied at
        a step, or refused and why); nothing once the run has stopped training."""
        with self.lock:
            if not self.training:
                return ""
            pending = {name: value for name, value in self.pending.items() if name not in OWN_NOTE}
            if pending:
                return live_changes.pending_words(pending, self.live_values)
            return self.control_message or ""

    def join(self, timeout: float | None = None) -> None:
        """Wait until its process has ended and its last event is kept."""
        if self.process is not None:
            self.process.join(timeout)

    def _on_event(self, event) -> None:
        """The Trainer's listener (its process's event thread): copy what the page shows."""
        if isinstance(event, SnapshotEvent):
            self._add_snapshot(event)
            return
        with self.lock:
            if self._logged(event) or self._turning_point(event):
                self.records.append(event.record())
            if isinstance(event, StepEvent):
                self.last_step = event
                self.pace.step(event.step)
            elif isinstance(event, StatusEvent):
                if event.state != self.state:
                    self.pace.restart()
                self.state, self.message = event.state, event.message
                # only a lost process's failure names a checkpoint (a diverged Trainer's does not): Resume continues it
                self.resumable_failure = event.state == "failed" and event.checkpoint is not None
                if event.state in ("stopped", "finished", "failed"):
                    self.pending = {}  # asks its Trainer never reached end with it
            elif isinstance(event, ControlEvent):
                # an event that does not say what it replaced (one made by hand) replaced the run's live values
                known = {name: self.live_values.get(name) for name in event.changes}
                event = dataclasses.replace(event, previous={**known, **event.previous})
                if set(event.changes) - set(OWN_NOTE):
                    self.control_message = live_changes.applied_words(event)
                self.changes += live_changes.event_changes(event)
                self.live_values.update({k: v for k, v in event.changes.items() if k in self.live_values})
                self._settle(event.changes)
            elif isinstance(event, ControlRefused):
                self.control_message = live_changes.refused_words(event, self.live_values)
                self._settle(event.changes)

    def _settle(self, changes: dict) -> None:
        """`changes` applied or refused: no longer pending, unless a newer ask of the setting waits (under `lock`)."""
        for name, value in changes.items():
            if self.pending.get(name) == value:
                del self.pending[name]

    @staticmethod
    def _logged(event) -> bool:
        """Whether the trainer wrote this event's record to metrics.jsonl, so that the page draws what the file holds
        (and a run loaded from its folder draws alike), and the turning points besides (`_turning_point`): every
        event but steps, and the steps that say so."""
        return not isinstance(event, StepEvent) or event.logged

    def _turning_point(self, event) -> bool:
        """Whether this step is one the charts mark, the first after the warm-up or one where the number of virtual
        sets in use changed, which the trainer's log may leave out (it writes every log_every-th step): kept, the
        marks stand at the steps where these happened, not at the next logged step. A run read back from its folder,
        or resumed (its history is its log's), has only the logged steps before then."""
        last = self.last_step
        return isinstance(event, StepEvent) and last is not None and (
            event.warmup != last.warmup or event.num_virtual_sets != last.num_virtual_sets)

    def _add_snapshot(self, event) -> None:
        self.few_classes.add(event, self._snapshot_history)
        previous = self.snapshots[-1].projected if self.snapshots else None
        try:
            projected = self._project(event, "pca", reference=previous)
        except ValueError as error:  # an unprojectable snapshot is skipped; the run goes on
            log.warning("run %s: snapshot at step %s not projected: %s", self.id, event.step, error)
            return
        with self.lock:
            self.snapshots.append(SnapshotView(event.step, projected, snapshot_images(event)))
            if len(self.snapshots) > self._snapshot_history:
                # Thin out rather than forget the start: the early picture (virtual classes sitting on the real
                # ones) is what scrubbing back is for.
                self.snapshots = self.snapshots[:-1][::2] + [self.snapshots[-1]]
            self.latest_raw_snapshot = event
            self.snapshot_version += 1

    def use_umap(self, worker) -> None:
        """Ask `worker` for a UMAP of the latest snapshot while the run rests (paused or ended), and swap in finished
        ones."""
        with self.lock:
            raw = self.latest_raw_snapshot
            if raw is None:
                return
            key = (self.id, raw.step)
            done = worker.result(key)
            if done is not None:
                self.snapshots = [dataclasses.replace(view, projected=done) if view.step == raw.step else view
                                  for view in self.snapshots]
                self.latest_raw_snapshot = None  # projected for good: the raw embeddings can go
                self.snapshot_version += 1
                return
        if self.resting and worker.error(key) is None:
            worker.submit(key, raw)

    # ---------------------------------------------------------------------------------------------- loaded runs
    @classmethod
    def from_folder(cls, folder: Path, owner: str, config, kind: str) -> LiveRun:
        """A finished run read back from its folder (records only), e.g. a baseline trained earlier."""
        run = cls(folder.name, owner, folder, config, kind)
        run.records = RunFolder(folder).records()
        run.changes = live_changes.record_changes(run.records)
        for change in run.changes:  # where its live changes left it
            run.live_values[change.setting] = change.new
        run.state, run.message = "finished", f"loaded from {folder.name}"
        # finished: it trained every step it had, the last one its records name
        run.total_steps = max((record["step"] for record in run.records if record.get("type") == "step"), default=0)
        return run
