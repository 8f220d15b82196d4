"""RetrievalService: the checkpoints to search with, a cached index of each gallery (demo.retrieve.galleries), queries,
each gallery item's ranking (memvir.retrieval.ranking, for the views that show where a checkpoint fails), its pairs'
cosines (memvir.retrieval.verification, for the threshold view), its export, and which checkpoints and query class to
offer first."""

from __future__ import annotations

import atexit
import logging
import os
import re
import string
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from demo.common import upload_store
from demo.common.allowed_paths import checkpoint_source
from demo.common.hub_access import ANONYMOUS
from demo.common.settings import AppSettings
from demo.common.uploads import UploadError, is_zip, unpack_upload
from demo.retrieve.downloads import write_exports, write_zip
from demo.retrieve.galleries import Gallery, Hit, IndexedGallery, images_gallery, zip_gallery
from demo.retrieve.index_builds import IndexBuilds
from memvir.data.errors import DatasetError
from memvir.data.glyphs.query import flatten_alpha, glyph_query
from memvir.retrieval import shipped_gallery

EMBED_BATCH = 512
SAMPLE_SIZE = 48
# The rankings of a gallery's own items keep the top RANKED_K of each query (the hardest-queries view shows them) and
# its MISSED_KEPT nearest same-class items ranked after them; the threshold view offers FMRs up to MAX_FMR (the
# other-class cosines above its threshold are kept to answer exactly). The settings a checkpoint's saved figures
# are computed with (memvir.retrieval.shipped_gallery), so that the bundled checkpoints' can be read.
RANKED_K = shipped_gallery.RANKED_K
MISSED_KEPT = shipped_gallery.MISSED_KEPT
MAX_FMR = shipped_gallery.MAX_FMR
_WARM_UP_EXIT_WAIT_S = 60.0
_CACHE_ENTRIES = 4
# A bundled checkpoint trained with MemVir says so in its model card's summary table (memvir.train.trainer writes the
# row).
_MEMVIR_CARD_ROW = re.compile(r"^\| MemVir \| N=[1-9]", re.MULTILINE)

log = logging.getLogger(__name__)


class RetrievalError(ValueError):
    """A checkpoint, gallery or query that cannot be used; the message says what to do instead."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A model ready to embed, and where it came from. `key` changes when the folder's weights are rewritten."""

    key: str
    folder: Path
    name: str
    model: object  # memvir.models.embedding_model.EmbeddingModel (imported lazily)

    @property
    def config(self) -> dict:
        return self.model.config

    @property
    def is_glyph_model(self) -> bool:
        return self.config["image_kind"] == "glyph"


def _folder_key(folder: Path) -> str:
    weights = folder / "model.safetensors"
    return f"{folder.resolve()}@{weights.stat().st_mtime_ns}"


def _checkpoint_folders(root: Path, need_weights: bool) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(
        (path for path in root.iterdir()
         if (path / "config.json").is_file() and (not need_weights or (path / "model.safetensors").is_file())),
        key=lambda path: path.name,
    )


def _visitor_message(choice: str, error: Exception, space: bool) -> str:
    """What a visitor is told when a checkpoint cannot be had: a Hub repo neither cached here nor reachable, or on a
    Space one that anyone may not read, is said in the visitor's words (memvir.hub's message is the operator's: the
    cache's path, HF_HUB_OFFLINE, how to log in)."""
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    if space and isinstance(error.__cause__, RepositoryNotFoundError):
        return (f"the Hub has no public model repo {choice!r}: check the spelling ('owner/name'). This Space reads "
                "the Hub without any token, so a private repo cannot be opened here")
    if isinstance(error.__cause__, LocalEntryNotFoundError):
        log.info("%s could not be pulled: %s", choice, error)
        return (f"{choice!r} is not on this server and the Hub cannot be reached from this server; pick a bundled "
                "checkpoint (or one of this app's runs)")
    return str(error)


