"""Export: a checkpoint's gallery embeddings with their labels and thumbnails, as a zipped TensorBoard projector
bundle and as `.npz` (memvir.retrieval.export writes both), offered as files to save.

Both are kept in the app's downloads folder beside the checkpoint zips, under a digest of the checkpoint's weights
and the gallery, so asking again reuses them, and pruned with them (demo.retrieve.download).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from demo.retrieve.download import prune
from demo.retrieve.galleries import Gallery, thumbnail

# Pixels a sprite cell: a glyph's own size; TensorBoard shows the cells at a few dozen pixels anyway.
SPRITE_CELL = 32


def _file_stem(checkpoint_name: str, gallery: Gallery) -> str:
    # A Hub id holds a slash; a visitor's zip name may hold anything.
    where = "test-split" if gallery.split is not None else "upload"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{checkpoint_name}-{where}").strip("-.") or "gallery"


def write_exports(checkpoint, gallery: Gallery, vectors, downloads_dir: Path, max_bytes: int,
                  max_age_s: float) -> tuple[Path, Path]:
    """(the projector zip, the .npz) of the gallery as the checkpoint embeds it (`vectors`, [N, D] in gallery
    order), written when missing. The gallery must have labels (ValueError otherwise)."""
    from memvir.retrieval.export import write_npz, write_projector_zip

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
