"""Run folders and checkpoints on disk: their file names, written atomically, read without unpickling code.

A run folder holds the Hub files of the model (config.json, model.safetensors, README.md), the trainer state for
resume, the run's config and its metrics.jsonl. A kill at any moment leaves a folder that loads: every file is
written beside its final name and renamed over it in one step (`atomic_write`), and a checkpoint's set of files is
written whole into a temporary folder inside the run folder first (`staged`), then renamed file by file, never
unlinking one first. A kill leaves only hidden temporaries behind, which the next writer of the folder removes
(`remove_stale_temporaries`). A full disk (or a file size limit) while writing is a `CheckpointError` that says
so; the previous checkpoint is intact then, since nothing was renamed.

Reading uses ``torch.load(weights_only=True)``, which refuses anything but tensors and plain containers, so a
checkpoint from elsewhere cannot run code. `RunFolder` reads a run folder back (for the app, the CLI and the
benchmarks), tolerantly: a records line cut off by a crash is skipped, not fatal.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG_FILE = "config.json"  # the names huggingface_hub's ModelHubMixin writes and reads
WEIGHTS_FILE = "model.safetensors"
MODEL_CARD = "README.md"
TRAINER_STATE = "trainer_state.pt"
TRAIN_CONFIG = "train_config.json"
METRICS_LOG = "metrics.jsonl"

MODEL_FILES = (CONFIG_FILE, WEIGHTS_FILE)
"""What a folder needs to load as an EmbeddingModel."""

HUB_FILES = (*MODEL_FILES, MODEL_CARD)
"""The model's files on the Hub: the model and its card."""

RUN_MARKERS = (TRAINER_STATE, TRAIN_CONFIG)
"""Files only `memvir train` writes: a folder holding one is a run folder."""

_REPLACE_ORDER = (CONFIG_FILE, WEIGHTS_FILE, MODEL_CARD, TRAINER_STATE)
"""The order `staged` renames a checkpoint's files in. A run's config.json never changes, so a folder caught between
two renames still pairs it with weights of the same shape; the card and the trainer state follow."""

_RUN_FILES = (*HUB_FILES, TRAINER_STATE, TRAIN_CONFIG, METRICS_LOG)
_STAGE_PREFIX = ".checkpoint."
_TEMPORARY_SUFFIX = ".tmp"
_NO_SPACE = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_STARTED = time.time()  # temporaries older than this were left by an earlier process


def _started_now() -> None:
    global _STARTED
    _STARTED = time.time()


# A process forked from one that imported this module (the app's run processes fork from a forkserver that did) is a
# new process: what was written between the import and the fork is an earlier process's too.
os.register_at_fork(after_in_child=_started_now)


class CheckpointError(ValueError):
    """A checkpoint or run folder that cannot be read (missing, damaged, from another version or run) or written
    (e.g. the disk is full); the message says which file and what to do."""


