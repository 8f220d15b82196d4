"""Events that hold tensors (the Trainer's snapshots) cross from a run's process to the server as small files.

Pickling a snapshot's arrays through the pipe at every snapshot would copy them through the pipe's small buffer in
many pieces, with the interpreter lock held on both sides; a file in the run folder is written once by the process's
sending thread and read once by the server. Generic over the event's dataclass fields: every tensor field goes into
the file, every other field travels in the message as it is, so a field added to `SnapshotEvent` needs nothing here.

Files are written beside their final name and renamed (the server never reads a part), named in the message, and
deleted by the server once read; those of a process that ended with some on their way go then (`remove_files`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

FOLDER = "live-snapshots"  # inside the run folder


@dataclass(frozen=True)
class EventFile:
    """An event whose tensors wait in `path`: `event_type(**fields, **tensors)` is the event again."""

    event_type: type
    path: str
    fields: dict


def holds_tensors(event) -> bool:
    import torch

    return dataclasses.is_dataclass(event) and any(
        isinstance(getattr(event, field.name), torch.Tensor) for field in dataclasses.fields(event))


def to_message(event, run_folder: Path):
    """What goes into the pipe for `event`: an `EventFile` when it holds tensors (written now), else the event."""
    if not holds_tensors(event):
        return event
    import torch

    values = {field.name: getattr(event, field.name) for field in dataclasses.fields(event)}
    tensors = {name: value for name, value in values.items() if isinstance(value, torch.Tensor)}
    folder = Path(run_folder) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    step = values.get("step", 0)
    path = folder / f"{type(event).__name__.lower()}-{step:09d}{_suffix(os.getpid())}"
    partial = path.with_name(f".{path.name}.tmp")
    torch.save(tensors, partial)
    os.replace(partial, path)  # atomic: the message names a whole file
    return EventFile(type(event), str(path),
                     {name: value for name, value in values.items() if name not in tensors})


def from_message(message: EventFile):
    """The event an `EventFile` carries; its file is deleted once read."""
    import torch

    path = Path(message.path)
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)  # tensors only: nothing runs
    finally:
        path.unlink(missing_ok=True)
    return message.event_type(**message.fields, **tensors)


def _suffix(pid: int) -> str:
    return f"-{pid}.pt"


def remove_files(run_folder: Path, pid: int) -> None:
    """The files process `pid` wrote and nobody read (it ended, or was killed, with some on their way), whole or
    partial; the folder too once empty. A resumed run's new process may be writing beside them already."""
    folder = Path(run_folder) / FOLDER
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if path.name.endswith((_suffix(pid), _suffix(pid) + ".tmp")):
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: another process of the run writes there
        folder.rmdir()
