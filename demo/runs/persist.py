"""Runs that outlive the container: a resting run's files copied to a persistent folder, and found there again.

A Space's disk is lost when it restarts (a new commit, an update, a sleep). Its persistent storage is a Storage
Bucket mounted as a folder, which uploads a file when it is closed and has no file locking: no place for a live run,
which appends to metrics.jsonl and renames checkpoints into place at every save. So live runs stay on the local disk
(`AppSettings.runs_dir`), and once a run rests (finished, stopped or failed, its process ended) its files are copied
to `AppSettings.persist_dir`: the model's Hub files, its metrics and config, and its trainer state (so that a run cut
off by the server's end can be resumed by any visitor after the restart, as on a server that kept its disk). The
marker listing the copied files and their sizes is written last: a copy that broke off has none, or one that does not
match, and is ignored. A new server copies every complete run it does not have back into its runs folder before it
lists them, so that the Train and Retrieve tabs see them as they saw them before.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from memvir.checkpoint import HUB_FILES, METRICS_LOG, TRAIN_CONFIG, TRAINER_STATE

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
