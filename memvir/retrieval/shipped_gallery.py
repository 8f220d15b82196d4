"""A checkpoint's own gallery: the index of its dataset's test split, kept beside it and used only while it is fresh.

Embedding a gallery is the slow part of a first search (the 12,250 glyphs of the test split take half a minute on
two busy cores), so a checkpoint folder may carry its gallery ready-made in ``gallery/``: the GalleryIndex as
``GalleryIndex.save`` writes it, and ``checkpoint.json``, which records what the index was built from (the sha256 of
the checkpoint's config.json and model.safetensors, and a fingerprint of the split: its labels, class names and the
model inputs of a sample of its items) and the split's retrieval metrics. `load` returns the index only while all of
that still matches, so a retrained checkpoint or a re-rendered dataset gets its index rebuilt, never served stale.
Embeddings and metrics come from memvir.retrieval.evaluation, so they are exactly the evaluation's.

Beside the index, ``views.json``, ``rankings.npz`` and ``pairs.npz`` keep what the app's views read of that gallery:
each item's ranking of the others (memvir.retrieval.diagnosis.ranking) and its pairs' cosines
(memvir.retrieval.diagnosis.verification), which take seconds to compute. `load_rankings` and `load_pairs` return them
only while their stamp matches the weights, the index's files, the settings asked for and this format's version, and the
files' sha256; else None, and the reason goes to the log.

``python -m memvir index FOLDER...`` (``make gallery-index``) builds the index of each checkpoint folder whose index
is missing or stale, and then the views' figures where they are.

The loaders and builders take `gallery_dir`: where the index and its figures are kept, ``gallery/`` beside the
checkpoint by default. A folder that must not be written (a checkpoint tracked in a repository, a Hub snapshot) has
its rebuilt gallery kept elsewhere, in a folder `gallery_cache_dir` names by the weights' digest and the split's
fingerprint; the same stamps and the same staleness rules apply there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memvir.checkpoint import MODEL_FILES
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import evaluation
from memvir.retrieval.diagnosis import ranking, verification
from memvir.retrieval.diagnosis.ranking import QueryRankings
from memvir.retrieval.diagnosis.verification import PairSimilarities
from memvir.retrieval.index import GalleryIndex

GALLERY_DIR = "gallery"
STAMP_FILE = "checkpoint.json"
_STAMPED_FILES = MODEL_FILES  # a gallery is stale once the model it was embedded with changes
_FORMAT = "memvir.CheckpointGallery"
_FORMAT_VERSION = 1
# Items whose model inputs enter the fingerprint: enough to see a re-rendering or a changed transform, few enough
# that checking costs milliseconds for glyphs and well under a second for photos read from disk.
_FINGERPRINT_ITEMS = 64
_CHUNK_BYTES = 1024**2


@dataclass(frozen=True)
class CheckpointGallery:
    """The GalleryIndex of a checkpoint's test split (rows in split order, labels beside) and the split's metrics."""

    index: GalleryIndex
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


def gallery_cache_dir(cache_root: str | Path, checkpoint_dir: str | Path, split) -> Path:
    """The folder under `cache_root` for the gallery of `split` embedded by the checkpoint's current weights, named by
    the start of the weights' digest and of the split's fingerprint (the stamp inside holds both whole)."""
    return Path(cache_root) / f"{checkpoint_digest(checkpoint_dir)[:24]}-{split_fingerprint(split)[:24]}"


def _gallery_folder(checkpoint_dir: str | Path, gallery_dir: str | Path | None) -> Path:
    return Path(checkpoint_dir) / GALLERY_DIR if gallery_dir is None else Path(gallery_dir)


def staleness(checkpoint_dir: str | Path, split, gallery_dir: str | Path | None = None) -> str | None:
    """Why the checkpoint's saved gallery (in `gallery_dir`, default ``gallery/`` beside it) cannot be used for `split`
    (missing, damaged, built from other weights or another split); None when it can."""
    folder = _gallery_folder(checkpoint_dir, gallery_dir)
    stamp = _read_stamp(folder)
    if isinstance(stamp, str):
        return stamp
    if stamp["checkpoint_sha256"] != checkpoint_digest(checkpoint_dir):
        return "it was built from other weights (config.json or model.safetensors changed)"
    if stamp["size"] != len(split) or stamp["split_fingerprint"] != split_fingerprint(split):
        return "it was built from another version of the dataset's test split"
    return None


def load(checkpoint_dir: str | Path, split, gallery_dir: str | Path | None = None) -> CheckpointGallery | None:
    """The checkpoint's saved gallery of `split` (in `gallery_dir`, default ``gallery/`` beside it); None when there
    is none or it is stale (see `staleness`)."""
    if staleness(checkpoint_dir, split, gallery_dir) is not None:
        return None
    folder = _gallery_folder(checkpoint_dir, gallery_dir)
    try:
        index = GalleryIndex.load(folder)
    except (ValueError, OSError, RuntimeError):  # faiss reports a damaged file as a RuntimeError
        return None
    if index.labels != split.labels.tolist():
        return None
    return CheckpointGallery(index, _read_stamp(folder)["metrics"])


def build(checkpoint_dir: str | Path, split, dataset_name: str, model=None, save: bool = True,
          batch_size: int = 256, progress: bool = False,
          on_progress: Callable[[float], None] | None = None,
          gallery_dir: str | Path | None = None) -> CheckpointGallery:
    """Embed `split` with the checkpoint (through memvir.retrieval.evaluation), index it, score it, and (with `save`)
    write it beside the checkpoint, or into `gallery_dir` when given (its parent folders are made). `model`: the
    checkpoint already loaded (else it is loaded here).

    Nothing is saved when the checkpoint's files change while it is embedded (a run still writing): the index would
    belong to neither version. `progress` / `on_progress`: as in `memvir.retrieval.evaluation.embed`.
    """
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
        _save(_gallery_folder(checkpoint_dir, gallery_dir), gallery, {
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


def _save(target: Path, gallery: CheckpointGallery, stamp: dict) -> None:
    """Write the index and its stamp into a hidden folder beside `target`, then swap it in: a reader never sees half
    an index."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}-{uuid.uuid4().hex}"
    retired = target.parent / f".{target.name}-old-{uuid.uuid4().hex}"
    try:
        gallery.index.save(staging)
        (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=1), encoding="utf-8")
        if target.exists():
            target.rename(retired)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(retired, ignore_errors=True)


