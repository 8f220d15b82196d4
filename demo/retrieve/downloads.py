"""The app's downloads folder: what a visitor saves from the Retrieve tab, bounded in size and age.

- `write_zip`: a checkpoint's Hub files as a zip. A model leaves the app as the files
  `EmbeddingModel.from_pretrained` reads and a person reads (config.json, model.safetensors and the README.md model
  card), in one folder named after the checkpoint inside the zip, under ``<digest of its files>/<checkpoint>.zip``:
  asking again for unchanged weights reuses it, while a run saved since gets a new one.
- `write_exports`: a checkpoint's gallery embeddings with their labels and thumbnails, as a zipped TensorBoard
  projector bundle and as `.npz` (memvir.retrieval.export writes both), under a digest of the checkpoint's weights
  and the gallery, so asking again reuses them.

Each file is written once. Every request prunes the folder: files unused for longer than the age limit go, then the
least recently used until the rest fit the size limit (the files just asked for stay).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
import time
import uuid
import zipfile
from pathlib import Path

from demo.retrieve.galleries import Gallery, thumbnail
from memvir.hub import HUB_FILES
from memvir.retrieval.export import write_npz, write_projector_zip

_CHUNK_BYTES = 1024**2
# Pixels a sprite cell: a glyph's own size; TensorBoard shows the cells at a few dozen pixels anyway.
SPRITE_CELL = 32
# One app process serves every visitor: a zip is never pruned while another request writes or reuses it.
_LOCK = threading.Lock()


def _digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0".encode())
        with open(path, "rb") as file:
            while chunk := file.read(_CHUNK_BYTES):
                digest.update(chunk)
    return digest.hexdigest()[:24]


def write_zip(checkpoint_dir: Path, downloads_dir: Path, max_bytes: int, max_age_s: float) -> Path:
    """The zip of the checkpoint's Hub files (config.json, model.safetensors, README.md), written when missing.

    ValueError when the folder lacks one of them.
    """
    files = [checkpoint_dir / name for name in HUB_FILES]
    missing = [path.name for path in files if not path.is_file()]
    if missing:
        raise ValueError(f"{checkpoint_dir.name} has no {', '.join(missing)} to download yet")
    path = downloads_dir / _digest(files) / f"{checkpoint_dir.name}.zip"
    with _LOCK:
        if path.is_file():
            os.utime(path)  # its last use: pruning goes by it
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{uuid.uuid4().hex}.partial")
            try:
                with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
                    for file in files:
                        archive.write(file, f"{checkpoint_dir.name}/{file.name}")
                partial.rename(path)
            finally:
                partial.unlink(missing_ok=True)
        _prune(downloads_dir, max_bytes, max_age_s, keep=path)
    return path


def prune(downloads_dir: Path, max_bytes: int, max_age_s: float, keep: set[Path]) -> None:
    """Drop the files of ``<downloads>/<digest>/`` (checkpoint zips and gallery exports)
    unused for longer than the age limit, then the least recently used until the rest fit the size limit; the files
    in `keep` stay."""
    with _LOCK:
        _prune(downloads_dir, max_bytes, max_age_s, keep)


def _prune(downloads_dir: Path, max_bytes: int, max_age_s: float, keep) -> None:
    keep = {keep} if isinstance(keep, Path) else keep
    now = time.time()
    files = sorted((path.stat().st_mtime, path) for pattern in ("*/*.zip", "*/*.npz")
                   for path in downloads_dir.glob(pattern))
    total = sum(path.stat().st_size for _, path in files)
    for last_use, path in files:
        if path in keep or (now - last_use <= max_age_s and total <= max_bytes):
            continue
        total -= path.stat().st_size
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the folder may hold the same files zipped under another name
            path.parent.rmdir()


def _file_stem(checkpoint_name: str, gallery: Gallery) -> str:
    # A Hub id holds a slash; a visitor's zip name may hold anything.
    where = "test-split" if gallery.split is not None else "upload"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{checkpoint_name}-{where}").strip("-.") or "gallery"


def write_exports(checkpoint, gallery: Gallery, vectors, downloads_dir: Path, max_bytes: int,
                  max_age_s: float) -> tuple[Path, Path]:
    """(the projector zip, the .npz) of the gallery as the checkpoint embeds it (`vectors`, [N, D] in gallery
    order), written when missing. The gallery must have labels (ValueError otherwise)."""
    if gallery.labels is None:
        raise ValueError("this gallery has no classes to export with its embeddings: choose the test split or "
                         "upload a zip of class folders")
    digest = hashlib.sha256(f"{checkpoint.key}\0{gallery.key}".encode()).hexdigest()[:24]
    stem = _file_stem(checkpoint.name, gallery)
    zip_path = downloads_dir / digest / f"{stem}-projector.zip"
    npz_path = downloads_dir / digest / f"{stem}.npz"
    if zip_path.is_file() and npz_path.is_file():
        for path in (zip_path, npz_path):
            os.utime(path)  # their last use: pruning goes by it
    else:
        thumbnails = [thumbnail(gallery.image(index), gallery.glyphs, SPRITE_CELL) for index in range(gallery.size)]
        write_projector_zip(zip_path, vectors, gallery.labels, gallery.class_names, thumbnails,
                            name=checkpoint.name, cell=SPRITE_CELL)
        write_npz(npz_path, vectors, gallery.labels, gallery.class_names)
    prune(downloads_dir, max_bytes, max_age_s, keep={zip_path, npz_path})
    return zip_path, npz_path
