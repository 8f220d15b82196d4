"""LiveRun: one training run as the page sees it, kept from the Trainer's events, and thread-safe to read.

The trainer thread reports through a listener (`LiveRun._on_event`) that keeps what the page shows, built from the
events alone: the records of metrics.jsonl (each event's `record()`), the latest step, the state, and each snapshot
projected to 2-D at once with PCA. Raw snapshot embeddings are not kept, except the latest, which the UMAP worker may
project when the run rests (UMAP takes seconds of CPU that training would otherwise get). Each snapshot's few-class
view goes to `focus` (demo/few_class_view.py). A finished run is read back from its folder alike (`from_folder`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from demo.few_class_view import FocusTrack

log = logging.getLogger(__name__)

LIVE_CONTROL_LABELS = {"memvir_n": "N", "memvir_m": "M", "warmup_epochs": "warm-up (epochs)", "lr": "lr",
                       "class_lr": "class lr"}


@dataclass(frozen=True)
class SnapshotView:
    """One snapshot as the page keeps it: its 2-D projection only (PCA, or UMAP once the worker has it)."""

    step: int
    projected: object  # memvir.projection.ProjectedSnapshot


class LiveRun:
    """One training run as the page sees it. The trainer thread writes through `_on_event`; page handlers read
    under `lock`. `snapshot_version` grows with every change to the snapshots (the page redraws the picture)."""

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
        self.control_message: str | None = None
        self.live_values = {name: getattr(config, name) for name in LIVE_CONTROL_LABELS}
        self.snapshots: list[SnapshotView] = []
        self.latest_raw_snapshot = None
        self.snapshot_version = 0
        self.focus = FocusTrack(resting=lambda: self.resting)
        self.total_steps = 0
        self.baseline: LiveRun | None = None
        self.started_at = time.time()
        self.trainer = None
        self.reserved = False  # holds a training slot while its trainer is being built
        self._thread: threading.Thread | None = None
        self._project = None
        self._snapshot_history = 60

    # ---------------------------------------------------------------------------------------------- state
    @property
    def training(self) -> bool:
        """True while the trainer thread is alive (running, paused, or about to start)."""
        return self.reserved or (self._thread is not None and self._thread.is_alive())

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
        from memvir.checkpoint import TRAINER_STATE

        return not self.training and self.state == "stopped" and (self.folder / TRAINER_STATE).is_file()

    def snapshot_at(self, step: int | None) -> SnapshotView | None:
        """The last snapshot taken at or before `step` (the latest when None; the first when all are later)."""
        with self.lock:
            if not self.snapshots:
                return None
            if step is None:
                return self.snapshots[-1]
            earlier = [view for view in self.snapshots if view.step <= step]
            return earlier[-1] if earlier else self.snapshots[0]

    # ---------------------------------------------------------------------------------------------- the thread
    def launch(self, trainer, project, snapshot_history: int) -> None:
        """Run `trainer` (built with `self._on_event` as a listener) on a daemon thread."""
        self.trainer = trainer
        self._project = project
        self._snapshot_history = snapshot_history
        with self.lock:
            # Read once, before the trainer's thread starts: a resumed run continues the records its checkpoint holds
            # (anything the listener got while the trainer was built is among them). The listener adds the rest.
            self.records = list(trainer.history)
            self.total_steps = trainer.total_steps
            self.state, self.message = "starting", "starting"
        self._thread = threading.Thread(target=self._work, name=f"memvir-run-{self.id}", daemon=True)
        self._thread.start()
        self.reserved = False

    def _work(self) -> None:
        from memvir.train import TrainingDiverged

        try:
            self.trainer.run()
        except TrainingDiverged:
            pass  # the trainer already said so in a 'failed' StatusEvent
        except Exception as error:  # noqa: BLE001 - a crash ends this run with a message, never the app
            log.exception("run %s failed", self.id)
            with self.lock:
                self.state, self.message = "failed", f"the run failed: {type(error).__name__}: {error}"
        finally:
            self.trainer = None  # the model, optimizer and memory are on disk now; free them

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _on_event(self, event) -> None:
        """The Trainer's listener (trainer thread): copy what the page shows, quickly."""
        from memvir.events import ControlEvent, SnapshotEvent, StatusEvent, StepEvent

        if isinstance(event, SnapshotEvent):
            self._add_snapshot(event)
            return
        with self.lock:
            if self._logged(event):
                self.records.append(event.record())
            if isinstance(event, StepEvent):
                self.last_step = event
            elif isinstance(event, StatusEvent):
                self.state, self.message = event.state, event.message
            elif isinstance(event, ControlEvent):
                self.control_message = self._describe_control(event)
                self.live_values.update({k: v for k, v in event.changes.items() if k in self.live_values})

    @staticmethod
    def _logged(event) -> bool:
        """Whether the trainer wrote this event's record to metrics.jsonl, so that the page draws what the file holds
        (and a run loaded from its folder draws alike): every event but steps, and the steps that say so."""
        from memvir.events import StepEvent

        return not isinstance(event, StepEvent) or event.logged

    def _describe_control(self, event) -> str:
        """'N 5 -> 10: applied at step 124' in the page's names for the controls."""
        parts = [f"{LIVE_CONTROL_LABELS.get(name, name)} {self.live_values.get(name, '?')} -> {value}"
                 for name, value in event.changes.items()]
        return f"{', '.join(parts)}: applied at step {event.step + 1}"

    def _add_snapshot(self, event) -> None:
        self.focus.add(event, self._snapshot_history)
        previous = self.snapshots[-1].projected if self.snapshots else None
        try:
            projected = self._project(event, "pca", reference=previous)
        except ValueError as error:  # an unprojectable snapshot is skipped; the run goes on
            log.warning("run %s: snapshot at step %s not projected: %s", self.id, event.step, error)
            return
        with self.lock:
            self.snapshots.append(SnapshotView(event.step, projected))
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
                self.snapshots = [SnapshotView(view.step, done) if view.step == raw.step else view
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
        from memvir.checkpoint import METRICS_LOG

        run = cls(folder.name, owner, folder, config, kind)
        run.records = read_records(folder / METRICS_LOG)
        run.state, run.message = "finished", f"loaded from {folder.name}"
        return run


def read_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl; none when it is missing."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut off by a crash: the rest still draws
    return records