def _read_json_stamp(path: Path, format_name: str) -> dict | str:
    """The stamp of `format_name` at `path` (a JSON object), or why there is none to use."""
    if not path.is_file():
        return f"there is no {path.parent.name}/{path.name}"
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return f"{path} cannot be read ({error})"
    if not isinstance(stamp, dict) or stamp.get("format") != format_name:
        return f"{path} is not a {format_name} stamp"
    return stamp


def _read_stamp(folder: Path) -> dict | str:
    """The stamp of a saved gallery, or why there is none to use."""
    stamp = _read_json_stamp(folder / STAMP_FILE, _FORMAT)
    if isinstance(stamp, dict) and stamp.get("version") != _FORMAT_VERSION:
        return f"{folder / STAMP_FILE} is not a version-{_FORMAT_VERSION} {_FORMAT} stamp"
    return stamp


# ---------------------------------------------------------------------------------------------- the views' figures
# What the app's views read of a checkpoint's own gallery, computed once at build time and kept beside the index:
# each item's ranking of the others (memvir.retrieval.diagnosis.ranking, for the hardest-queries and per-class views)
# and its pairs' cosines (memvir.retrieval.diagnosis.verification, for the threshold view). Plain .npz files (read
# without pickle), stamped in views.json with what they were computed from and how, so that a stale or damaged file is
# never read.
VIEWS_FILE = "views.json"
RANKINGS_FILE = "rankings.npz"
PAIRS_FILE = "pairs.npz"
_VIEWS_FORMAT = "memvir.GalleryViews"
_VIEWS_FORMAT_VERSION = 1
_VIEW_FILES = (VIEWS_FILE, RANKINGS_FILE, PAIRS_FILE)
# Sorted cosines are kept as the steps between their float32 bit patterns (ordered as the floats are): most steps are
# a few units and fit a byte, which compresses several times better than the floats; larger steps go in a second array.
_STEP_ESCAPE = 255
# The settings the app's views compute with (demo.retrieve.service takes them from here): each query's top RANKED_K
# and its MISSED_KEPT nearest same-class items ranked after them; thresholds exact up to a false match rate of
# MAX_FMR.
RANKED_K = 8
MISSED_KEPT = 4
MAX_FMR = 0.1

log = logging.getLogger(__name__)


