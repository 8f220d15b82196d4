"""The Retrieve tab: choose a checkpoint and a gallery, then search with an uploaded, drawn or clicked query.

Handlers are module-level functions of the `RetrievalService` (bound in by `build`), so tests call them directly.
They read the widgets, ask the service (demo/retrieval.py) and turn its results into tiles and a summary; the
models, galleries and indexes are the service's.
"""

from __future__ import annotations

import gradio as gr

from demo.handlers import bind, reporting
from demo.inputs import whole_number
from demo.retrieval import Gallery, IndexedGallery, LoadedCheckpoint, RetrievalService, thumbnail
from demo.sketchpad import pass_undecoded
from demo.uploads import load_image, load_sketch

TEST_SPLIT, UPLOADED = "test split", "uploaded"
GALLERY_SOURCES = [("the checkpoint's test split", TEST_SPLIT), ("my uploaded images or zip", UPLOADED)]


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


@reporting(message_slot=0, outputs=3)
def prepare(retrieval: RetrievalService, checkpoint_choice, source, files=None):
    """Load the checkpoint and index the gallery; show a sample of it to click."""
    checkpoint = retrieval.load_checkpoint(checkpoint_choice)
    gallery = gallery_for(retrieval, checkpoint, source, files)
    indexed = retrieval.index(checkpoint, gallery)
    sample = retrieval.sample(gallery)
    tiles = [(thumbnail(gallery.image(i), gallery.glyphs), gallery.class_of(i) or f"item {i}") for i in sample]
    return describe(checkpoint, gallery, indexed), tiles, {"sample": sample, "gallery": gallery.key}


def results(retrieval: RetrievalService, checkpoint: LoadedCheckpoint, gallery: Gallery, query, k, drawn=False,
            exclude=None, query_class=None):
    """(summary, result tiles, the query as the model sees it) for one search."""
    indexed = retrieval.index(checkpoint, gallery)
    hits = retrieval.search(checkpoint, gallery, query, whole_number(k, "results (k)", 1), drawn=drawn,
                            exclude=exclude, query_class=query_class)
    tiles = []
    for rank, hit in enumerate(hits, 1):
        # Short, so the tile shows it whole: rank, cosine similarity, same/different mark, the class.
        mark = {True: " ✅", False: " ❌", None: ""}[hit.same_class]
        name = f" {hit.class_name.split(' ')[0] if gallery.glyphs else hit.class_name}" if hit.class_name else ""
        tiles.append((thumbnail(gallery.image(hit.index), gallery.glyphs), f"#{rank} {hit.score:.3f}{mark}{name}"))
    summary = (f"{len(hits)} nearest of {gallery.size:,} images in {gallery.description}, with their cosine "
               "similarity" + (" (✅ same class as the query, ❌ different)" if query_class else ""))
    if query_class is not None:
        same = sum(hit.same_class is True for hit in hits)
        summary += f" · {same} of {len(hits)} share the query's class ({query_class})"
    summary = describe(checkpoint, gallery, indexed) + "  \n" + summary + "."
    shown = thumbnail(retrieval.model_input(checkpoint, query, fit_ink=drawn), checkpoint.is_glyph_model, 128)
    return summary, tiles, shown


@reporting(message_slot=0, outputs=3)
def search_upload(retrieval: RetrievalService, checkpoint_choice, source, k, query_class, query_file=None,
                  files=None):
    if not query_file:
        raise ValueError("upload a query image first")
    checkpoint = retrieval.load_checkpoint(checkpoint_choice)
    gallery = gallery_for(retrieval, checkpoint, source, files)
    settings = retrieval.settings
    image = load_image(query_file, settings.max_image_bytes, settings.max_image_pixels)
    return results(retrieval, checkpoint, gallery, image, k, query_class=retrieval.match_class(gallery, query_class))


@reporting(message_slot=0, outputs=3)
def search_drawing(retrieval: RetrievalService, checkpoint_choice, source, k, query_class, sketch=None, files=None):
    settings = retrieval.settings
    composite = load_sketch(sketch, settings.max_image_bytes, settings.max_image_pixels)
    if composite is None:
        raise ValueError("draw a character on the sketchpad first")
    checkpoint = retrieval.load_checkpoint(checkpoint_choice)
    gallery = gallery_for(retrieval, checkpoint, source, files)
    return results(retrieval, checkpoint, gallery, composite, k, drawn=True,
                   query_class=retrieval.match_class(gallery, query_class))


