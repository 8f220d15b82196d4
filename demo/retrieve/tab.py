"""The Retrieve tab: choose a checkpoint and a gallery, then search with an uploaded, drawn or clicked query; download
a checkpoint as a zip, or its gallery's embeddings as a TensorBoard projector bundle and .npz (demo.retrieve.downloads).
Three views teach what a checkpoint gets wrong: one query side by side for two checkpoints
(demo.retrieve.side_by_side), the hardest queries of the gallery (demo.retrieve.hardest) and a table per class
(demo.retrieve.per_class_table), all from memvir.retrieval's rankings, which the service computes once per index. A
fourth, the threshold view (demo.retrieve.threshold), shows the gallery's same-class and other-class pair cosines, the
FNMR at a chosen FMR, and sets the similarity cut-off the result tiles honour.

The handlers are methods of `RetrieveHandlers`, which holds the `RetrievalService`; `build` wires the bound methods
and tests call them the same way. They read the widgets, ask the service (demo.retrieve.service) and turn its
results into tiles (demo.retrieve.tiles) and a summary; the models, galleries and indexes are the service's. The tab
starts on the service's default checkpoint, and its "Query's class" example is a class of the gallery chosen, so
following it works; the gallery's classes are listed beside it, to pick from.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
from PIL import Image

from demo.common.handlers import reporting
from demo.common.inputs import whole_number
from demo.common.shims import pass_undecoded, refuse_outside_choices
from demo.common.uploads import load_image, load_sketch
from demo.retrieve import hardest, per_class_table, side_by_side, threshold
from demo.retrieve.galleries import Gallery, IndexedGallery, thumbnail
from demo.retrieve.service import RANKED_K, LoadedCheckpoint, RetrievalError, RetrievalService
from demo.retrieve.tiles import Tile, tiles_html, with_cutoff
from memvir.retrieval.diagnosis.failures import hardest_queries, largest_differences
from memvir.retrieval.diagnosis.per_class import confused_class_pairs, per_class_difference, per_class_metrics

TEST_SPLIT, UPLOADED = "test split", "uploaded"
# Where a query comes from (`query_from`): an uploaded file, the sketchpad, a clicked result, a sample image clicked
# (its click's event) or the one clicked last (remembered for Side by side).
UPLOAD, DRAWING, TILE, SAMPLE, PICKED = "upload", "drawing", "tile", "sample", "picked"
GALLERY_KINDS = (TILE, SAMPLE, PICKED)
GALLERY_SOURCES = [("the checkpoint's test split", TEST_SPLIT), ("my uploaded images or zip", UPLOADED)]
SKETCH_SIZE = 320
# A blank sheet as the sketchpad's starting value: Gradio's editor chooses the brush when it starts with a
# background image, but its "select the draw tool" prompt, on which strokes do nothing, when it starts empty.
PAPER = {"background": Image.new("RGBA", (SKETCH_SIZE, SKETCH_SIZE), (255, 255, 255, 255)), "layers": [],
         "composite": None}
INDEX_POLL_S = 0.25
# Gradio finds a handler's progress bar by this default and gives each call a tracker of its own.
PROGRESS = gr.Progress()
# A refused search or Load clears what the last one showed: old tiles beside a refusal would read as its answer.
NO_RESULTS = {1: "", 2: None}


# ---------------------------------------------------------------------------------------------- handlers
def gallery_for(retrieval: RetrievalService, checkpoint: LoadedCheckpoint, source, files) -> Gallery:
    if source == UPLOADED:
        return retrieval.uploaded_gallery(files or [])
    return retrieval.test_split_gallery(checkpoint)


def describe(checkpoint: LoadedCheckpoint, gallery: Gallery, indexed: IndexedGallery) -> str:
    """The summary: the checkpoint, the gallery, and the checkpoint's Recall@1 and MAP@R on it when labelled."""
    config = checkpoint.config
    parts = [f"**Checkpoint** `{checkpoint.name}`: {config['backbone']}, {config['embedding_dim']}-d, trained on "
             f"`{config['dataset']}`.",
             f"**Gallery**: {gallery.description}, {gallery.size:,} images."]
    if indexed.metrics:
        parts.append(f"On this gallery the checkpoint reaches **Recall@1 {indexed.metrics['recall@1']:.3f}** "
                     f"and **MAP@R {indexed.metrics['map@r']:.3f}** (each item querying all others).")
    return "  \n".join(parts)


def follow_indexing(retrieval: RetrievalService, checkpoint_choice, progress) -> None:
    """Until the checkpoint's test-split index is ready, show how far it has got on the page's progress bar.

    A run's gallery is indexed in the background once the run finishes; a search before then waits for that build,
    and one that no build has started starts it the same way, so that its progress shows too. A build that failed
    is left to the search, which builds again and says why it fails.
    """
    try:
        fraction = retrieval.indexing_progress(checkpoint_choice)
        builder = retrieval.index_in_background(checkpoint_choice) if fraction is None else None
        while fraction is None or fraction < 1.0:
            if fraction is None and not (builder and builder.is_alive()):
                return  # the build stopped before it began; the search's own build reports why
            progress(fraction or 0.0, desc="Indexing the gallery (once per checkpoint)")
            time.sleep(INDEX_POLL_S)
            fraction = retrieval.indexing_progress(checkpoint_choice)
    except RetrievalError:
        return


def searchable(retrieval: RetrievalService, checkpoint_choice, source, files, progress) -> tuple[LoadedCheckpoint,
                                                                                                 Gallery]:
    """The checkpoint and the gallery to search, once the gallery's index is ready."""
    checkpoint = retrieval.load_checkpoint(checkpoint_choice)
    gallery = gallery_for(retrieval, checkpoint, source, files)
    # A checkpoint folder's (bundled, a run): following a Hub checkpoint's would ask the Hub about it at every look.
    if source != UPLOADED and Path(checkpoint_choice.strip()).is_dir():
        follow_indexing(retrieval, checkpoint_choice, progress)
    return checkpoint, gallery