def build_views(checkpoint_dir: str | Path, split, ranked_k: int = RANKED_K, missed: int = MISSED_KEPT,
                max_fmr: float = MAX_FMR, gallery_dir: str | Path | None = None):
    """Rank the saved index's items against one another and compare all its pairs (as the app's views do), and save
    both beside the index (in `gallery_dir`, default ``gallery/`` beside the checkpoint). Returns (QueryRankings,
    PairSimilarities). ValueError when the index is missing or stale (build it first), or when the gallery has no
    class with two items (nothing to rank)."""
    checkpoint_dir = Path(checkpoint_dir)
    folder = _gallery_folder(checkpoint_dir, gallery_dir)
    gallery = load(checkpoint_dir, split, folder)
    if gallery is None:
        where = f"{checkpoint_dir} has no fresh {GALLERY_DIR}/ index" if gallery_dir is None else (
            f"{folder} holds no fresh index of {checkpoint_dir}")
        raise ValueError(f"{where} ({staleness(checkpoint_dir, split, folder)}); build it first")
    vectors, labels = gallery.index.vectors(), gallery.index.labels
    rankings = ranking.rank_gallery(vectors, labels, k=ranked_k, missed=missed)
    pairs = verification.pair_similarities(vectors, labels, max_fmr=max_fmr)
    # Only the neighbours within max(k, R) are ever read (the top k shown, the first R counted for confusions).
    width = min(rankings.neighbours.shape[1], max(rankings.k, int(rankings.same_class.max(initial=0))))
    arrays = {name: getattr(rankings, name) for name in _RANKING_FIELDS}
    for name in ("neighbours", "scores", "correct"):
        arrays[name] = arrays[name][:, :width]
    _write_npz(folder / RANKINGS_FILE, k=np.int64(rankings.k), **arrays)
    _write_npz(folder / PAIRS_FILE, same_pairs=np.int64(pairs.same_pairs), other_pairs=np.int64(pairs.other_pairs),
               fine_same=pairs.fine_same, fine_other=pairs.fine_other, same_scores=pairs.same_scores,
               top_floor=np.float64(pairs.top_floor), max_fmr=np.float64(pairs.max_fmr),
               **_sorted_float32_steps(pairs.other_top))
    stamp = {
        "format": _VIEWS_FORMAT,
        "version": _VIEWS_FORMAT_VERSION,
        "checkpoint_sha256": checkpoint_digest(checkpoint_dir),
        "index_sha256": _index_digest(folder),
        "ranking": {"k": int(rankings.k), "missed": int(rankings.missed.shape[1])},
        "pairs": {"max_fmr": float(pairs.max_fmr)},
        "files": {name: _file_digest(folder / name) for name in (RANKINGS_FILE, PAIRS_FILE)},
    }
    partial = folder / f".{VIEWS_FILE}.partial"
    partial.write_text(json.dumps(stamp, indent=1), encoding="utf-8")
    partial.replace(folder / VIEWS_FILE)
    return rankings, pairs


def views_staleness(checkpoint_dir: str | Path, split, ranked_k: int = RANKED_K, missed: int = MISSED_KEPT,
                    max_fmr: float = MAX_FMR, gallery_dir: str | Path | None = None) -> str | None:
    """Why the saved views' figures (in `gallery_dir`, default ``gallery/`` beside the checkpoint) cannot be used for
    `split` with these settings (missing, damaged, computed from another index, other weights or with other settings,
    or another format version); None when they can."""
    folder = _gallery_folder(checkpoint_dir, gallery_dir)
    path = folder / VIEWS_FILE
    stamp = _read_json_stamp(path, _VIEWS_FORMAT)
    if isinstance(stamp, str):
        return stamp
    if stamp.get("version") != _VIEWS_FORMAT_VERSION:
        return f"{path} is of format version {stamp.get('version')!r}, not {_VIEWS_FORMAT_VERSION}"
    reason = staleness(checkpoint_dir, split, folder)
    if reason is not None:
        return f"the index they were computed from cannot be used: {reason}"
    try:
        if stamp["checkpoint_sha256"] != checkpoint_digest(checkpoint_dir):
            return "they were computed from other weights (config.json or model.safetensors changed)"
        if stamp["index_sha256"] != _index_digest(folder):
            return "they were computed from another index of the gallery"
        if stamp["ranking"] != {"k": ranked_k, "missed": missed} or stamp["pairs"] != {"max_fmr": max_fmr}:
            return (f"they were computed with other settings ({stamp['ranking']}, {stamp['pairs']}; wanted k "
                    f"{ranked_k}, missed {missed}, max_fmr {max_fmr})")
        for name, digest in stamp["files"].items():
            if not (folder / name).is_file() or _file_digest(folder / name) != digest:
                return f"{folder.name}/{name} is missing or damaged (its sha256 is not the one stamped)"
    except (KeyError, TypeError, AttributeError, OSError) as error:
        return f"{path} is incomplete or unreadable ({error!r})"
    return None