class _Cache(OrderedDict):
    """A small least-recently-used dict: models and indexes are large, visitors few."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def get_or_make(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        while len(self) > self.capacity:
            self.popitem(last=False)
        return value


class RetrievalService:
    """Checkpoints, galleries and their indexes, cached; thread-safe (Gradio serves visitors on many threads).

    A checkpoint is a folder in the Hub layout (config.json + model.safetensors): bundled under `checkpoints/`, a run
    folder of this app, or a Hub repo id pulled by `memvir.hub.pull` (which fails within seconds when offline).
    Embedding a gallery is the slow part, so the `GalleryIndex` of each (checkpoint, gallery) pair is built once and
    kept; a query then costs one forward pass and one search. A test split's index is kept beside its checkpoint too
    (memvir.retrieval.shipped_gallery): bundled checkpoints ship theirs, a run's is built in the background when it
    finishes, so a first search need not embed.
    """

    def __init__(self, settings: AppSettings, uploads_in_use: Callable[[], Iterable[Path]] = tuple):
        """uploads_in_use: folders under the uploads folder that must not be pruned (datasets of training runs)."""
        self.settings = settings
        self._uploads_in_use = uploads_in_use
        self._lock = threading.RLock()
        self._models = _Cache(_CACHE_ENTRIES)
        self._galleries = _Cache(_CACHE_ENTRIES)
        self._indexes = _Cache(_CACHE_ENTRIES)
        self._rankings = _Cache(_CACHE_ENTRIES)
        self._pairs = _Cache(_CACHE_ENTRIES)
        self._builds = IndexBuilds()

    # ------------------------------------------------------------------------------------------ checkpoints
    def checkpoint_choices(self) -> list[tuple[str, str]]:
        """(label, folder) of the bundled checkpoints and of the app's runs that have saved weights."""
        bundled = [(f"bundled: {path.name}", str(path))
                   for path in _checkpoint_folders(self.settings.checkpoints_dir, need_weights=False)]
        runs = [(f"run: {path.name}", str(path))
                for path in reversed(_checkpoint_folders(self.settings.runs_dir, need_weights=True))]
        return bundled + runs

    def default_checkpoint(self) -> str | None:
        """The checkpoint the Retrieve tab starts on: the bundled one trained with MemVir (as its model card says),
        else the first listed; None when none is listed."""
        for folder in _checkpoint_folders(self.settings.checkpoints_dir, need_weights=True):
            card = folder / "README.md"
            if card.is_file() and _MEMVIR_CARD_ROW.search(card.read_text(encoding="utf-8", errors="replace")):
                return str(folder)
        choices = self.checkpoint_choices()
        return choices[0][1] if choices else None

    def comparison_checkpoint(self, first: str | None = None) -> str | None:
        """The checkpoint to compare `first` (default: `default_checkpoint`) with: the first bundled one whose model
        card names no MemVir (its baseline), else the first other listed; None when there is no other."""
        first = first or self.default_checkpoint()
        others = [folder for folder in _checkpoint_folders(self.settings.checkpoints_dir, need_weights=True)
                  if str(folder) != first]
        for folder in others:
            card = folder / "README.md"
            text = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
            if not _MEMVIR_CARD_ROW.search(text):
                return str(folder)
        listed = [choice for _, choice in self.checkpoint_choices() if choice != first]
        return listed[0] if listed else None

    def load_checkpoint(self, choice: str) -> LoadedCheckpoint:
        """The model of a listed folder or a Hub repo id ('owner/name'); RetrievalError when it cannot be had or is
        a path outside the places visitors may name (demo.common.allowed_paths). On a Space a repo id is read with
        no token at all (demo.common.hub_access): the server's token never reads for a visitor, so a private repo
        reads as not found."""
        from memvir.hub import pull
        from memvir.models.embedding_model import EmbeddingModel

        choice = (choice or "").strip()
        if not choice:
            raise RetrievalError("choose a checkpoint, or type a Hub repo id such as owner/name")
        try:
            source = checkpoint_source(choice, self.settings)
            folder = pull(source, token=ANONYMOUS if self.settings.space else None)
            key = _folder_key(folder)
        except (ValueError, OSError) as error:  # HubError and PathRefused are ValueErrors
            raise RetrievalError(_visitor_message(choice, error, self.settings.space)) from None

        def load():
            try:
                model = EmbeddingModel.from_pretrained(folder)
            except (ValueError, OSError) as error:
                raise RetrievalError(f"{choice} could not be loaded: {error}") from None
            return LoadedCheckpoint(key, folder, folder.name if isinstance(source, Path) else choice, model.eval())

        with self._lock:
            return self._models.get_or_make(key, load)

    def download_zip(self, choice: str) -> Path:
        """A zip of the checkpoint's config.json, model.safetensors and README.md, in the app's downloads folder
        (bounded and pruned: demo.retrieve.downloads), for the page to offer as a file."""
        checkpoint = self.load_checkpoint(choice)  # refuses what a visitor may not name, and what does not load
        settings = self.settings
        try:
            return write_zip(checkpoint.folder, settings.downloads_dir, settings.max_downloads_bytes,
                             settings.max_upload_age_s)
        except (ValueError, OSError) as error:
            raise RetrievalError(f"{checkpoint.name} cannot be downloaded: {error}") from None

    # ------------------------------------------------------------------------------------------ galleries
    def test_split_gallery(self, checkpoint: LoadedCheckpoint) -> Gallery:
        """The test split of the dataset the checkpoint was trained on (glyphs are re-rendered, no download)."""
        from memvir.data import load_dataset

        config = checkpoint.config
        dataset = config["dataset"]
        size = config["image_size"]
        key = f"test-split:{dataset}:{size}"

        def load():
            try:
                split = load_dataset(dataset, image_size=size).test
            except ValueError as error:
                raise RetrievalError(
                    f"the checkpoint's dataset {dataset!r} is not available on this machine ({error}); "
                    "upload gallery images or a zip of class folders instead"
                ) from None
            return Gallery(key=key, description=f"the {dataset} test split", size=len(split), image=split.image,
                           labels=split.labels.tolist(), class_names=split.class_names,
                           glyphs=checkpoint.is_glyph_model, split=split)

        with self._lock:
            return self._galleries.get_or_make(key, load)

    def uploaded_gallery(self, paths: Sequence[str | Path]) -> Gallery:
        """A gallery from uploaded images (no labels) or from one zip of class folders (labels = folder names)."""
        paths = [Path(path) for path in paths or []]
        if not paths:
            raise RetrievalError("upload gallery images (or one zip of class folders) first")
        zips = [path for path in paths if is_zip(path)]
        if zips and len(paths) > 1:
            raise RetrievalError("upload either one zip of class folders or loose images, not both")
        settings = self.settings
        if not zips:
            return images_gallery(paths, None, None, f"{len(paths)} uploaded images", settings)
        root = unpack_upload(zips[0], settings, settings.max_gallery_uploads, self._uploads_in_use())
        try:
            return zip_gallery(zips[0].name, root, settings)
        except UploadError:
            upload_store.discard(settings.uploads_dir, root)  # refused: its unpacked copy goes too
            raise

    def sample(self, gallery: Gallery, count: int = SAMPLE_SIZE) -> list[int]:
        """Items to show for click-to-query: one per class across the classes (or the first items)."""
        if gallery.labels is None:
            return list(range(min(count, gallery.size)))
        first_of_class: dict[int, int] = {}
        for index, label in enumerate(gallery.labels):
            first_of_class.setdefault(label, index)
        firsts = list(first_of_class.values())
        step = max(1, len(firsts) // count)
        return firsts[::step][:count]

    def example_query_class(self, gallery: Gallery) -> str | None:
        """A class of the gallery to suggest for "Query's class", as a visitor would type it (a glyph's character):
        the first that is an ASCII letter, which any keyboard types, else the first; None when it has no classes."""
        if not gallery.class_names:
            return None
        typed = [name.split(" ")[0] if gallery.glyphs else name for name in gallery.class_names]
        return next((text for text in typed if text in string.ascii_letters), typed[0])

    # ------------------------------------------------------------------------------------------ index and search
    def index(self, checkpoint: LoadedCheckpoint, gallery: Gallery) -> IndexedGallery:
        """The gallery embedded by the checkpoint, indexed; built on first use, then cached.

        A test split's index is read from the checkpoint's folder when a fresh one is there, and otherwise embedded
        and, for bundled checkpoints and the app's runs, saved there for later starts. A request for an index that
        is being built waits for that build instead of starting another.
        """
        key = (checkpoint.key, gallery.key)

        def build(report):
            cached = self._cached_index(key)  # built by a request that finished just before this one began
            if cached is None:
                cached = self._build_index(checkpoint, gallery, report)
                with self._lock:
                    self._indexes.get_or_make(key, lambda: cached)
            return cached

        return self._cached_index(key) or self._builds.run(key, build)

    def warm_up(self) -> threading.Thread | None:
        """Load the default checkpoint, its test split and its index, and embed one query, on a thread of its own
        (when the app starts), so that a visitor's first search costs what any search costs: the model's first
        forward pass, the dataset's load and the index's read are done by then. None without a default checkpoint."""
        choice = self.default_checkpoint()
        if choice is None:
            return None

        stopping = threading.Event()

        def work():
            try:
                checkpoint = self.load_checkpoint(choice)
                gallery = self.test_split_gallery(checkpoint)
                self.search(checkpoint, gallery, gallery.image(0), k=1)
                # The hardest-queries and per-class views of the default pair, and the threshold view of the default
                # checkpoint, ready before a visitor opens them.
                comparison = self.comparison_checkpoint(choice)
                for other in [choice] + ([comparison] if comparison else []):
                    if stopping.is_set():
                        return
                    ranked = self.load_checkpoint(other)
                    self.rankings(ranked, self.test_split_gallery(ranked))
                if not stopping.is_set():
                    self.pair_similarities(checkpoint, gallery)
            except Exception:
                log.exception("warming up retrieval with %s failed", choice)

        thread = threading.Thread(target=work, name="warm-up-retrieval", daemon=True)
        thread.start()

        def finish():
            # A thread still inside torch when the interpreter shuts down aborts the process (exit status 134):
            # at exit the warm-up ends the step it is in (a ranking takes seconds) and starts no other.
            stopping.set()
            thread.join(timeout=_WARM_UP_EXIT_WAIT_S)

        atexit.register(finish)
        return thread

    def index_in_background(self, choice: str) -> threading.Thread:
        """Index the checkpoint's test split on a thread of its own (for a run that just finished), so that its
        first search need not embed and the index is saved beside it; `indexing_progress` follows it. Returns the
        thread; what stops it is logged, and `indexing_progress(choice)` reports it."""

        def work():
            try:
                checkpoint = self.load_checkpoint(choice)
                self.index(checkpoint, self.test_split_gallery(checkpoint))
            except Exception:
                log.exception("indexing the gallery of %s failed", choice)

        thread = threading.Thread(target=work, name=f"index-gallery-{Path(choice).name}", daemon=True)
        thread.start()
        return thread

    def indexing_progress(self, choice: str) -> float | None:
        """How far the index of the checkpoint's test split has got: 1.0 when it is ready, the fraction embedded
        while it is built, None when no build of it has started in this process. RetrievalError when the build (or
        loading the checkpoint or its dataset) failed, with the reason."""
        checkpoint = self.load_checkpoint(choice)
        key = (checkpoint.key, self.test_split_gallery(checkpoint).key)
        if self._cached_index(key) is not None:
            return 1.0
        state = self._builds.progress(key)
        if state is None:
            return None
        fraction, error = state
        if error is not None:
            raise RetrievalError(f"indexing the gallery of {checkpoint.name} failed: {error}")
        return fraction

    def _cached_index(self, key) -> IndexedGallery | None:
        with self._lock:
            if key not in self._indexes:
                return None
            self._indexes.move_to_end(key)
            return self._indexes[key]

    def _build_index(self, checkpoint: LoadedCheckpoint, gallery: Gallery, report) -> IndexedGallery:
        if gallery.size == 0:
            raise RetrievalError("the gallery is empty")
        if gallery.split is not None:
            return self._test_split_index(checkpoint, gallery, report)
        return self._uploaded_index(checkpoint, gallery, report)

    def _test_split_index(self, checkpoint: LoadedCheckpoint, gallery: Gallery, report) -> IndexedGallery:
        """From the checkpoint's folder when fresh, else embedded through memvir.retrieval.evaluation (as evaluation
        does)."""
        from memvir.retrieval import shipped_gallery

        saved = shipped_gallery.load(checkpoint.folder, gallery.split)
        if saved is None:
            saved = shipped_gallery.build(checkpoint.folder, gallery.split, checkpoint.config["dataset"],
                                             model=checkpoint.model, save=self._may_save_beside(checkpoint),
                                             batch_size=EMBED_BATCH, on_progress=report)
        return IndexedGallery(saved.index, saved.metrics)

    def _may_save_beside(self, checkpoint: LoadedCheckpoint) -> bool:
        """Whether the index embedded by this loaded model may be kept in the checkpoint's folder: a bundled
        checkpoint or one of the app's runs (not a Hub cache, not a folder a visitor may only read), whose weights
        are still the ones the model was loaded from (a run may have saved new ones since)."""
        folder = checkpoint.folder
        homes = (self.settings.checkpoints_dir.resolve(), self.settings.runs_dir.resolve())
        return (folder.resolve().parent in homes and os.access(folder, os.W_OK)
                and _folder_key(folder) == checkpoint.key)

    def _uploaded_index(self, checkpoint: LoadedCheckpoint, gallery: Gallery, report) -> IndexedGallery:
        """Uploaded images through the query path (glyph polarity and framing), as a query would be."""
        import torch

        from memvir.retrieval.index import GalleryIndex
        from memvir.retrieval.metrics import retrieval_metrics

        chunks = []
        for start in range(0, gallery.size, EMBED_BATCH):
            stop = min(start + EMBED_BATCH, gallery.size)
            chunks.append(checkpoint.model.embed([self.model_input(checkpoint, gallery.image(i), fit_ink=False)
                                                  for i in range(start, stop)]))
            report(stop / gallery.size)
        embeddings = torch.cat(chunks)
        metrics = {}
        if gallery.labels is not None and len(set(gallery.labels)) < gallery.size:
            labels = torch.as_tensor(gallery.labels)
            metrics = retrieval_metrics(embeddings, labels, ks=(1,))
        return IndexedGallery(GalleryIndex.build(embeddings, labels=gallery.labels), metrics)

    def model_input(self, checkpoint: LoadedCheckpoint, image: Image.Image, fit_ink: bool) -> Image.Image:
        """The image as it goes into the model's own preprocessing (glyph polarity and framing; RGB on white)."""
        if not checkpoint.is_glyph_model:
            return flatten_alpha(image)
        try:
            return glyph_query(image, checkpoint.config["image_size"], fit_ink)
        except DatasetError as error:  # an empty drawing
            raise RetrievalError(str(error)) from error

    def search(self, checkpoint: LoadedCheckpoint, gallery: Gallery, image: Image.Image, k: int,
               drawn: bool = False, exclude: int | None = None, query_class: str | None = None) -> list[Hit]:
        """The k gallery items nearest the query image, best first.

        drawn: the query is a sketch (its ink is fitted to the frame). exclude: a gallery item to leave out (the
        clicked item itself). query_class: the query's class name when known, to mark hits same/different.
        """
        if not isinstance(k, int) or k < 1:
            raise RetrievalError(f"k must be a whole number of at least 1, got {k!r}")
        indexed = self.index(checkpoint, gallery)
        query = checkpoint.model.embed(self.model_input(checkpoint, image, fit_ink=drawn))
        wanted = min(k + (exclude is not None), gallery.size)
        hits = [hit for hit in indexed.index.search(query, wanted)[0] if hit.index != exclude][:k]
        results = []
        for hit in hits:
            class_name = gallery.class_of(hit.index)
            same = None if query_class is None or class_name is None else class_name == query_class
            results.append(Hit(hit.index, hit.score, class_name, same))
        return results

    # ------------------------------------------------------------------------------------------ where it fails
    def rankings(self, checkpoint: LoadedCheckpoint, gallery: Gallery):
        """Every item of a labelled gallery querying the others (memvir.retrieval.ranking.rank_gallery, top RANKED_K
        and MISSED_KEPT missed items), ranked once per gallery index and kept: the hardest-queries and per-class views
        read it, so a click costs no search. A request for rankings being computed waits for them. A checkpoint's own
        test split's rankings are read from beside it when saved there (memvir.retrieval.shipped_gallery: the
        bundled checkpoints ship them), else computed."""
        from memvir.retrieval.ranking import rank_gallery

        if gallery.labels is None:
            raise RetrievalError("this gallery has no classes, so no query can be right or wrong: choose the test "
                                 "split or upload a zip of class folders")

        def rank(vectors):
            try:
                return rank_gallery(vectors, gallery.labels, k=RANKED_K, missed=MISSED_KEPT)
            except ValueError as error:  # no class with two items
                raise RetrievalError(f"the gallery's queries cannot be ranked: {error}") from None

        return self._kept_figures(self._rankings, ("rankings", checkpoint.key, gallery.key), checkpoint, gallery,
                                  shipped_gallery.load_rankings, rank)

    def pair_similarities(self, checkpoint: LoadedCheckpoint, gallery: Gallery):
        """The cosines of every pair of a labelled gallery's items by class sameness (memvir.retrieval.verification,
        thresholds exact up to MAX_FMR), computed once per gallery index and kept, as the rankings are (both read
        from beside a checkpoint whose own test split has them saved)."""
        from memvir.retrieval.verification import pair_similarities

        if gallery.labels is None:
            raise RetrievalError("this gallery has no classes, so no pair is of the same class or another: choose "
                                 "the test split or upload a zip of class folders")

        def pair(vectors):
            try:
                return pair_similarities(vectors, gallery.labels, max_fmr=MAX_FMR)
            except ValueError as error:  # no pair of one kind
                raise RetrievalError(f"the gallery's pairs cannot be told apart: {error}") from None

        return self._kept_figures(self._pairs, ("pairs", checkpoint.key, gallery.key), checkpoint, gallery,
                                  shipped_gallery.load_pairs, pair)

    def _kept_figures(self, kept, key, checkpoint: LoadedCheckpoint, gallery: Gallery, load, compute):
        """The figures of `key` in `kept`: read from beside the checkpoint where saved there (`_saved_figures`),
        else `compute(the gallery index's vectors)`, once per gallery index (a request for figures being computed
        waits for them), then kept."""
        def build(report):
            with self._lock:
                if key in kept:
                    return kept[key]
            figures = self._saved_figures(load, checkpoint, gallery)
            if figures is None:
                figures = compute(self.index(checkpoint, gallery).index.vectors())
            with self._lock:
                return kept.get_or_make(key, lambda: figures)

        with self._lock:
            if key in kept:
                kept.move_to_end(key)
                return kept[key]
        return self._builds.run(key, build)

    def _saved_figures(self, load, checkpoint: LoadedCheckpoint, gallery: Gallery):
        """The figures `load` (memvir.retrieval.shipped_gallery.load_rankings / load_pairs) reads from beside the
        checkpoint, for its own test split, computed at build time; None for other galleries, or where they are
        missing or stale (the loader logs why) or the folder's weights are no longer the ones loaded."""
        if gallery.split is None or _folder_key(checkpoint.folder) != checkpoint.key:
            return None
        return load(checkpoint.folder, gallery.split, RANKED_K, MISSED_KEPT, MAX_FMR)

    def export(self, checkpoint: LoadedCheckpoint, gallery: Gallery) -> tuple[Path, Path]:
        """(a TensorBoard projector bundle zipped, an .npz) of the gallery's embeddings by the checkpoint, with
        labels and thumbnails, in the downloads folder (demo.retrieve.downloads); written once per gallery index."""
        if gallery.labels is None:
            raise RetrievalError("this gallery has no classes to export with its embeddings: choose the test split "
                                 "or upload a zip of class folders")
        indexed = self.index(checkpoint, gallery)
        settings = self.settings
        key = ("export", checkpoint.key, gallery.key)

        def write(report):
            try:
                return write_exports(checkpoint, gallery, indexed.index.vectors(), settings.downloads_dir,
                                     settings.max_downloads_bytes, settings.max_upload_age_s)
            except (ValueError, OSError) as error:
                raise RetrievalError(f"the gallery of {checkpoint.name} cannot be exported: {error}") from None

        return self._builds.run(key, write)

    def query_ranking(self, checkpoint: LoadedCheckpoint, gallery: Gallery, image: Image.Image, k: int,
                      query_class: str, drawn: bool = False, exclude: int | None = None):
        """One query's ranking of the gallery (memvir.retrieval.ranking.rank_queries): its top k marked, its AP@R
        and first correct rank for `query_class` (a class name of the gallery), the nearest same-class items it
        missed. exclude: a gallery item left out (the clicked item itself)."""
        from memvir.retrieval.ranking import rank_queries

        if not isinstance(k, int) or k < 1:
            raise RetrievalError(f"k must be a whole number of at least 1, got {k!r}")
        if gallery.labels is None or query_class not in (gallery.class_names or []):
            raise RetrievalError(f"the gallery has no class {query_class!r} to rank the query by")
        indexed = self.index(checkpoint, gallery)
        query = checkpoint.model.embed(self.model_input(checkpoint, image, fit_ink=drawn))
        largest = gallery.size - (exclude is not None)
        return rank_queries(query, indexed.index.vectors(), gallery.labels, [gallery.class_names.index(query_class)],
                            k=min(k, largest), missed=MISSED_KEPT, exclude=[-1 if exclude is None else exclude])

    def query_class_choices(self, gallery: Gallery) -> list[tuple[str, str]]:
        """(label, value) of each class of the gallery, to pick as the query's class: a glyph's value is its
        character, as a visitor would type it ("Ж", labelled "Ж U+0416"); a folder's, its name. Empty without
        classes."""
        names = gallery.class_names or []
        return [(name, name.split(" ")[0] if gallery.glyphs else name) for name in names]

    def match_class(self, gallery: Gallery, text: str | None) -> str | None:
        """The gallery class a visitor named ("Ж", "Ж U+0416", "U+0416" or a folder name), None when blank.

        RetrievalError when the gallery has no such class (or no labels), naming where its classes are listed.
        """
        text = (text or "").strip()
        if not text:
            return None
        if gallery.class_names is None:
            raise RetrievalError("this gallery has no classes, so the query's class cannot be compared")
        for name in gallery.class_names:
            parts = name.split(" ")
            if text == name or (gallery.glyphs and (parts[0] == text or len(parts) > 1 and parts[-1] == text.upper())):
                return name
        count = len(gallery.class_names)
        raise RetrievalError(f"the gallery has no class {text!r}: {gallery.description} holds {count:,} classes, "
                             f"listed under \u201cor pick one of the gallery's classes\u201d (e.g. "
                             f"{self.example_query_class(gallery)}); pick one there, or leave the query's class "
                             "empty")