@dataclass(frozen=True)
class Query:
    """What a search asks with: an image, whether it was drawn, and the gallery item it is (left out of its own
    answer, its class known), if it is one."""

    image: Image.Image
    drawn: bool = False
    gallery_key: str | None = None
    item: int | None = None

    def exclude_in(self, gallery: Gallery) -> int | None:
        """The item to leave out of `gallery`'s answer: the query itself, when it is one of that gallery's."""
        return self.item if self.gallery_key == gallery.key else None


def query_from(settings, kind: str, value, gallery: Gallery | None = None) -> Query:
    """The query from where the visitor gave it; ValueError in words when it is missing or not one of those offered.

    kind: UPLOAD (value: the query file), DRAWING (value: the sketchpad's), TILE (value: a clicked result, as the
    page's script sends it), SAMPLE (value: (Load's sample, the click's gr.SelectData)), PICKED (value: (Load's
    sample, the position remembered by `remember_pick`)). The gallery kinds need the gallery searched.
    """
    if kind == UPLOAD:
        if not value:
            raise ValueError("upload a query image first")
        return Query(load_image(value, settings.max_image_bytes, settings.max_image_pixels))
    if kind == DRAWING:
        composite = load_sketch(value, settings.max_image_bytes, settings.max_image_pixels)
        if composite is None:
            raise ValueError("draw a character on the sketchpad first")
        return Query(composite, drawn=True)
    if kind == TILE:
        item = clicked_tile(value, gallery)
    else:
        picked, position = value
        if not picked or picked.get("gallery") != gallery.key:
            raise ValueError("the gallery changed: press Load again, then pick an image")
        shown = len(picked["sample"])
        item = picked["sample"][picked_position(position, shown) if kind == SAMPLE else remembered(position, shown)]
    return Query(gallery.image(item), gallery_key=gallery.key, item=item)


def remembered(position, shown: int) -> int:
    """The sample image clicked last, for Side by side; ValueError in words when none of the `shown` was."""
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < shown:
        raise ValueError("click an image of the Pick tab first, then ask for it side by side")
    return position


def results(retrieval: RetrievalService, checkpoint: LoadedCheckpoint, gallery: Gallery, query: Query, k,
            query_class=None, cutoff=None):
    """(summary, result tiles, the query as the model saw it) for one search; hits below `cutoff` (a cosine, or
    None) are dimmed."""
    cutoff = threshold.parse_cutoff(cutoff)
    indexed = retrieval.index(checkpoint, gallery)
    answer = retrieval.search(checkpoint, gallery, query.image, whole_number(k, "results (k)", 1), drawn=query.drawn,
                              exclude=query.exclude_in(gallery), query_class=query_class)
    hits = answer.hits
    tiles = with_cutoff([Tile(thumbnail(gallery.image(hit.index), gallery.glyphs), rank, hit.score, hit.class_name,
                              hit.same_class, clickable=(gallery.key, hit.index))
                         for rank, hit in enumerate(hits, 1)], cutoff)
    summary = f"{len(hits)} nearest of {gallery.size:,} images in {gallery.description}, with their cosine similarity"
    if query_class is not None:
        same = sum(hit.same_class is True for hit in hits)
        summary += f" · {same} of {len(hits)} share the query's class ({query_class})"
    summary += cutoff_words(tiles, cutoff)
    summary = describe(checkpoint, gallery, indexed) + "  \n" + summary + "."
    return summary, tiles_html(tiles), thumbnail(answer.query, checkpoint.is_glyph_model, 128)


def cutoff_words(tiles: list[Tile], cutoff: float | None) -> str:
    """' · 3 of 8 below the cut-off 0.5965, dimmed', or '' without a cut-off."""
    if cutoff is None:
        return ""
    below = sum(tile.below_cutoff for tile in tiles)
    return f" · {below} of {len(tiles)} below the cut-off {cutoff:.4f}, dimmed"


def clicked_tile(picked, gallery) -> int:
    """The gallery item of a clicked result tile, sent by the page's script as {"gallery": key, "item": i};
    ValueError in words for anything else, or for a tile of another gallery than the one chosen now."""
    try:
        values = json.loads(picked) if isinstance(picked, str) else None
    except json.JSONDecodeError:
        values = None
    if not isinstance(values, dict) or not isinstance(values.get("gallery"), str):
        raise ValueError("click one of the results to search with it")
    item = values.get("item")
    if values["gallery"] != gallery.key:
        raise ValueError("those results came from another gallery than the one chosen now: search again, then "
                         "click a result")
    if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item < gallery.size:
        raise ValueError(f"the result clicked is not an image of {gallery.description}: search again, then click a "
                         "result")
    return item


def side_by_side_results(retrieval: RetrievalService, checkpoint_choice, second_checkpoint, source, k, query_class,
                         query: Query, files, progress, cutoff=None):
    """(summary, the two checkpoints' answers side by side, the query as the first model saw it). A query that is a
    gallery item is left out of each gallery that holds it; cutoff: a cosine below which hits are dimmed, or None."""
    k = whole_number(k, "results (k)", 1)
    cutoff = threshold.parse_cutoff(cutoff)
    first, first_gallery = searchable(retrieval, checkpoint_choice, source, files, progress)
    second = side_by_side.load_second(retrieval, first, second_checkpoint)
    _, second_gallery = searchable(retrieval, second_checkpoint, source, files, progress)
    columns = [side_by_side.answer(retrieval, checkpoint, gallery, query.image, k,
                                   retrieval.match_class(gallery, query_class), drawn=query.drawn,
                                   exclude=query.exclude_in(gallery), cutoff=cutoff)
               for checkpoint, gallery in ((first, first_gallery), (second, second_gallery))]
    lines = [f"**Side by side**: the {k} nearest of {first_gallery.size:,} images in {first_gallery.description} "
             f"for each checkpoint, marked same or other class."]
    for column in columns:
        figures = side_by_side.figures_text(column)
        lines.append((f"`{column.name}`: {figures}" if figures else f"`{column.name}`")
                     + cutoff_words(column.tiles, cutoff))
    if query_class is None or not str(query_class).strip():
        lines.append("Name the query's class to see each checkpoint's AP@R and first correct rank for it.")
    shown = thumbnail(columns[0].query, first.is_glyph_model, 128)
    return "  \n".join(lines), side_by_side.side_by_side_html(*columns), shown