def load_rankings(checkpoint_dir: str | Path, split, ranked_k: int = RANKED_K, missed: int = MISSED_KEPT,
                  max_fmr: float = MAX_FMR, gallery_dir: str | Path | None = None):
    """The saved QueryRankings of the split's items (neighbours, scores and correct marks kept up to max(k, R));
    None, with a log line saying why, when the views' figures are missing, stale or damaged (see
    `views_staleness`)."""
    arrays = _read_views(checkpoint_dir, split, RANKINGS_FILE, ranked_k, missed, max_fmr, gallery_dir)
    if arrays is None:
        return None
    try:
        return QueryRankings(k=int(arrays["k"]), **{name: arrays[name] for name in _RANKING_FIELDS})
    except KeyError as error:
        log.warning("%s: the saved rankings lack %s; computing them", checkpoint_dir, error)
        return None


def load_pairs(checkpoint_dir: str | Path, split, ranked_k: int = RANKED_K, missed: int = MISSED_KEPT,
               max_fmr: float = MAX_FMR, gallery_dir: str | Path | None = None):
    """The saved PairSimilarities of the split's items; None, with a log line saying why, as `load_rankings`."""
    arrays = _read_views(checkpoint_dir, split, PAIRS_FILE, ranked_k, missed, max_fmr, gallery_dir)
    if arrays is None:
        return None
    try:
        return PairSimilarities(same_pairs=int(arrays["same_pairs"]), other_pairs=int(arrays["other_pairs"]),
                                fine_same=arrays["fine_same"], fine_other=arrays["fine_other"],
                                same_scores=arrays["same_scores"], other_top=_float32_from_steps(arrays),
                                top_floor=float(arrays["top_floor"]), max_fmr=float(arrays["max_fmr"]))
    except (KeyError, ValueError) as error:
        log.warning("%s: the saved pair cosines cannot be read (%s); computing them", checkpoint_dir, error)
        return None


_RANKING_FIELDS = ("query", "label", "same_class", "neighbours", "scores", "correct", "first_correct_rank",
                   "average_precision", "r_precision", "missed", "missed_scores", "missed_ranks")


def _read_views(checkpoint_dir, split, name, ranked_k, missed, max_fmr, gallery_dir) -> dict | None:
    reason = views_staleness(checkpoint_dir, split, ranked_k, missed, max_fmr, gallery_dir)
    if reason is not None:
        log.info("%s: the saved figures of its gallery's views are not used (%s); computing them", checkpoint_dir,
                 reason)
        return None
    path = _gallery_folder(checkpoint_dir, gallery_dir) / name
    try:
        with np.load(path, allow_pickle=False) as file:
            return {key: file[key] for key in file.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        log.warning("%s cannot be read (%s); computing its figures", path, error)
        return None


def _write_npz(path: Path, **arrays) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as file:
        np.savez_compressed(file, **arrays)
    partial.replace(path)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _index_digest(folder: Path) -> str:
    """sha256 over the index's files (all of the folder but the stamps and the views' files)."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in (STAMP_FILE, *_VIEW_FILES) and not path.name.startswith("."):
            digest.update(f"{path.name}\0{_file_digest(path)}\0".encode())
    return digest.hexdigest()


def _sorted_float32_steps(values: np.ndarray) -> dict[str, np.ndarray]:
    """Ascending float32 `values` as `steps_first` (the first key), `steps_small` (uint8 steps between successive
    keys, _STEP_ESCAPE where a step is larger) and `steps_large` (those steps, in order). A key is the float's bit
    pattern turned so that it orders as the float does (negatives flipped, positives above them)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    keys = np.sort(np.where(bits >> 31 == 1, ~bits, bits | np.uint32(2**31)).astype(np.int64))
    steps = np.diff(keys)
    return {"steps_first": keys[:1], "steps_small": np.minimum(steps, _STEP_ESCAPE).astype(np.uint8),
            "steps_large": steps[steps >= _STEP_ESCAPE]}


def _float32_from_steps(arrays: dict) -> np.ndarray:
    """The float32 values `_sorted_float32_steps` wrote, ascending. Sums in uint32, whose wrap-around is exact for
    keys that fit it, so 7.5 million cosines take tens of milliseconds."""
    first, steps = arrays["steps_first"].astype(np.uint32), arrays["steps_small"].astype(np.uint32)
    escaped = np.flatnonzero(steps == _STEP_ESCAPE)
    if escaped.size != arrays["steps_large"].size or first.size > 1 or (first.size == 0 and steps.size):
        raise ValueError("the steps between the cosines do not match their escapes")
    steps[escaped] = arrays["steps_large"]
    keys = np.empty(first.size + steps.size, dtype=np.uint32)
    keys[: first.size] = first
    if first.size:
        np.cumsum(steps, out=keys[1:])
        keys[1:] += first[0]
    # Keys of positive floats have the top bit set (flip it back); those of negative ones are the bits inverted.
    keys ^= ((keys >> 31) ^ 1) * np.uint32(2**31 - 1) | np.uint32(2**31)
    return keys.view(np.float32)
