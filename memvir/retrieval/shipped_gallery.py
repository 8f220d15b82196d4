"""A checkpoint's own gallery: the index of its dataset's test split, kept beside it and used only while it is fresh.

Embedding a gallery is the slow part of a first search (the 12,252 glyphs of the test split take half a minute on
two busy cores), so a checkpoint folder may carry its gallery ready-made in ``gallery/``: the GalleryIndex as
``GalleryIndex.save`` writes it, and ``checkpoint.json``, which records what the index was built from (the sha256 of
the checkpoint's config.json and model.safetensors, and a fingerprint of the split: its labels, class names and the
model inputs of a sample of its items) and the split's retrieval metrics. `load` returns the index only while all of
that still matches, so a retrained checkpoint or a re-rendered dataset gets its index rebuilt, never served stale.
Embeddings and metrics come from memvir.retrieval.evaluation, so they are exactly the evaluation's.

``python -m memvir.retrieval.shipped_gallery FOLDER...`` (``make gallery-index``) builds the index of each checkpoint
folder whose index is missing or stale.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GALLERY_DIR = "gallery"
STAMP_FILE = "checkpoint.json"
_STAMPED_FILES = ("config.json", "model.safetensors")
_FORMAT = "memvir.CheckpointGallery"
_FORMAT_VERSION = 1
# Items whose model inputs enter the fingerprint: enough to see a re-rendering or a changed transform, few enough
# that checking costs milliseconds for glyphs and well under a second for photos read from disk.
_FINGERPRINT_ITEMS = 64
_CHUNK_BYTES = 1024**2


@dataclass(frozen=True)
class CheckpointGallery:
    """The GalleryIndex of a checkpoint's test split (rows in split order, labels beside) and the split's metrics."""

    index: object  # memvir.retrieval.index.GalleryIndex
    metrics: dict[str, float]


def checkpoint_digest(checkpoint_dir: str | Path) -> str:
    """sha256 of the checkpoint's config.json and model.safetensors: what its embeddings depend on."""
    digest = hashlib.sha256()
    for name in _STAMPED_FILES:
        digest.update(f"{name}\0".encode())
        with open(Path(checkpoint_dir) / name, "rb") as file:
            while chunk := file.read(_CHUNK_BYTES):
                digest.update(chunk)
    return digest.hexdigest()


def split_fingerprint(split) -> str:
    """A digest of a split's size, labels, class names and the model inputs (``split[i]``) of evenly spaced items."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.asarray(split.labels, dtype=np.int64).tobytes())
    digest.update(json.dumps(list(split.class_names)).encode())
    size = len(split)
    for item in np.unique(np.linspace(0, size - 1, num=min(size, _FINGERPRINT_ITEMS)).round().astype(int)):
        digest.update(split[int(item)][0].numpy().tobytes())
    return digest.hexdigest()


def staleness(checkpoint_dir: str | Path, split) -> str | None:
    """Why the checkpoint's saved gallery cannot be used for `split` (missing, damaged, built from other weights or
    another split); None when it can."""
    folder = Path(checkpoint_dir) / GALLERY_DIR
    stamp = _read_stamp(folder)
    if isinstance(stamp, str):
        return stamp
    if stamp["checkpoint_sha256"] != checkpoint_digest(checkpoint_dir):
        return "it was built from other weights (config.json or model.safetensors changed)"
    if stamp["size"] != len(split) or stamp["split_fingerprint"] != split_fingerprint(split):
        return "it was built from another version of the dataset's test split"
    return None


def load(checkpoint_dir: str | Path, split) -> CheckpointGallery | None:
    """The checkpoint's saved gallery of `split`; None when there is none or it is stale (see `staleness`)."""
    from memvir.retrieval.index import GalleryIndex

    if staleness(checkpoint_dir, split) is not None:
        return None
    folder = Path(checkpoint_dir) / GALLERY_DIR
    try:
        index = GalleryIndex.load(folder)
    except (ValueError, OSError, RuntimeError):  # faiss reports a damaged file as a RuntimeError
        return None
    if index.labels != split.labels.tolist():
        return None
    return CheckpointGallery(index, _read_stamp(folder)["metrics"])