def remember_pick(picked, evt: gr.SelectData = None):
    """Which sample image was clicked last (its place among those shown), for Side by side; None for a click that
    names none of them."""
    try:
        return picked_position(evt, len((picked or {}).get("sample") or []))
    except (ValueError, TypeError):
        return None


def _ranked_pair(retrieval: RetrievalService, checkpoint_choice, second_checkpoint, source, files, progress, compare):
    """[(checkpoint, gallery, rankings)] for the first checkpoint, and the second when `compare`; the two must rank
    the same gallery."""
    first, gallery = searchable(retrieval, checkpoint_choice, source, files, progress)
    pairs = [(first, gallery)]
    if compare:
        second = side_by_side.load_second(retrieval, first, second_checkpoint)
        _, second_gallery = searchable(retrieval, second_checkpoint, source, files, progress)
        if second_gallery.key != gallery.key:
            raise RetrievalError(f"the two checkpoints search different galleries ({gallery.description} and "
                                 f"{second_gallery.description}): compare checkpoints of the same dataset")
        pairs.append((second, second_gallery))
    ranked = []
    for done, (checkpoint, one) in enumerate(pairs):
        # Seconds the first time for a checkpoint (the default pair is ranked as the app starts), then kept.
        progress(done / len(pairs), desc="Ranking every image of the gallery against the others (once per checkpoint)")
        ranked.append((checkpoint, one, retrieval.rankings(checkpoint, one)))
    return ranked


def _pairs_of(retrieval: RetrievalService, checkpoint_choice, source, files, progress):
    checkpoint, gallery = searchable(retrieval, checkpoint_choice, source, files, progress)
    # Seconds the first time for a gallery (the default checkpoint's is done as the app starts), then kept.
    progress(0.0, desc="Comparing every pair of the gallery's images (once per checkpoint)")
    return checkpoint, gallery, retrieval.pair_similarities(checkpoint, gallery)


def picked_position(evt: gr.SelectData | None, shown: int) -> int:
    """Which of the `shown` sample images the click picked; ValueError unless the event names one of them (an API
    client sends the event's index as it likes: a list, a string, past the end)."""
    position = getattr(evt, "index", None)
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < shown:
        raise ValueError(f"the image picked is not one of the {shown} shown: press Load, then click one of them")
    return position


def query_class_example(retrieval: RetrievalService, checkpoint_choice, source, files=None) -> str:
    """The "Query's class" box's placeholder: a class of the gallery chosen (RetrievalService.example_query_class),
    or, while that gallery cannot be had, what to type (Load or a search then says what is missing)."""
    try:
        checkpoint = retrieval.load_checkpoint(checkpoint_choice)
        example = retrieval.example_query_class(gallery_for(retrieval, checkpoint, source, files))
    except ValueError:  # RetrievalError and UploadError included
        example = None
    return f"e.g. {example}" if example else "a class of the gallery, e.g. a folder name of your zip"


def query_class_choices(retrieval: RetrievalService, checkpoint_choice, source, files=None) -> list[tuple[str, str]]:
    """The classes of the gallery chosen, to pick the query's class from (RetrievalService.query_class_choices);
    none while that gallery cannot be had."""
    try:
        checkpoint = retrieval.load_checkpoint(checkpoint_choice)
        return retrieval.query_class_choices(gallery_for(retrieval, checkpoint, source, files))
    except ValueError:  # RetrievalError and UploadError included: Load or a search says what is missing
        return []


def gallery_upload_shown(source):
    """The gallery's drop zone, shown only while the gallery to search is the visitor's upload."""
    return gr.update(visible=source == UPLOADED)


def pick_caption(gallery: Gallery, item: int) -> str:
    """A Pick image's caption: its class as a visitor types it (a glyph's character: short enough to show whole on
    a small tile), else its item number."""
    name = gallery.class_of(item)
    if name is None:
        return f"item {item}"
    return name.split(" ")[0] if gallery.glyphs else name


def picked_class(value):
    """The class picked from the list, into the "Query's class" box (left as it is when the list is cleared)."""
    return gr.skip() if value is None else value