@reporting(message_slot=0, outputs=3)
def search_gallery_item(retrieval: RetrievalService, checkpoint_choice, source, k, picked, files=None,
                        evt: gr.SelectData = None):
    """Search with the sample image clicked (in the gallery that Load sampled)."""
    checkpoint = retrieval.load_checkpoint(checkpoint_choice)
    gallery = gallery_for(retrieval, checkpoint, source, files)
    if not picked or picked.get("gallery") != gallery.key:
        raise ValueError("the gallery changed: press Load again, then pick an image")
    index = picked["sample"][evt.index]
    return results(retrieval, checkpoint, gallery, gallery.image(index), k, exclude=index,
                   query_class=gallery.class_of(index))


def checkpoint_list(retrieval: RetrievalService):
    """The checkpoint choices as they are now (a run may have saved one since the page was built)."""
    return gr.update(choices=retrieval.checkpoint_choices())


# ---------------------------------------------------------------------------------------------- layout and wiring
def build(retrieval: RetrievalService) -> gr.Dropdown:
    """The Retrieve tab, inside the page's gr.Tabs, with its events; returns the checkpoint choice, which the page's
    load event refreshes."""
    choices = retrieval.checkpoint_choices()
    with gr.Tab("Retrieve", id="retrieve") as retrieve_tab:
        picked = gr.State(None)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                checkpoint = gr.Dropdown(choices, value=choices[0][1] if choices else None, allow_custom_value=True,
                                         label="Checkpoint",
                                         info="Bundled, a run of this app, or type a Hub repo id (owner/name).",
                                         elem_id="checkpoint")
                source = gr.Radio(GALLERY_SOURCES, value=TEST_SPLIT, label="Gallery to search")
                gallery_files = gr.File(label="Gallery upload: images, or one zip of class folders",
                                        file_count="multiple", elem_id="gallery-files")
                load_button = gr.Button("Load checkpoint and gallery", variant="secondary", elem_id="load")
                k = gr.Slider(1, 30, value=8, step=1, label="Results (k)")
                query_class = gr.Textbox("", label="Query's class (optional)",
                                         placeholder="e.g. Ж, to mark hits same/different")
            with gr.Column(scale=2):
                about = gr.Markdown("Choose a checkpoint and press **Load**, or search straight away.",
                                    elem_id="retrieval-summary")
                with gr.Tabs():
                    with gr.Tab("Upload a query"):
                        query_file = gr.File(label="Query image (PNG, JPEG, BMP, WebP or GIF)", file_count="single",
                                             elem_id="query-file")
                        search_upload_button = gr.Button("Search with this image", variant="primary",
                                                         elem_id="search-upload")
                    with gr.Tab("Draw a query"):
                        sketch = pass_undecoded(gr.Sketchpad(
                            image_mode="RGBA", canvas_size=(320, 320), label="Draw one character",
                            brush=gr.Brush(colors=["#000000"], default_size=14, color_mode="fixed"),
                            elem_id="sketch"))
                        search_drawing_button = gr.Button("Search with this drawing", variant="primary",
                                                          elem_id="search-drawing")
                    with gr.Tab("Pick from the gallery"):
                        sample_gallery = gr.Gallery(label="Click an image to search with it", columns=8, height=300,
                                                    allow_preview=False, elem_id="sample")
                with gr.Row():
                    seen_query = gr.Image(label="Model input", height=160, width=160, interactive=False, scale=1)
                    result_gallery = gr.Gallery(label="Nearest gallery images", columns=5, height=420, scale=4,
                                                elem_id="results")

    retrieve_tab.select(bind(checkpoint_list, retrieval), None, [checkpoint], api_name="list_checkpoints",
                        show_progress="hidden")
    load_button.click(bind(prepare, retrieval), [checkpoint, source, gallery_files], [about, sample_gallery, picked],
                      api_name="prepare_retrieval")
    search_outputs = [about, result_gallery, seen_query]
    search_upload_button.click(bind(search_upload, retrieval),
                               [checkpoint, source, k, query_class, query_file, gallery_files], search_outputs,
                               api_name="search_upload")
    search_drawing_button.click(bind(search_drawing, retrieval),
                                [checkpoint, source, k, query_class, sketch, gallery_files], search_outputs,
                                api_name="search_drawing")
    sample_gallery.select(bind(search_gallery_item, retrieval), [checkpoint, source, k, picked, gallery_files],
                          search_outputs, api_name="search_gallery_item")
    return checkpoint
