"""RetrievalService: the Retrieve tab's one object, made of small parts: the checkpoints (demo.retrieve.checkpoints),
the galleries (demo.retrieve.galleries), each gallery's index and the figures the views read of it
(demo.retrieve.index_builds), and a thin search that asks memvir.retrieval for the hits and the query as the model
saw it. It warms the default checkpoint up as the app starts and offers a checkpoint as a zip."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from PIL import Image

from demo.common.settings import AppSettings
from demo.retrieve import galleries as gallery_choices
from demo.retrieve.checkpoints import Catalogue, LoadedCheckpoint, RetrievalError
from demo.retrieve.downloads import write_zip
from demo.retrieve.galleries import SAMPLE_SIZE, Answer, Galleries, Gallery, Hit, IndexedGallery
from demo.retrieve.index_builds import MAX_FMR, MISSED_KEPT, RANKED_K, IndexCache
from memvir.retrieval.diagnosis import ranking
from memvir.retrieval.query import prepare_query, search_image

__all__ = ["MAX_FMR", "MISSED_KEPT", "RANKED_K", "LoadedCheckpoint", "RetrievalError", "RetrievalService"]

_WARM_UP_EXIT_WAIT_S = 60.0

log = logging.getLogger(__name__)


def _query_seen(checkpoint: LoadedCheckpoint, image: Image.Image, drawn: bool) -> Image.Image:
    """The query as the checkpoint's model sees it (memvir.retrieval.query.prepare_query); an empty drawing is
    refused in the visitor's words."""
    try:
        return prepare_query(image, checkpoint.config, drawn=drawn)
    except ValueError as error:
        raise RetrievalError(str(error)) from None


def _whole_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RetrievalError(f"k must be a whole number of at least 1, got {k!r}")
    return k


class RetrievalService:
    """Checkpoints, galleries and their indexes, cached, and searches over them; thread-safe (Gradio serves visitors
    on many threads). Its parts: `catalogue` (checkpoints), `galleries`, `indexes` (indexes, rankings, pair
    cosines, exports); the methods below that only pass a call on name the part that answers it."""

    def __init__(self, settings: AppSettings, uploads_in_use: Callable[[], Iterable[Path]] = tuple):
        """uploads_in_use: folders under the uploads folder that must not be pruned (datasets of training runs)."""
        self.settings = settings
        self.catalogue = Catalogue(settings)
        self.galleries = Galleries(settings, uploads_in_use)
        self.indexes = IndexCache(settings, self.catalogue, self.galleries)

    # ------------------------------------------------------------------------------------------ the parts' answers
    def checkpoint_choices(self) -> list[tuple[str, str]]:
        return self.catalogue.choices()

    def default_checkpoint(self) -> str | None:
        return self.catalogue.default()

    def comparison_checkpoint(self, first: str | None = None) -> str | None:
        return self.catalogue.comparison(first)

    def load_checkpoint(self, choice: str) -> LoadedCheckpoint:
        return self.catalogue.load(choice)

    def test_split_gallery(self, checkpoint: LoadedCheckpoint) -> Gallery:
        return self.galleries.test_split(checkpoint)

    def uploaded_gallery(self, paths: Sequence[str | Path]) -> Gallery:
        return self.galleries.uploaded(paths)

    def sample(self, gallery: Gallery, count: int = SAMPLE_SIZE) -> list[int]:
        return gallery_choices.sample(gallery, count)

    def example_query_class(self, gallery: Gallery) -> str | None:
        return gallery_choices.example_query_class(gallery)

    def query_class_choices(self, gallery: Gallery) -> list[tuple[str, str]]:
        return gallery_choices.query_class_choices(gallery)

    def match_class(self, gallery: Gallery, text: str | None) -> str | None:
        return gallery_choices.match_class(gallery, text)

    def index(self, checkpoint: LoadedCheckpoint, gallery: Gallery) -> IndexedGallery:
        return self.indexes.index(checkpoint, gallery)

    def index_in_background(self, choice: str) -> threading.Thread:
        return self.indexes.index_in_background(choice)

    def indexing_progress(self, choice: str) -> float | None:
        return self.indexes.indexing_progress(choice)

    def rankings(self, checkpoint: LoadedCheckpoint, gallery: Gallery):
        return self.indexes.rankings(checkpoint, gallery)

    def pair_similarities(self, checkpoint: LoadedCheckpoint, gallery: Gallery):
        return self.indexes.pair_similarities(checkpoint, gallery)

    def export(self, checkpoint: LoadedCheckpoint, gallery: Gallery) -> tuple[Path, Path]:
        return self.indexes.export(checkpoint, gallery)

    # ------------------------------------------------------------------------------------------ search
    def search(self, checkpoint: LoadedCheckpoint, gallery: Gallery, image: Image.Image, k: int,
               drawn: bool = False, exclude: int | None = None, query_class: str | None = None) -> Answer:
        """The k gallery items nearest the query image, best first, and the query as the model saw it
        (memvir.retrieval.query.search_image over the gallery's kept index).

        drawn: the query is a sketch (its ink is fitted to the frame). exclude: a gallery item to leave out (the
        clicked item itself). query_class: the query's class name when known, to mark hits same/different.
        """
        k = _whole_k(k)
        index = self.index(checkpoint, gallery).index
        try:
            found = search_image(checkpoint.model, index, image, k, drawn=drawn, exclude=exclude)
        except ValueError as error:  # k is checked: an empty drawing, refused in the visitor's words
            raise RetrievalError(str(error)) from None
        hits = []
        for hit in found.hits:
            class_name = gallery.class_of(hit.index)
            same = None if query_class is None or class_name is None else class_name == query_class
            hits.append(Hit(hit.index, hit.score, class_name, same))
        return Answer(hits, found.query)

    def query_ranking(self, checkpoint: LoadedCheckpoint, gallery: Gallery, image: Image.Image, k: int,
                      query_class: str, drawn: bool = False, exclude: int | None = None):
        """(one query's ranking of the gallery (memvir.retrieval.diagnosis.ranking.rank_queries): its top k marked,
        its AP@R and first correct rank for `query_class` (a class name of the gallery), the nearest same-class items
        it missed; the query as the model saw it). exclude: a gallery item left out (the clicked item itself)."""
        k = _whole_k(k)
        if gallery.labels is None or query_class not in (gallery.class_names or []):
            raise RetrievalError(f"the gallery has no class {query_class!r} to rank the query by")
        index = self.index(checkpoint, gallery).index
        seen = _query_seen(checkpoint, image, drawn)
        largest = gallery.size - (exclude is not None)
        rankings = ranking.rank_queries(checkpoint.model.embed(seen), index.vectors(), gallery.labels,
                                        [gallery.class_names.index(query_class)], k=min(k, largest),
                                        missed=MISSED_KEPT, exclude=[-1 if exclude is None else exclude])
        return rankings, seen

    # ------------------------------------------------------------------------------------------ the app's own
    def download_zip(self, choice: str) -> Path:
        """A zip of the checkpoint's config.json, model.safetensors and README.md, in the app's downloads folder
        (bounded and pruned: demo.retrieve.downloads), for the page to offer as a file."""
        checkpoint = self.catalogue.load(choice)  # refuses what a visitor may not name, and what does not load
        settings = self.settings
        try:
            return write_zip(checkpoint.folder, settings.downloads_dir, settings.max_downloads_bytes,
                             settings.max_upload_age_s)
        except (ValueError, OSError) as error:
            raise RetrievalError(f"{checkpoint.name} cannot be downloaded: {error}") from None

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