class RetrieveHandlers:
    """The Retrieve tab's handlers, bound to the `RetrievalService` they ask: `build` wires the bound methods
    (`load_button.click(handlers.prepare, ...)`), and tests call them the same way."""

    def __init__(self, retrieval: RetrievalService):
        self.retrieval = retrieval

    def checkpoint_list(self):
        """The checkpoint choices as they are now (a run may have saved one since the page was built)."""
        return gr.update(choices=self.retrieval.checkpoint_choices())

    @reporting(message_slot=0, outputs=3, cleared={1: [], 2: None})
    def prepare(self, checkpoint_choice, source, files=None, progress=PROGRESS):
        """Load the checkpoint and index the gallery; show a sample of it to click."""
        checkpoint, gallery = searchable(self.retrieval, checkpoint_choice, source, files, progress)
        indexed = self.retrieval.index(checkpoint, gallery)
        sample = self.retrieval.sample(gallery)
        tiles = [(thumbnail(gallery.image(i), gallery.glyphs), pick_caption(gallery, i)) for i in sample]
        return describe(checkpoint, gallery, indexed), tiles, {"sample": sample, "gallery": gallery.key}

    def sample_unless_shown(self, checkpoint_choice, source, files=None, picked=None, progress=PROGRESS):
        """Pick opened before Load: the chosen gallery loaded and sampled as Load does, so that the tab has images to
        click; nothing changes while a sample is shown (Load shows another checkpoint's)."""
        if picked:
            return gr.skip(), gr.skip(), gr.skip()
        return self.prepare(checkpoint_choice, source, files, progress)

    def query_class_hint(self, checkpoint_choice, source, files=None):
        """(the "Query's class" box's placeholder, the class list's choices) for the gallery chosen."""
        return (gr.update(placeholder=query_class_example(self.retrieval, checkpoint_choice, source, files)),
                gr.update(choices=query_class_choices(self.retrieval, checkpoint_choice, source, files), value=None))

    @reporting(message_slot=0, outputs=2, cleared={1: None})
    def download_checkpoint(self, checkpoint_choice):
        """The checkpoint's config.json, model.safetensors and model card in one zip, offered to save (the page hides
        the file box while it is empty)."""
        path = self.retrieval.download_zip(checkpoint_choice)
        note = f"`{path.name}`: unzip it, then load the folder with `memvir.EmbeddingModel.from_pretrained`."
        return note, str(path)

    @reporting(message_slot=0, outputs=3, cleared={1: None, 2: None})
    def export_gallery(self, checkpoint_choice, source, files=None, progress=PROGRESS):
        """The gallery's embeddings by the checkpoint, with labels and thumbnails, as a TensorBoard projector bundle
        (zipped) and as .npz, offered to save (the file boxes are hidden until there is something in them)."""
        checkpoint, gallery = searchable(self.retrieval, checkpoint_choice, source, files, progress)
        progress(0.0, desc="Writing the embeddings, labels and thumbnails (once per checkpoint)")
        zip_path, npz_path = self.retrieval.export(checkpoint, gallery)
        note = (f"{gallery.size:,} embeddings of {gallery.description}. `{zip_path.name}`: unzip it and run "
                f"`tensorboard --logdir {zip_path.stem}` (the projector tab). `{npz_path.name}`: `numpy.load` gives "
                "`embeddings`, `labels` and `class_names`.")
        return note, gr.update(value=str(zip_path), visible=True), gr.update(value=str(npz_path), visible=True)

    def search(self, kind, value, checkpoint_choice, source, k, query_class, files, cutoff, progress):
        """One search, whatever the query's source (`query_from`): (summary, result tiles, the query as the model
        saw it). A gallery item's own class is the query's; else the class the visitor named, if any."""
        settings = self.retrieval.settings
        query = None if kind in GALLERY_KINDS else query_from(settings, kind, value)  # refused before any indexing
        checkpoint, gallery = searchable(self.retrieval, checkpoint_choice, source, files, progress)
        query = query or query_from(settings, kind, value, gallery)
        if query.item is not None:
            query_class = gallery.class_of(query.item)
        else:
            query_class = self.retrieval.match_class(gallery, query_class)
        return results(self.retrieval, checkpoint, gallery, query, k, query_class=query_class, cutoff=cutoff)

    def compare(self, kind, value, checkpoint_choice, second_checkpoint, source, k, query_class, files, cutoff,
                progress):
        """One query searched by both checkpoints, side by side (`side_by_side_results`), whatever its source; a
        gallery item's own class is the query's."""
        settings = self.retrieval.settings
        if kind in GALLERY_KINDS:
            _, gallery = searchable(self.retrieval, checkpoint_choice, source, files, progress)
            query = query_from(settings, kind, value, gallery)
            query_class = gallery.class_of(query.item)
        else:
            query = query_from(settings, kind, value)
        return side_by_side_results(self.retrieval, checkpoint_choice, second_checkpoint, source, k, query_class,
                                    query, files, progress, cutoff=cutoff)

    @reporting(message_slot=0, outputs=3, cleared=NO_RESULTS)
    def search_upload(self, checkpoint_choice, source, k, query_class, query_file=None,
                      files=None, cutoff=None, progress=PROGRESS):
        """Search with the uploaded image."""
        return self.search(UPLOAD, query_file, checkpoint_choice, source, k, query_class, files, cutoff, progress)

    @reporting(message_slot=0, outputs=3, cleared=NO_RESULTS)
    def search_drawing(self, checkpoint_choice, source, k, query_class, sketch=None, files=None,
                       cutoff=None, progress=PROGRESS):
        """Search with the drawing (its ink fitted to the frame for a glyph model)."""
        return self.search(DRAWING, sketch, checkpoint_choice, source, k, query_class, files, cutoff, progress)

    @reporting(message_slot=0, outputs=3, cleared=NO_RESULTS)
    def search_gallery_item(self, checkpoint_choice, source, k, picked, files=None, cutoff=None,
                            evt: gr.SelectData = None, progress=PROGRESS):
        """Search with the sample image clicked (in the gallery that Load sampled)."""
        return self.search(SAMPLE, (picked, evt), checkpoint_choice, source, k, None, files, cutoff, progress)

    @reporting(message_slot=0, outputs=3, cleared=NO_RESULTS)
    def search_result_tile(self, checkpoint_choice, source, k, picked, files=None, cutoff=None,
                           progress=PROGRESS):
        """A click on a result: search with that gallery image, itself left out (its nearest neighbours)."""
        return self.search(TILE, picked, checkpoint_choice, source, k, None, files, cutoff, progress)

    @reporting(message_slot=0, outputs=3, cleared=NO_RESULTS)
    def compare_upload(self, checkpoint_choice, second_checkpoint, source, k, query_class,
                       query_file=None, files=None, cutoff=None, progress=PROGRESS):
        """The uploaded query searched by both checkpoints, side by side."""
        return self.compare(UPLOAD, query_file, checkpoint_choice, second_checkpoint, source, k, query_class, files,
                            cutoff, progress)

    @reporting(message_slot=0, outputs=3, cleared=NO_RESULTS)
    def compare_drawing(self, checkpoint_choice, second_checkpoint, source, k, query_class,
                        sketch=None, files=None, cutoff=None, progress=PROGRESS):
        """The drawing searched by both checkpoints, side by side."""
        return self.compare(DRAWING, sketch, checkpoint_choice, second_checkpoint, source, k, query_class, files,
                            cutoff, progress)

    @reporting(message_slot=0, outputs=3, cleared=NO_RESULTS)
    def compare_gallery_item(self, checkpoint_choice, second_checkpoint, source, k, picked,
                             pick_position=None, files=None, cutoff=None, progress=PROGRESS):
        """The sample image clicked last, searched by both checkpoints side by side, its own class known."""
        return self.compare(PICKED, (picked, pick_position), checkpoint_choice, second_checkpoint, source, k, None,
                            files, cutoff, progress)

    @reporting(message_slot=0, outputs=2, cleared={1: ""})
    def show_hardest(self, checkpoint_choice, second_checkpoint, source, order, compare=False,
                     files=None, cutoff=None, progress=PROGRESS):
        """The gallery's hardest queries for the checkpoint, or where the two checkpoints differ most; hits below the
        similarity cut-off (a cosine, or empty) dimmed, as the search's are."""
        orders = dict((value, label) for label, value in hardest.ORDERS)
        if not compare and order not in orders:
            raise RetrievalError(f"order the hardest queries by {' or by '.join(orders.values())}")
        cutoff = threshold.parse_cutoff(cutoff)
        ranked = _ranked_pair(self.retrieval, checkpoint_choice, second_checkpoint, source, files, progress, compare)
        checkpoint, gallery, rankings = ranked[0]
        how = (f"each row the query, its {RANKED_K} nearest marked same or other class, then the nearest images of its "
               "class it missed, greyed, at their ranks")
        if cutoff is not None:
            how += f"; those below the cut-off {cutoff:.4f} dimmed"
        if not compare:
            positions = hardest_queries(rankings, by=order, count=hardest.ROWS)
            summary = (f"**The {len(positions)} hardest** of {len(rankings):,} queries of {gallery.description} for "
                       f"`{checkpoint.name}`, by {orders[order]}: {how}.")
            return summary, hardest.hardest_html(gallery, rankings, positions, cutoff)
        second, _, second_rankings = ranked[1]
        better = largest_differences(rankings, second_rankings, count=hardest.ROWS)
        names = (checkpoint.name, second.name)
        summary = (f"**Where they differ most**: the queries of {gallery.description} whose AP@R differs most between "
                   f"`{names[0]}` and `{names[1]}`, both ways; {how}.")
        return summary, hardest.differences_html(gallery, names, (rankings, second_rankings), better, cutoff)

    @reporting(message_slot=0, outputs=4, cleared={1: None, 2: None, 3: None})
    def show_per_class(self, checkpoint_choice, second_checkpoint, source, compare=False,
                       files=None, progress=PROGRESS):
        """Recall@1, R-Precision and MAP@R per class (and the difference of two checkpoints), the most-confused pairs,
        and the table as a CSV."""
        import pandas as pd

        ranked = _ranked_pair(self.retrieval, checkpoint_choice, second_checkpoint, source, files, progress, compare)
        gallery = ranked[0][1]
        names = [checkpoint.name for checkpoint, _, _ in ranked]
        tables = [per_class_metrics(rankings) for _, _, rankings in ranked]
        difference = per_class_difference(*tables) if compare else None
        letters = per_class_table.LETTERS[:len(names)]
        frame = per_class_table.table(gallery, list(letters), tables, difference)
        confusions = [per_class_table.confusions_table(gallery, confused_class_pairs(rankings, gallery.labels,
                                                                                     per_class_table.CONFUSED_PAIRS))
                      for _, _, rankings in ranked]
        if compare:
            for letter, one in zip(letters, confusions, strict=True):
                one.insert(0, "checkpoint", letter)
        keys = tuple(checkpoint.key for checkpoint, _, _ in ranked) + (gallery.key,)
        csv = per_class_table.write_csv(per_class_table.table(gallery, names, tables, difference),
                                        self.retrieval.settings.downloads_dir, keys, "per-class-" + "-vs-".join(names))
        overall = [table.overall() for table in tables]
        means = "; ".join(f"{letter + ' = ' if compare else ''}`{name}`: Recall@1 {one['recall@1']:.3f}, R-Precision "
                          f"{one['r_precision']:.3f}, MAP@R {one['map@r']:.3f}"
                          for letter, name, one in zip(letters, names, overall, strict=True))
        summary = (f"**Per class**: {len(frame):,} classes of {gallery.description}, the worst MAP@R first; click a "
                   f"column's header to sort. Over all queries: {means}." + (DIFFERENCE_NOTE if compare else ""))
        return summary, frame, pd.concat(confusions, ignore_index=True), str(csv)

    @reporting(message_slot=0, outputs=2, cleared={1: None})
    def show_threshold(self, checkpoint_choice, source, fmr=threshold.DEFAULT_FMR, cutoff=None,
                       files=None, progress=PROGRESS):
        """The gallery's pair cosines by class sameness, the FNMR at the chosen FMR (and at each offered one), and the
        cut-off's FMR and FNMR when one is set."""
        fmr = threshold.chosen_fmr(fmr)
        cutoff = threshold.parse_cutoff(cutoff)
        checkpoint, gallery, pairs = _pairs_of(self.retrieval, checkpoint_choice, source, files, progress)
        points = {value: pairs.threshold_at_fmr(value) for _, value in threshold.FMRS}
        at_cutoff = None if cutoff is None else pairs.at_threshold(cutoff)
        return (threshold.summary(checkpoint.name, gallery, pairs, points, fmr, at_cutoff),
                threshold.figure(pairs, points[fmr].threshold, fmr, cutoff))

    @reporting(message_slot=0, outputs=2)
    def threshold_as_cutoff(self, checkpoint_choice, source, fmr=threshold.DEFAULT_FMR,
                            files=None, progress=PROGRESS):
        """The cut-off box set to the threshold at the chosen FMR, so that the result tiles honour it."""
        fmr = threshold.chosen_fmr(fmr)
        _, _, pairs = _pairs_of(self.retrieval, checkpoint_choice, source, files, progress)
        cutoff = threshold.cutoff_for(pairs.threshold_at_fmr(fmr).threshold)
        note = (f"Cut-off set to {cutoff}, the threshold at FMR {fmr:g} rounded up: hits below it are dimmed in the "
                "Search view and Side by side. Empty the box for none.")
        return note, cutoff