def build(checkpoint_dir: str | Path, split, dataset_name: str, model=None, save: bool = True,
          batch_size: int = 256, progress: bool = False,
          on_progress: Callable[[float], None] | None = None) -> CheckpointGallery:
    """Embed `split` with the checkpoint (through memvir.retrieval.evaluation), index it, score it, and (with `save`)
    write it beside the checkpoint. `model`: the checkpoint already loaded (else it is loaded here).

    Nothing is saved when the checkpoint's files change while it is embedded (a run still writing): the index would
    belong to neither version. `progress` / `on_progress`: as in `memvir.retrieval.evaluation.embed`.
    """
    from memvir.models.embedding_model import EmbeddingModel
    from memvir.retrieval import evaluation
    from memvir.retrieval.index import GalleryIndex

    checkpoint_dir = Path(checkpoint_dir)
    digest = checkpoint_digest(checkpoint_dir)
    model = model if model is not None else EmbeddingModel.from_pretrained(checkpoint_dir)
    embeddings, labels = evaluation.embed(model, split, batch_size=batch_size, progress=progress,
                                       on_progress=on_progress)
    # Metrics need a class with two items or more (each item queries all others).
    metrics = evaluation.score(embeddings, labels, dataset_name) if len(labels) > len(set(labels.tolist())) else {}
    # A plain array (vectors.npy on disk), which every machine reads, with faiss or without (the GPU machines have
    # none), whichever machine built it; `load` then picks the faster search where it runs.
    gallery = CheckpointGallery(GalleryIndex.build(embeddings, labels=labels, backend="torch"), metrics)
    if save and checkpoint_digest(checkpoint_dir) == digest:
        _save(checkpoint_dir, gallery, {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "checkpoint_sha256": digest,
            "dataset": dataset_name,
            "split": "test",
            "size": len(split),
            "split_fingerprint": split_fingerprint(split),
            "metrics": metrics,
        })
    return gallery


def _save(checkpoint_dir: Path, gallery: CheckpointGallery, stamp: dict) -> None:
    """Write the index and its stamp into a hidden folder, then swap it in: a reader never sees half an index."""
    staging = checkpoint_dir / f".{GALLERY_DIR}-{uuid.uuid4().hex}"
    retired = checkpoint_dir / f".{GALLERY_DIR}-old-{uuid.uuid4().hex}"
    target = checkpoint_dir / GALLERY_DIR
    try:
        gallery.index.save(staging)
        (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=1), encoding="utf-8")
        if target.exists():
            target.rename(retired)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(retired, ignore_errors=True)


def _read_stamp(folder: Path) -> dict | str:
    """The stamp of a saved gallery, or why there is none to use."""
    path = folder / STAMP_FILE
    if not path.is_file():
        return f"there is no {GALLERY_DIR}/{STAMP_FILE}"
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return f"{path} cannot be read ({error})"
    if not isinstance(stamp, dict) or stamp.get("format") != _FORMAT or stamp.get("version") != _FORMAT_VERSION:
        return f"{path} is not a version-{_FORMAT_VERSION} {_FORMAT} stamp"
    return stamp


def main(argv: list[str] | None = None) -> int:
    from memvir.retrieval import evaluation

    parser = argparse.ArgumentParser(description="Build the test-split gallery index beside each checkpoint folder "
                                                 "whose index is missing or stale.")
    parser.add_argument("folders", nargs="+", type=Path, help="checkpoint folders (config.json + model.safetensors)")
    parser.add_argument("--force", action="store_true", help="rebuild even a fresh index")
    args = parser.parse_args(argv)
    for folder in args.folders:
        model, dataset, split = evaluation.load_model_and_split(str(folder))
        reason = staleness(folder, split)
        if reason is None and not args.force:
            print(f"{folder}: {GALLERY_DIR}/ is up to date")
            continue
        gallery = build(folder, split, dataset, model=model, progress=True)
        if staleness(folder, split) is not None:
            print(f"{folder}: its files changed while it was embedded; nothing saved, run again", file=sys.stderr)
            return 1
        size = sum(path.stat().st_size for path in (folder / GALLERY_DIR).iterdir())
        print(f"{folder}: built {GALLERY_DIR}/ ({reason or 'forced'}): {len(gallery.index):,} items, "
              f"{size / 1e6:.1f} MB, recall@1 {gallery.metrics.get('recall@1', float('nan')):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
