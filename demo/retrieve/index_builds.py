"""Gallery indexes: built once per (checkpoint, gallery), with their progress for the page, then kept, and the
figures the views read of them (each item's ranking, the pairs' cosines, the export).

A gallery takes seconds to minutes to embed. Visitors who ask for an index already being built (a run's gallery
indexed in the background when the run finished, or another visitor's first search) wait for that build rather
than start a second one on the same two cores, and a page can ask how far it has got (`IndexBuilds`). A finished
build leaves only its outcome (done, or the error that stopped it) behind; `IndexCache` keeps the indexes. The
building itself is the library's: a test split through memvir.retrieval.shipped_gallery (read from beside the
checkpoint when fresh), an upload through memvir.retrieval.query.index_images.

Where a test split's index lives on disk: beside the checkpoint (``gallery/``) when a fresh one is there, and for the
app's own runs, which get theirs written there. Any other checkpoint's folder is only read: a bundled checkpoint's is
tracked in the repository (or a Space's read-only copy) and a Hub snapshot's belongs to the Hugging Face cache, so the
index the app rebuilds for them (their weights or the dataset's rendering changed since it was shipped) goes to the
app's gallery cache (`AppSettings.galleries_dir`), in a folder named by the weights' digest and the split's
fingerprint, with the same stamp and staleness rules, and so do its views' figures: the warm-up ranks the default
checkpoints' galleries at every start, seconds each, which the next start then reads instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import NamedTuple, TypeVar

from demo.common.settings import AppSettings
from demo.retrieve.checkpoints import Catalogue, LoadedCheckpoint, LruCache, RetrievalError, folder_key
from demo.retrieve.downloads import write_exports
from demo.retrieve.galleries import Galleries, Gallery, IndexedGallery
from memvir.retrieval import query, shipped_gallery
from memvir.retrieval.diagnosis import ranking, verification
from memvir.retrieval.metrics import retrieval_metrics

T = TypeVar("T")
_OUTCOMES_KEPT = 32  # finished builds remembered for progress queries; older ones read as never built
EMBED_BATCH = 512
# The rankings of a gallery's own items keep the top RANKED_K of each query (the hardest-queries view shows them) and
# its MISSED_KEPT nearest same-class items ranked after them; the threshold view offers FMRs up to MAX_FMR (the
# other-class cosines above its threshold are kept to answer exactly). The settings a checkpoint's saved figures
# are computed with (memvir.retrieval.shipped_gallery), so that the bundled checkpoints' can be read.
RANKED_K = shipped_gallery.RANKED_K
MISSED_KEPT = shipped_gallery.MISSED_KEPT
MAX_FMR = shipped_gallery.MAX_FMR
# Galleries kept in the app's gallery cache; the least recently used go first beyond this many, so that visitors
# naming Hub repos one after another do not fill the disk.
CACHED_GALLERIES_KEPT = 8

log = logging.getLogger(__name__)


class _Build:
    def __init__(self):
        self.finished = threading.Event()
        self.fraction = 0.0
        self.result = None
        self.error: BaseException | None = None


class _Outcome:
    def __init__(self, error: BaseException | None):
        self.fraction = 1.0 if error is None else 0.0
        self.error = error


class IndexBuilds:
    """Runs builds so that each key builds once at a time; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Build | _Outcome] = OrderedDict()

    def run(self, key: Hashable, build: Callable[[Callable[[float], None]], T]) -> T:
        """`build(report)` for `key`, or, when it is being built already, that build's result (or its error).

        `report(fraction)` is how the build tells its progress (0 to 1).
        """
        with self._lock:
            entry = self._entries.get(key)
            joining = isinstance(entry, _Build)
            if not joining:
                entry = self._entries[key] = _Build()
        if joining:
            entry.finished.wait()
            if entry.error is not None:
                raise entry.error
            return entry.result

        def report(fraction: float) -> None:
            entry.fraction = min(max(float(fraction), 0.0), 1.0)

        try:
            entry.result = build(report)
        except BaseException as error:
            entry.error = error
            raise
        finally:
            with self._lock:
                self._entries[key] = _Outcome(entry.error)
                self._entries.move_to_end(key)
                outcomes = [known for known, kept in self._entries.items() if isinstance(kept, _Outcome)]
                for forgotten in outcomes[:-_OUTCOMES_KEPT]:
                    del self._entries[forgotten]
            entry.finished.set()
        return entry.result

    def progress(self, key: Hashable) -> tuple[float, BaseException | None] | None:
        """(fraction built, the error that stopped it or None) of the latest build of `key`; None when none is
        known."""
        with self._lock:
            entry = self._entries.get(key)
        return None if entry is None else (entry.fraction, entry.error)