DIFFERENCE_NOTE = (" Δ is A minus B in percentage points (100 × the difference), as the Train tab gives MemVir minus "
                   "its baseline.")


# ---------------------------------------------------------------------------------------------- layout and wiring
def build(retrieval: RetrievalService) -> gr.Dropdown:
    """The Retrieve tab, inside the page's gr.Tabs, with its events; returns the checkpoint choice, which the page's
    load event refreshes. Its components are kept in one namespace (`ui`) that the layout parts fill and the wiring
    parts read."""
    handlers = RetrieveHandlers(retrieval)
    ui = SimpleNamespace()
    with gr.Tab("Retrieve", id="retrieve") as retrieve_tab:
        ui.picked = gr.State(None)
        ui.pick_position = gr.State(None)  # the sample image clicked last, for Side by side
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                _choices_column(retrieval, ui)
            with gr.Column(scale=2), gr.Tabs(elem_id="retrieve-views"):
                with gr.Tab("Search", elem_id="view-search"):
                    _search_view(ui)
                with gr.Tab("Hardest", elem_id="view-hardest"):
                    _hardest_view(ui)
                # The gallery-wide figures share one tab: a fourth view tab folds into a "..." menu on a phone.
                with gr.Tab("Metrics", elem_id="view-metrics"), gr.Tabs(elem_id="metrics-views"):
                    _metrics_view(ui)
    _wire_choices(handlers, ui, retrieve_tab)
    _wire_search(handlers, ui)
    _wire_views(handlers, ui)
    return ui.checkpoint


