"""The uploads folder: one unpacked copy per zip content, bounded in size and age.

A zip is unpacked under ``zip-<digest of its bytes>/``, so loading or searching with the same zip again reuses the
copy instead of unpacking another (up to 1 GiB each). Beside each folder, ``zip-<digest>.json`` records the class
root inside it and its size; the record is written last, under a lock, so a folder without one is a leftover of a
crash. The record's modification time is the folder's last use. `prune` keeps the folder within a total size and a
maximum age, the least recently used going first, and never touches a folder a caller says is in use (the dataset
of a run that trains).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

PREFIX = "zip-"
_STAGING_PREFIX = ".unpacking-"
_CHUNK_BYTES = 1024**2
# One app process serves every visitor: reuse, publication and pruning never interleave.
_LOCK = threading.Lock()


def content_key(path: Path) -> str:
    """A digest of the file's bytes: equal zips share one unpacked copy, whatever their names."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _record(uploads_dir: Path, key: str) -> Path:
    return uploads_dir / f"{PREFIX}{key}.json"


def staging_folder(uploads_dir: Path) -> Path:
    """A new private folder path to unpack into before `publish` (hidden, so it is never mistaken for a copy)."""
    return uploads_dir / f"{_STAGING_PREFIX}{uuid.uuid4().hex}"


def find(uploads_dir: Path, key: str) -> Path | None:
    """The class root of the copy of zip `key`, marked as just used; None when there is none."""
    with _LOCK:
        record = _record(uploads_dir, key)
        try:
            class_root = json.loads(record.read_text(encoding="utf-8"))["class_root"]
        except (OSError, ValueError, KeyError):
            return None
        os.utime(record)
        return uploads_dir / f"{PREFIX}{key}" / class_root


def publish(uploads_dir: Path, key: str, staging: Path, class_root: Path, size: int) -> Path:
    """Move an unpacked `staging` folder into place as the copy of zip `key`; its class root. When another
    request published the same zip meanwhile, that copy is kept and `staging` removed."""
    with _LOCK:
        folder = uploads_dir / f"{PREFIX}{key}"
        record = _record(uploads_dir, key)
        if record.is_file():
            shutil.rmtree(staging, ignore_errors=True)
            os.utime(record)
            return folder / json.loads(record.read_text(encoding="utf-8"))["class_root"]
        shutil.rmtree(folder, ignore_errors=True)  # a copy a crash left without its record
        staging.rename(folder)
        relative = class_root.relative_to(staging).as_posix()
        record.write_text(json.dumps({"class_root": relative, "bytes": size}), encoding="utf-8")
        return folder / relative


def _copy_of(uploads_dir: Path, path: Path) -> Path | None:
    """The zip-* folder under `uploads_dir` that holds `path`, if any."""
    try:
        top = Path(path).relative_to(uploads_dir).parts[0]
    except (ValueError, IndexError):
        return None
    return uploads_dir / top if top.startswith(PREFIX) and not top.endswith(".json") else None


def discard(uploads_dir: Path, path: Path) -> None:
    """Delete the copy holding `path` (a zip refused after unpacking: nothing of it stays)."""
    folder = _copy_of(uploads_dir, path)
    if folder is None:
        return
    with _LOCK:
        (uploads_dir / f"{folder.name}.json").unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def prune(uploads_dir: Path, max_bytes: int, max_age_s: float, in_use: Iterable[Path] = ()) -> list[Path]:
    """Delete copies unused for longer than `max_age_s`, then the least recently used until the rest take at most
    `max_bytes`; copies holding a path of `in_use` stay. Returns the folders deleted."""
    if not uploads_dir.is_dir():
        return []
    kept = {folder for folder in (_copy_of(uploads_dir, Path(path)) for path in in_use) if folder is not None}
    now = time.time()
    deleted = []
    with _LOCK:
        copies = []  # (last use, folder, record, bytes)
        for record in uploads_dir.glob(f"{PREFIX}*.json"):
            try:
                size = int(json.loads(record.read_text(encoding="utf-8"))["bytes"])
                copies.append((record.stat().st_mtime, uploads_dir / record.stem, record, size))
            except (OSError, ValueError, KeyError):
                copies.append((0.0, uploads_dir / record.stem, record, 0))  # unreadable: the first to go
        recorded = {folder for _, folder, _, _ in copies}
        for folder in uploads_dir.glob(f"{PREFIX}*"):
            if folder.is_dir() and folder not in recorded and folder not in kept:
                shutil.rmtree(folder, ignore_errors=True)  # no record: a crash's leftover
                deleted.append(folder)
        for staging in uploads_dir.glob(f"{_STAGING_PREFIX}*"):
            if now - staging.stat().st_mtime > max_age_s:  # younger ones may be unpacking right now
                shutil.rmtree(staging, ignore_errors=True)
                deleted.append(staging)
        copies.sort(key=lambda copy: copy[0])
        total = sum(size for *_, size in copies)
        for last_use, folder, record, size in copies:
            if folder in kept or (now - last_use <= max_age_s and total <= max_bytes):
                continue
            record.unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
            deleted.append(folder)
            total -= size
    return deleted