class GalleryHome(NamedTuple):
    """Where a checkpoint's test-split index and its views' figures are read from, and whether the app writes them
    there (`writable`) and keeps them in its gallery cache (`cached`: then `unusable_beside` says why the one beside
    the checkpoint is not used)."""

    folder: Path
    writable: bool
    cached: bool
    unusable_beside: str | None = None


class IndexCache:
    """Each (checkpoint, gallery)'s index, rankings, pair cosines and export, made once and kept; thread-safe.

    A test split's index is read from disk when a fresh one is there (bundled checkpoints ship theirs), and otherwise
    embedded and saved for later starts: beside the app's own runs, in the app's gallery cache for any other
    checkpoint, whose folder the app never writes (see `gallery_home`).
    """

    def __init__(self, settings: AppSettings, catalogue: Catalogue, galleries: Galleries):
        self.settings = settings
        self._catalogue = catalogue
        self._galleries = galleries
        self._lock = threading.RLock()
        self._indexes = LruCache()
        self._rankings = LruCache()
        self._pairs = LruCache()
        self._builds = IndexBuilds()
        self._views_lock = threading.Lock()  # one writer of a cached gallery's views' files at a time

    def index(self, checkpoint: LoadedCheckpoint, gallery: Gallery) -> IndexedGallery:
        """The gallery embedded by the checkpoint, indexed; built on first use (a request for an index that is being
        built waits for that build instead of starting another), then kept."""
        key = (checkpoint.key, gallery.key)

        def build(report):
            cached = self._kept_index(key)  # built by a request that finished just before this one began
            if cached is None:
                cached = self._build_index(checkpoint, gallery, report)
                with self._lock:
                    self._indexes.get_or_make(key, lambda: cached)
            return cached

        return self._kept_index(key) or self._builds.run(key, build)

    def index_in_background(self, choice: str) -> threading.Thread:
        """Index the checkpoint's test split on a thread of its own (for a run that just finished), so that its
        first search need not embed and the index is saved (beside a run); `indexing_progress` follows it. Returns the
        thread; what stops it is logged, and `indexing_progress(choice)` reports it."""

        def work():
            try:
                checkpoint = self._catalogue.load(choice)
                self.index(checkpoint, self._galleries.test_split(checkpoint))
            except Exception:
                log.exception("indexing the gallery of %s failed", choice)

        thread = threading.Thread(target=work, name=f"index-gallery-{Path(choice).name}", daemon=True)
        thread.start()
        return thread

    def indexing_progress(self, choice: str) -> float | None:
        """How far the index of the checkpoint's test split has got: 1.0 when it is ready, the fraction embedded
        while it is built, None when no build of it has started in this process. RetrievalError when the build (or
        loading the checkpoint or its dataset) failed, with the reason."""
        checkpoint = self._catalogue.load(choice)
        key = (checkpoint.key, self._galleries.test_split(checkpoint).key)
        if self._kept_index(key) is not None:
            return 1.0
        state = self._builds.progress(key)
        if state is None:
            return None
        fraction, error = state
        if error is not None:
            raise RetrievalError(f"indexing the gallery of {checkpoint.name} failed: {error}")
        return fraction

    def _kept_index(self, key) -> IndexedGallery | None:
        with self._lock:
            return self._indexes.recent(key)

    def gallery_home(self, checkpoint: LoadedCheckpoint, split) -> GalleryHome:
        """Where the index of the checkpoint's test split `split` and its views' figures are read and kept: beside
        the checkpoint (``gallery/``) for the app's own runs (written there) and wherever a fresh one is there (a
        bundled checkpoint's shipped index, only read); else a folder of the app's gallery cache named by the
        weights' digest and the split's fingerprint, written while the folder's weights are still the ones loaded (an
        index of the loaded model would not match a stamp of newer ones)."""
        beside = checkpoint.folder / shipped_gallery.GALLERY_DIR
        if self._catalogue.may_save_beside(checkpoint):
            return GalleryHome(beside, writable=True, cached=False)
        reason = shipped_gallery.staleness(checkpoint.folder, split)
        if reason is None:
            return GalleryHome(beside, writable=False, cached=False)
        cached = shipped_gallery.gallery_cache_dir(self.settings.galleries_dir, checkpoint.folder, split)
        return GalleryHome(cached, writable=folder_key(checkpoint.folder) == checkpoint.key, cached=True,
                           unusable_beside=reason)

    def _build_index(self, checkpoint: LoadedCheckpoint, gallery: Gallery, report) -> IndexedGallery:
        if gallery.size == 0:
            raise RetrievalError("the gallery is empty")
        if gallery.split is not None:
            home = self.gallery_home(checkpoint, gallery.split)
            saved = shipped_gallery.load(checkpoint.folder, gallery.split, home.folder)
            if saved is None:
                if home.cached:
                    log.info("%s: its test split's index is embedded and kept in %s (the one beside it cannot be "
                             "used: %s)", checkpoint.name, home.folder, home.unusable_beside)
                saved = shipped_gallery.build(checkpoint.folder, gallery.split, checkpoint.config["dataset"],
                                              model=checkpoint.model, save=home.writable, batch_size=EMBED_BATCH,
                                              on_progress=report, gallery_dir=home.folder)
            elif home.cached:
                log.info("%s: its test split's index is read from %s", checkpoint.name, home.folder)
            if home.cached and home.folder.is_dir():
                self._mark_cached_gallery_used(home.folder)
            return IndexedGallery(saved.index, saved.metrics)
        # Uploaded images through the query path (glyph polarity and framing), as a query would be.
        images = [gallery.image(item) for item in range(gallery.size)]
        index = query.index_images(checkpoint.model, images, labels=gallery.labels, batch_size=EMBED_BATCH,
                                   on_progress=report)
        metrics = {}
        if gallery.labels is not None and len(set(gallery.labels)) < gallery.size:
            metrics = retrieval_metrics(index.vectors(), gallery.labels, ks=(1,))
        return IndexedGallery(index, metrics)

    def rankings(self, checkpoint: LoadedCheckpoint, gallery: Gallery):
        """Every item of a labelled gallery querying the others (memvir.retrieval.diagnosis.ranking.rank_gallery,
        top RANKED_K and MISSED_KEPT missed items), ranked once per gallery index and kept: the hardest-queries and
        per-class views read it, so a click costs no search. A checkpoint's own test split's rankings are read from
        beside it when saved there (memvir.retrieval.shipped_gallery: the bundled checkpoints ship them)."""
        if gallery.labels is None:
            raise RetrievalError("this gallery has no classes, so no query can be right or wrong: choose the test "
                                 "split or upload a zip of class folders")

        def rank(vectors):
            try:
                return ranking.rank_gallery(vectors, gallery.labels, k=RANKED_K, missed=MISSED_KEPT)
            except ValueError as error:  # no class with two items
                raise RetrievalError(f"the gallery's queries cannot be ranked: {error}") from None

        return self._kept_figures("rankings", checkpoint, gallery, rank)

    def pair_similarities(self, checkpoint: LoadedCheckpoint, gallery: Gallery):
        """The cosines of every pair of a labelled gallery's items by class sameness
        (memvir.retrieval.diagnosis.verification, thresholds exact up to MAX_FMR), computed once per gallery index
        and kept, as the rankings are (both read from beside a checkpoint whose own test split has them saved)."""
        if gallery.labels is None:
            raise RetrievalError("this gallery has no classes, so no pair is of the same class or another: choose "
                                 "the test split or upload a zip of class folders")

        def pair(vectors):
            try:
                return verification.pair_similarities(vectors, gallery.labels, max_fmr=MAX_FMR)
            except ValueError as error:  # no pair of one kind
                raise RetrievalError(f"the gallery's pairs cannot be told apart: {error}") from None

        return self._kept_figures("pairs", checkpoint, gallery, pair)

    def _kept_figures(self, kind: str, checkpoint: LoadedCheckpoint, gallery: Gallery, compute):
        """The figures of `kind` ("rankings" or "pairs"): read from disk where saved (`_saved_figures`), else
        `compute(the gallery index's vectors)`, once per gallery index (a request for figures being computed waits
        for them), then kept."""
        kept, key = self._kept_of(kind), (kind, checkpoint.key, gallery.key)

        def build(report):
            with self._lock:
                if key in kept:
                    return kept[key]
            figures = self._saved_figures(kind, checkpoint, gallery)
            if figures is None:
                figures = compute(self.index(checkpoint, gallery).index.vectors())
            with self._lock:
                return kept.get_or_make(key, lambda: figures)

        with self._lock:
            figures = kept.recent(key)
        return figures if figures is not None else self._builds.run(key, build)

    def _kept_of(self, kind: str) -> LruCache:
        return {"rankings": self._rankings, "pairs": self._pairs}[kind]

    def _saved_figures(self, kind: str, checkpoint: LoadedCheckpoint, gallery: Gallery):
        """The figures of `kind` for the checkpoint's own test split, read where its index is kept (`gallery_home`:
        memvir.retrieval.shipped_gallery.load_rankings / load_pairs), or for an index in the app's gallery cache
        computed and saved there (`_cache_views`); None for other galleries, where they are missing or stale beside
        a checkpoint (the loader logs why) or the folder's weights are no longer the ones loaded."""
        if gallery.split is None or folder_key(checkpoint.folder) != checkpoint.key:
            return None
        home = self.gallery_home(checkpoint, gallery.split)
        load = shipped_gallery.load_rankings if kind == "rankings" else shipped_gallery.load_pairs
        figures = load(checkpoint.folder, gallery.split, RANKED_K, MISSED_KEPT, MAX_FMR, gallery_dir=home.folder)
        if figures is None and home.cached and home.writable:
            figures = self._cache_views(kind, checkpoint, gallery, home.folder)
        return figures

    def _cache_views(self, kind: str, checkpoint: LoadedCheckpoint, gallery: Gallery, folder: Path):
        """Both views' figures of a cached gallery, computed and saved beside its index
        (memvir.retrieval.shipped_gallery.build_views), kept, and the one of `kind` returned; None when they cannot
        be saved there (the index is not saved there, or the gallery has nothing to rank or pair: computed as any
        gallery's, which says why). Both at once: the warm-up asks for both of the default checkpoint at every
        start, and a visitor opening one view soon opens the other."""
        self.index(checkpoint, gallery)  # into the cache first, when it is not there yet
        load = shipped_gallery.load_rankings if kind == "rankings" else shipped_gallery.load_pairs
        with self._views_lock:
            # Saved by the other kind's request while this one waited.
            if shipped_gallery.views_staleness(checkpoint.folder, gallery.split, RANKED_K, MISSED_KEPT, MAX_FMR,
                                               gallery_dir=folder) is None:
                figures = load(checkpoint.folder, gallery.split, RANKED_K, MISSED_KEPT, MAX_FMR, gallery_dir=folder)
                if figures is not None:
                    return figures
            try:
                rankings, pairs = shipped_gallery.build_views(checkpoint.folder, gallery.split, RANKED_K, MISSED_KEPT,
                                                              MAX_FMR, gallery_dir=folder)
            except (ValueError, OSError) as error:  # OSError: the cache was pruned meanwhile
                log.info("%s: the views' figures of its cached gallery are not saved (%s)", checkpoint.name, error)
                return None
        with self._lock:
            self._rankings.get_or_make(("rankings", checkpoint.key, gallery.key), lambda: rankings)
            self._pairs.get_or_make(("pairs", checkpoint.key, gallery.key), lambda: pairs)
        return rankings if kind == "rankings" else pairs

    def _mark_cached_gallery_used(self, folder: Path) -> None:
        """Mark a cached gallery as just used, and drop the least recently used beyond CACHED_GALLERIES_KEPT."""
        try:
            os.utime(folder)
            kept = sorted((path for path in self.settings.galleries_dir.iterdir()
                           if path.is_dir() and not path.name.startswith(".")),
                          key=lambda path: path.stat().st_mtime_ns, reverse=True)
        except OSError as error:  # another request pruned meanwhile: the index in hand is still whole
            log.info("the gallery cache %s was not pruned (%s)", self.settings.galleries_dir, error)
            return
        for stale in kept[CACHED_GALLERIES_KEPT:]:
            if stale != folder:
                log.info("dropping the cached gallery %s (the least recently used)", stale)
                shutil.rmtree(stale, ignore_errors=True)

    def export(self, checkpoint: LoadedCheckpoint, gallery: Gallery) -> tuple[Path, Path]:
        """(a TensorBoard projector bundle zipped, an .npz) of the gallery's embeddings by the checkpoint, with
        labels and thumbnails, in the downloads folder (demo.retrieve.downloads); written once per gallery index."""
        if gallery.labels is None:
            raise RetrievalError("this gallery has no classes to export with its embeddings: choose the test split "
                                 "or upload a zip of class folders")
        indexed = self.index(checkpoint, gallery)
        settings = self.settings

        def write(report):
            try:
                return write_exports(checkpoint, gallery, indexed.index.vectors(), settings.downloads_dir,
                                     settings.max_downloads_bytes, settings.max_upload_age_s)
            except (ValueError, OSError) as error:
                raise RetrievalError(f"the gallery of {checkpoint.name} cannot be exported: {error}") from None

        return self._builds.run(("export", checkpoint.key, gallery.key), write)