def _choices_column(retrieval: RetrievalService, ui: SimpleNamespace) -> None:
    """The left column: the checkpoints, the gallery, k, the query's class, the cut-off, the downloads."""
    choices = retrieval.checkpoint_choices()
    default = retrieval.default_checkpoint()
    ui.checkpoint = gr.Dropdown(choices, value=default, allow_custom_value=True, label="Checkpoint",
                                info="Bundled, a run of this app, or type a Hub repo id (owner/name).",
                                elem_id="checkpoint")
    ui.second_checkpoint = gr.Dropdown(choices, value=retrieval.comparison_checkpoint(default),
                                       allow_custom_value=True, label="Compare with",
                                       info="A second checkpoint, for Side by side and the views.",
                                       elem_id="second-checkpoint")
    ui.source = refuse_outside_choices(gr.Radio(GALLERY_SOURCES, value=TEST_SPLIT, label="Gallery to search"),
                                       "the gallery to search")
    # Shown once uploads are chosen: on a phone this column comes first, and a drop zone here would
    # sit above the query's own.
    ui.gallery_files = gr.File(label="Gallery upload: images, or one zip of class folders",
                               file_count="multiple", elem_id="gallery-files", visible=False)
    ui.load_button = gr.Button("Load checkpoint and gallery", variant="secondary", elem_id="load")
    ui.k = gr.Slider(1, 30, value=8, step=1, label="Results (k)")
    ui.query_class = gr.Textbox("", label="Query's class (optional)", info="Marks each hit same class or "
                                "other class.", elem_id="query-class",
                                placeholder=query_class_example(retrieval, default, TEST_SPLIT))
    # Typing the character is quickest; the list shows which classes the gallery has (a test split
    # holds other classes than training saw).
    ui.class_list = gr.Dropdown(query_class_choices(retrieval, default, TEST_SPLIT), value=None,
                                label="or pick one of the gallery's classes", filterable=True,
                                elem_id="query-class-list")
    # A text box: an empty gr.Number shows and sends 0, which would dim every hit below a cosine of 0.
    ui.cutoff = gr.Textbox("", label="Similarity cut-off (optional)", placeholder="a cosine, e.g. 0.6; "
                           "empty for none", info="Hits below it are dimmed and marked \u201cbelow the "
                           "cut-off\u201d. The Threshold view sets it at a chosen FMR.", elem_id="cutoff")
    ui.download_button = gr.Button("Download checkpoint (.zip)", size="sm", elem_id="download-checkpoint")
    ui.download_note = gr.Markdown("", elem_classes="small-note", elem_id="download-note")
    ui.checkpoint_zip = gr.File(label="Checkpoint zip", interactive=False, elem_id="checkpoint-zip")
    ui.export_button = gr.Button("Export the gallery's embeddings (TensorBoard projector, .npz)", size="sm",
                                 elem_id="export-gallery")
    ui.export_note = gr.Markdown("", elem_classes="small-note", elem_id="export-note")
    ui.export_zip = gr.File(label="TensorBoard projector bundle (.zip)", interactive=False, visible=False,
                            elem_id="export-zip")
    ui.export_npz = gr.File(label="Embeddings, labels, class names (.npz)", interactive=False,
                            visible=False, elem_id="export-npz")