@dataclass(frozen=True)
class RunFolder:
    """A run folder as `memvir train --out DIR` and the app's runs leave it, read back: which files it holds, its
    saved config, its records (metrics.jsonl: one JSON object per logged step, evaluation, live change or status).

    Args:
        path: the folder; it need not exist (then it holds nothing and has no records).
    """

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def records_file(self) -> Path:
        return self.path / METRICS_LOG

    @property
    def state_file(self) -> Path:
        return self.path / TRAINER_STATE

    @property
    def config_file(self) -> Path:
        return self.path / TRAIN_CONFIG

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_FILE

    def is_run(self) -> bool:
        """Whether `memvir train` wrote here (a file only it writes is present)."""
        return any((self.path / marker).exists() for marker in RUN_MARKERS)

    def has_state(self) -> bool:
        """Whether the folder holds a trainer state to resume from."""
        return self.state_file.is_file()

    def has_model(self, weights: bool = True) -> bool:
        """Whether the folder holds a model that loads (config.json and model.safetensors); with `weights` False,
        whether it holds a model's config.json (its weights may be fetched later)."""
        return all((self.path / name).is_file() for name in (MODEL_FILES if weights else (CONFIG_FILE,)))

    def config_dict(self) -> dict:
        """The run's settings as train_config.json holds them (`memvir.config.TrainConfig.from_run_folder` makes a
        TrainConfig of them). CheckpointError when the file is missing or is not a JSON object."""
        try:
            values = json.loads(self.config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{self.config_file} holds no readable run config ({error})") from error
        if not isinstance(values, dict):
            raise CheckpointError(f"{self.config_file} holds no readable run config (not a JSON object)")
        return values

    def records(self) -> list[dict]:
        """The records of metrics.jsonl, oldest first; none when it is missing. A line a crash cut off is skipped."""
        if not self.records_file.is_file():
            return []
        records = []
        for line in self.records_file.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by a crash: the rest still reads
            if isinstance(record, dict):
                records.append(record)
        return records

    def status(self) -> str | None:
        """The state its last status record names ('running', 'stopped', 'finished', 'failed'...), None before any."""
        statuses = [r for r in self.records() if r.get("type") == "status"]
        return statuses[-1].get("state") if statuses else None

    def is_finished(self) -> bool:
        return self.status() == "finished"

    def final_metrics(self) -> dict:
        """The metrics of the run's last evaluation (test, and val_* where validation classes were held out)."""
        evaluations = [r for r in self.records() if r.get("type") == "eval"]
        if not evaluations:
            return {}
        return {k: v for k, v in evaluations[-1].items() if k not in ("type", "step", "epoch")}


def atomic_write(path: Path, write) -> None:
    """Call `write(handle)` on a new file beside `path`, then rename it over `path`: readers, and a kill at any
    moment, see the old file or the new one, never a part. The file gets mode 0644, as a plain open() gives."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMPORARY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)  # mkstemp makes it private
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def staged(folder: Path):
    """Yield a fresh temporary folder inside `folder`; when the block ends, rename each file written there over the
    file of the same name in `folder` (checkpoint files in `_REPLACE_ORDER`, others after), then remove it.

    So `folder` goes from one complete set of files to the next by renames alone. If the block fails, nothing in
    `folder` changes and the temporary folder is removed; a full disk becomes a CheckpointError that says so."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=folder, prefix=_STAGE_PREFIX, suffix=_TEMPORARY_SUFFIX))
    try:
        with _disk_full_as_checkpoint_error(folder):
            yield stage
            names = sorted((entry.name for entry in stage.iterdir()), key=_replace_rank)
            for name in names:
                _fsync(stage / name)
            for name in names:
                os.replace(stage / name, folder / name)
            with contextlib.suppress(OSError):  # some file systems cannot sync a folder; the renames are done
                _fsync(folder)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporaries that killed writers left in `folder` (`.trainer_state.pt.*.tmp` and the like from
    `atomic_write`, `.checkpoint.*.tmp` folders from `staged`) made before this process started; the removed paths.
    Anything else, and a temporary this process may still be writing, stays."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in folder.iterdir():
        name = entry.name
        if not name.endswith(_TEMPORARY_SUFFIX):
            continue
        stage = name.startswith(_STAGE_PREFIX)
        if not (stage or any(name.startswith(f".{ours}.") for ours in _RUN_FILES)):
            continue
        try:
            if entry.is_symlink() or entry.lstat().st_mtime >= _STARTED or entry.is_dir() != stage:
                continue
            if stage:
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except FileNotFoundError:  # another process cleaned it first
            continue
        removed.append(entry)
    return removed


def save_state(state: dict, path: Path) -> None:
    """Write a trainer state atomically (through a Python file, so a write error keeps its errno)."""
    path = Path(path)
    with _disk_full_as_checkpoint_error(_run_folder_of(path)):
        atomic_write(path, lambda handle: torch.save(state, handle))


def save_text(text: str, path: Path) -> None:
    path = Path(path)
    with _disk_full_as_checkpoint_error(_run_folder_of(path)):
        atomic_write(path, lambda handle: handle.write(text.encode()))


def load_state(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: start a new run, or point --out at a run folder that has one")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: say which, never a raw unpickling traceback
        raise CheckpointError(f"cannot read the checkpoint {path} ({type(error).__name__}: {error})") from error


def write_records(records: list[dict], path: Path) -> None:
    """Rewrite a metrics.jsonl from the records a checkpoint holds (a resumed run drops the lines written after it)."""
    save_text("".join(json.dumps(record) + "\n" for record in records), path)


def append_record(record: dict, path: Path) -> None:
    path = Path(path)
    with _disk_full_as_checkpoint_error(_run_folder_of(path)), open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


@contextlib.contextmanager
def _disk_full_as_checkpoint_error(folder: Path):
    """Turn the file system refusing more bytes (disk full, quota, file size limit), however the writer reported
    it, into a CheckpointError that says so and that the files already in `folder` were left as they were."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:
        cause = _out_of_space(error)
        if cause is None:
            raise
        raise CheckpointError(
            f"cannot write to {folder}: the disk is full, or a quota or file size limit was reached ({cause}). "
            f"Nothing was replaced: the previous checkpoint in {folder} is intact. Free some space (or raise the "
            "limit), then continue the run with --resume."
        ) from error


def _out_of_space(error: BaseException | None) -> BaseException | None:
    """The error, `error` or one it arose from, that is the file system refusing more bytes; None if there is none.
    torch.save reports it as a RuntimeError raised while handling the OSError; safetensors only names the OS error
    in its message."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in _NO_SPACE:
            return error
        match = re.search(r"os error (\d+)", str(error))
        if match and int(match.group(1)) in _NO_SPACE:
            return error
        error = error.__cause__ or error.__context__
    return None


def _run_folder_of(path: Path) -> Path:
    """The folder whose files a write to `path` updates: a staged file's is the one around its temporary folder."""
    return path.parent.parent if path.parent.name.startswith(_STAGE_PREFIX) else path.parent


def _replace_rank(name: str) -> tuple[int, str]:
    return (_REPLACE_ORDER.index(name) if name in _REPLACE_ORDER else len(_REPLACE_ORDER), name)


def _fsync(path: Path) -> None:
    """Flush `path` (a file, or a folder's entries) to the disk, so a power cut after the rename keeps the data."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
