"""Trainer checkpoints on disk: written atomically, read without unpickling code.

A crash or a kill while writing leaves the previous checkpoint intact: the new one is written beside it and
renamed over it in one step. Reading uses ``torch.load(weights_only=True)``, which refuses anything but tensors and
plain containers, so a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

TRAINER_STATE = "trainer_state.pt"
TRAIN_CONFIG = "train_config.json"
METRICS_LOG = "metrics.jsonl"


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or from an incompatible version."""


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_state(state: dict, path: Path) -> None:
    _atomic_write(Path(path), lambda handle: torch.save(state, handle))


def save_text(text: str, path: Path) -> None:
    _atomic_write(Path(path), lambda handle: handle.write(text.encode()))


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
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