def _search_view(ui: SimpleNamespace) -> None:
    """The Search view: the query's sources (upload, drawing, a sample to pick), the model input, the results."""
    ui.about = gr.Markdown("Choose a checkpoint and press **Load**, or search straight away.",
                           elem_id="retrieval-summary")
    # Short tab names: longer ones fold into a "..." menu on a phone.
    with gr.Tabs(elem_id="query-tabs"):
        with gr.Tab("Upload", elem_id="query-upload"):
            ui.query_file = gr.File(label="Query image (PNG, JPEG, BMP, WebP or GIF)", file_count="single",
                                    elem_id="query-file")
            ui.search_upload_button = gr.Button("Search with this image", variant="primary",
                                                elem_id="search-upload")
            ui.compare_upload_button = gr.Button("Side by side with the second checkpoint",
                                                 elem_id="compare-upload")
        with gr.Tab("Draw", elem_id="query-draw"):
            ui.sketch = pass_undecoded(gr.Sketchpad(
                   PAPER, image_mode="RGBA", canvas_size=(SKETCH_SIZE, SKETCH_SIZE),
                   label="Draw one character", elem_id="sketch",
                   brush=gr.Brush(colors=["#000000"], default_size=14, color_mode="fixed")))
            ui.search_drawing_button = gr.Button("Search with this drawing", variant="primary",
                                                 elem_id="search-drawing")
            ui.compare_drawing_button = gr.Button("Side by side with the second checkpoint",
                                                  elem_id="compare-drawing")
        with gr.Tab("Pick", elem_id="query-pick") as ui.pick_tab:
            # "contain": a photo's thumbnail whole, not cropped to the square tile.
            ui.sample_gallery = gr.Gallery(label="Click an image to search with it", columns=8, height=300,
                                           allow_preview=False, object_fit="contain", elem_id="sample")
            ui.compare_pick_button = gr.Button("Side by side with the second checkpoint (the image "
                                               "clicked last)", elem_id="compare-pick")
    with gr.Row(equal_height=False):
        with gr.Column(scale=0, min_width=176):
            # its label above it, not gradio's badge over the image's corner (it covered the
            # drawn query's strokes)
            gr.Markdown("**Model input**: the query as the model sees it", elem_id="model-input-label",
                        elem_classes="small-note")
            ui.seen_query = gr.Image(label="Model input", show_label=False, height=160, width=160,
                                     interactive=False, buttons=[], elem_id="model-input")
        with gr.Column(scale=1, min_width=240):
            ui.result_tiles = gr.HTML("", js_on_load=None, elem_id="results")
    # a click on a result tile, as the page's script sends it: out of sight
    ui.clicked_result = gr.Textbox("", visible="hidden", elem_id="tile-pick")
    ui.tile_clicked = gr.Button("Search with the result clicked", visible="hidden",
                                elem_id="tile-pick-go")


def _hardest_view(ui: SimpleNamespace) -> None:
    """The Hardest view: the gallery's worst queries, or where the two checkpoints differ."""
    gr.Markdown("The gallery's own images as queries, worst first: what the checkpoint gets wrong, "
                "and the images of the query's class it should have found. With **Compare with**, "
                "the queries where the two checkpoints differ most.", elem_classes="small-note")
    with gr.Row():
        ui.hardest_order = refuse_outside_choices(
               gr.Radio(hardest.ORDERS, value="map@r", label="Hardest by", elem_id="hardest-order"),
               "the order of the hardest queries")
        ui.hardest_compare = gr.Checkbox(False, label="Where the two checkpoints differ",
                                         elem_id="hardest-compare")
    ui.hardest_button = gr.Button("Show the hardest queries", variant="primary", elem_id="show-hardest")
    ui.hardest_summary = gr.Markdown("", elem_id="hardest-summary")
    ui.hardest_rows = gr.HTML("", js_on_load=None, elem_id="hardest")


def _metrics_view(ui: SimpleNamespace) -> None:
    """The Metrics view: the table per class and the threshold view."""
    with gr.Tab("Per class", elem_id="view-per-class"):
        ui.per_class_compare = gr.Checkbox(False, label="With the second checkpoint and the difference",
                                           elem_id="per-class-compare")
        ui.per_class_button = gr.Button("Show the table per class", variant="primary",
                                        elem_id="show-per-class")
        ui.per_class_summary = gr.Markdown("", elem_id="per-class-summary")
        ui.per_class_frame = gr.Dataframe(label="Each class's metrics (click a header to sort)",
                                          interactive=False, max_height=420, elem_id="per-class-table")
        ui.per_class_csv = gr.File(label="The table as CSV", interactive=False, elem_id="per-class-csv")
        ui.confused_frame = gr.Dataframe(label="Most-confused pairs of classes", interactive=False,
                                         max_height=320, elem_id="confused-pairs")
    with gr.Tab("Threshold", elem_id="view-threshold"):
        gr.Markdown("Every pair of the gallery's images, same class or not, by its cosine similarity: "
                    "the threshold that lets through at most the chosen share of other-class pairs "
                    "(FMR), and the share of same-class pairs it turns away there (FNMR). Set it as "
                    "the cut-off and the result tiles below it are dimmed, at their ranks.",
                    elem_classes="small-note")
        ui.fmr = refuse_outside_choices(
               gr.Radio(threshold.FMRS, value=threshold.DEFAULT_FMR, label="False match rate at most",
                        elem_id="threshold-fmr"), "the false match rate")
        with gr.Row():
            ui.threshold_button = gr.Button("Show the threshold view", variant="primary",
                                            elem_id="show-threshold")
            ui.cutoff_button = gr.Button("Use this threshold as the cut-off", elem_id="use-threshold")
        ui.threshold_summary = gr.Markdown("", elem_id="threshold-summary")
        ui.threshold_plot = gr.Plot(label="Pairs by cosine similarity", elem_id="threshold-plot")
        ui.cutoff_note = gr.Markdown("", elem_classes="small-note", elem_id="cutoff-note")


