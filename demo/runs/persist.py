"""Runs that outlive the container: a resting run's files copied to a persistent folder, and found there again.

A Space's disk is lost when it restarts (a new commit, an update, a sleep). Its persistent storage is a Storage
Bucket mounted as a folder, which uploads a file when it is closed and has no file locking: no place for a live run,
which appends to metrics.jsonl and renames checkpoints into place at every save. So live runs stay on the local disk
(`AppSettings.runs_dir`), and once a run rests (finished, stopped or failed, its process ended) its files are copied
to `AppSettings.persist_dir`: the model's Hub files, its metrics and config, and its trainer state (so that a run cut
off by the server's end can be resumed by any visitor after the restart, as on a server that kept its disk). The
marker listing the copied files and their sizes is written last: a copy that broke off has none, or one that does not
match, and is ignored. A new server copies every complete run it does not have back into its runs folder before it
lists them, so that the Train and Retrieve tabs see them as they saw them before. `RunKeeper` is the run manager's
side of it: the restore at its start, and a copy of each run that comes to rest.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path

from demo.common.cores import run_in_background
from demo.runs.live_run import LiveRun
from memvir.checkpoint import HUB_FILES, METRICS_LOG, TRAIN_CONFIG, TRAINER_STATE
from memvir.events import StatusEvent

log = logging.getLogger(__name__)

RESTING_STATES = ("finished", "stopped", "failed")
"""A run's states after which its process ends and its files stay as they are until a Resume."""
PERSISTED_FILES = (*HUB_FILES, METRICS_LOG, TRAIN_CONFIG, TRAINER_STATE)
"""What of a run folder is kept: everything the app lists, shows, searches with and resumes from."""
COMPLETE = ".complete"  # the marker: {file name: size in bytes} of the copy, written after every file


def save(run_folder: Path, persist_dir: Path) -> Path | None:
    """Copy the run folder's PERSISTED_FILES to `persist_dir`/runs/NAME (the marker last); the copy, or None when the
    folder holds none of them. A copy made before is replaced: its marker goes first, so a copy that breaks off
    half-way is never taken for a complete one."""
    files = [name for name in PERSISTED_FILES if (run_folder / name).is_file()]
    if not files:
        return None
    target = persist_dir / "runs" / run_folder.name
    target.mkdir(parents=True, exist_ok=True)
    (target / COMPLETE).unlink(missing_ok=True)
    sizes = {}
    for name in files:
        shutil.copyfile(run_folder / name, target / name)
        sizes[name] = (target / name).stat().st_size
    (target / COMPLETE).write_text(json.dumps(sizes))
    return target


def complete(copy: Path) -> bool:
    """Whether a copy in the persistent folder is whole: its marker names files that are all there, at their sizes."""
    try:
        sizes = json.loads((copy / COMPLETE).read_text())
        return isinstance(sizes, dict) and bool(sizes) and all(
            isinstance(name, str) and "/" not in name and (copy / name).is_file()
            and (copy / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError):
        return False


def restore(persist_dir: Path, runs_dir: Path) -> list[Path]:
    """Copy every complete run of `persist_dir` that `runs_dir` lacks into it (staged, then renamed into place); the
    run folders restored. Partial copies are left out, with a line in the log."""
    restored = []
    copies = persist_dir / "runs"
    for copy in sorted(copies.iterdir()) if copies.is_dir() else ():
        if not copy.is_dir() or (runs_dir / copy.name).exists():
            continue
        if not complete(copy):
            log.warning("persisted run %s is incomplete (its copy broke off): not restored", copy.name)
            continue
        staging = runs_dir / f".restoring-{copy.name}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in json.loads((copy / COMPLETE).read_text()):
            shutil.copyfile(copy / name, staging / name)
        staging.rename(runs_dir / copy.name)
        restored.append(runs_dir / copy.name)
    return restored


class RunKeeper:
    """Where the app keeps runs past a restart (`persist_dir`; None: nowhere, and the keeper does nothing): what an
    earlier server kept, restored at the start, and each run copied there once it rests, in a thread of its own."""

    def __init__(self, persist_dir: Path | None):
        self.persist_dir = persist_dir
        self._lock = threading.Lock()
        self.copying: list[threading.Thread] = []  # the copies under way, each in its own thread

    def restore_into(self, runs_dir: Path) -> None:
        """What an earlier server kept, back where this one lists its runs; a bucket that cannot be read is logged."""
        if self.persist_dir is None:
            return
        try:
            for folder in restore(self.persist_dir, runs_dir):
                log.info("restored run %s from %s", folder.name, self.persist_dir)
        except OSError as error:
            log.warning("the runs kept in %s could not be restored: %s", self.persist_dir, error)

    def listener(self, run: LiveRun):
        """What hears `run`'s process: the run's own copy of its events and, where runs are kept, a copy of its files
        once it rests."""
        if self.persist_dir is None:
            return run._on_event

        def listen(event) -> None:
            run._on_event(event)
            if isinstance(event, StatusEvent) and event.state in RESTING_STATES:
                thread = threading.Thread(target=self._keep, args=(run,), name=f"memvir-persist-{run.id}",
                                          daemon=True)
                with self._lock:
                    self.copying = [t for t in self.copying if t.is_alive()] + [thread]
                thread.start()

        return listen

    def _keep(self, run: LiveRun) -> None:
        """Copy a resting run's files once its process has ended (its last record written)."""
        run_in_background()
        run.join(60.0)
        try:
            save(run.folder, self.persist_dir)
        except OSError as error:  # a full or vanished mount: the run is still on the local disk
            log.warning("run %s could not be kept in %s: %s", run.id, self.persist_dir, error)

    def wait(self, deadline: float) -> None:
        """Wait for the copies under way (the runs a shutdown stopped, kept past the container's end), until
        `deadline` (time.monotonic()) and at least 5 seconds each."""
        with self._lock:
            copying = list(self.copying)
        for thread in copying:
            thread.join(max(5.0, deadline - time.monotonic()))