def _wire_choices(handlers: RetrieveHandlers, ui: SimpleNamespace, retrieve_tab: gr.Tab) -> None:
    """The checkpoint lists, Load (and Pick opened before it), the query's class hint, the downloads."""
    hidden = {"api_visibility": "private", "show_progress": "hidden"}
    gallery = [ui.checkpoint, ui.source, ui.gallery_files]
    retrieve_tab.select(handlers.checkpoint_list, None, [ui.checkpoint], api_name="list_checkpoints",
                        **hidden)
    retrieve_tab.select(handlers.checkpoint_list, None, [ui.second_checkpoint], api_name="list_second_checkpoints",
                        **hidden)
    # Load's one listener; the query's class hint follows it, for a gallery uploaded since the last choice
    ui.load_button.click(handlers.prepare, gallery, [ui.about, ui.sample_gallery, ui.picked],
                         api_name="prepare_retrieval",
                         api_visibility="private").then(
        handlers.query_class_hint, gallery, [ui.query_class, ui.class_list], api_name="query_class_hint_after_load",
        **hidden)
    ui.pick_tab.select(handlers.sample_unless_shown, [*gallery, ui.picked], [ui.about, ui.sample_gallery, ui.picked],
                       api_name="sample_for_pick", api_visibility="private", show_progress="minimal")
    ui.source.change(gallery_upload_shown, [ui.source], [ui.gallery_files], api_name="show_gallery_upload", **hidden)
    gr.on([ui.checkpoint.change, ui.source.change], handlers.query_class_hint, gallery,
          [ui.query_class, ui.class_list], api_name="query_class_hint", **hidden)
    ui.class_list.input(picked_class, [ui.class_list], [ui.query_class], api_name="pick_query_class", **hidden)
    ui.download_button.click(handlers.download_checkpoint, [ui.checkpoint], [ui.download_note, ui.checkpoint_zip],
                             api_name="download_checkpoint", api_visibility="private")
    # Clearing the sketch leaves Gradio's editor on its upload tool; a fresh sheet brings the brush back.
    ui.sketch.clear(lambda: PAPER, None, [ui.sketch], api_name="clear_sketch", **hidden)
    ui.export_button.click(handlers.export_gallery, gallery, [ui.export_note, ui.export_zip, ui.export_npz],
                           api_name="export_gallery", api_visibility="private")


def _wire_search(handlers: RetrieveHandlers, ui: SimpleNamespace) -> None:
    """Each query source's search and side by side."""
    outputs = [ui.about, ui.result_tiles, ui.seen_query]
    one, two = [ui.checkpoint, ui.source, ui.k], [ui.checkpoint, ui.second_checkpoint, ui.source, ui.k]
    ui.search_upload_button.click(handlers.search_upload,
                                  one + [ui.query_class, ui.query_file, ui.gallery_files, ui.cutoff], outputs,
                                  api_name="search_upload", api_visibility="private")
    # a click on a result, as the page's script sends it (demo/static/page.js): its gallery and item
    ui.tile_clicked.click(handlers.search_result_tile, one + [ui.clicked_result, ui.gallery_files, ui.cutoff],
                          outputs, api_name="search_result_tile", api_visibility="private")
    ui.search_drawing_button.click(handlers.search_drawing,
                                   one + [ui.query_class, ui.sketch, ui.gallery_files, ui.cutoff], outputs,
                                   api_name="search_drawing", api_visibility="private")
    ui.sample_gallery.select(handlers.search_gallery_item, one + [ui.picked, ui.gallery_files, ui.cutoff], outputs,
                             api_name="search_gallery_item", api_visibility="private")
    ui.sample_gallery.select(remember_pick, [ui.picked], [ui.pick_position], api_name="remember_pick",
                             api_visibility="private", show_progress="hidden")
    ui.compare_pick_button.click(handlers.compare_gallery_item,
                                 two + [ui.picked, ui.pick_position, ui.gallery_files, ui.cutoff], outputs,
                                 api_name="compare_gallery_item", api_visibility="private")
    ui.compare_upload_button.click(handlers.compare_upload,
                                   two + [ui.query_class, ui.query_file, ui.gallery_files, ui.cutoff], outputs,
                                   api_name="compare_upload", api_visibility="private")
    ui.compare_drawing_button.click(handlers.compare_drawing,
                                    two + [ui.query_class, ui.sketch, ui.gallery_files, ui.cutoff], outputs,
                                    api_name="compare_drawing", api_visibility="private")


def _wire_views(handlers: RetrieveHandlers, ui: SimpleNamespace) -> None:
    """The hardest queries, the table per class, the threshold view and its cut-off."""
    two = [ui.checkpoint, ui.second_checkpoint, ui.source]
    ui.hardest_button.click(handlers.show_hardest,
                            two + [ui.hardest_order, ui.hardest_compare, ui.gallery_files, ui.cutoff],
                            [ui.hardest_summary, ui.hardest_rows], api_name="hardest_queries",
                            api_visibility="private")
    ui.per_class_button.click(handlers.show_per_class, two + [ui.per_class_compare, ui.gallery_files],
                              [ui.per_class_summary, ui.per_class_frame, ui.confused_frame, ui.per_class_csv],
                              api_name="per_class_metrics", api_visibility="private")
    threshold_view = [ui.checkpoint, ui.source, ui.fmr, ui.cutoff, ui.gallery_files]
    ui.threshold_button.click(handlers.show_threshold, threshold_view, [ui.threshold_summary, ui.threshold_plot],
                              api_name="threshold_view", api_visibility="private")
    # A page convenience (the client API's /threshold gives a client the thresholds); the view is redrawn with the
    # cut-off's line.
    ui.cutoff_button.click(handlers.threshold_as_cutoff, [ui.checkpoint, ui.source, ui.fmr, ui.gallery_files],
                           [ui.cutoff_note, ui.cutoff], api_name="threshold_as_cutoff", api_visibility="private").then(
        handlers.show_threshold, threshold_view, [ui.threshold_summary, ui.threshold_plot],
        api_name="threshold_view_with_cutoff", api_visibility="private")
