"""The page: gr.Blocks layout and event wiring, nothing else.

Handlers translate between widgets and the `RunManager` / `RetrievalService`; every one has an explicit api_name, so
the page is also a public API (gradio_client). Bad input anywhere becomes a warning toast plus a message in the
page, never a traceback. Heavy modules (torch, the trainer, faiss) are imported inside handlers, so the page is
served before they load.
"""

from __future__ import annotations

import functools
import logging
import uuid

import gradio as gr

from demo import live_view
from demo.allowed_paths import dataset_folder
from demo.inputs import positive_number, whole_number
from demo.retrieval import RetrievalService, thumbnail
from demo.runs import RunManager
from demo.settings import AppSettings
from demo.sketchpad import pass_undecoded
from demo.uploads import load_image, load_sketch, unpack_upload

log = logging.getLogger(__name__)

FOLDER_CHOICE, ZIP_CHOICE = "folder", "zip"
DATASET_CHOICES = [
    ("glyphs: the embedded characters (~2,000 classes)", "glyphs"),
    ("glyphs-mini: 48 characters, for a quick look", "glyphs-mini"),
    ("a folder of class folders on this machine", FOLDER_CHOICE),
    ("an uploaded zip of class folders", ZIP_CHOICE),
]
# memvir.LOSSES and memvir.models.available_backbones(), written out so the page is built without importing torch
# (tests/test_app_units.py checks that they agree).
LOSS_CHOICES = ("softmax", "norm-softmax", "cosface", "arcface", "curricularface", "proxy-nca", "proxy-anchor")
BACKBONE_CHOICES = ("convnet", "convnet-gn", "googlenet", "resnet18", "resnet50")
# memvir.memory.SCHEDULES, with what each means (tests/test_app_units.py checks that they agree)
SCHEDULE_CHOICES = [("one more virtual set every M+1 steps after the warm-up (the paper's)", "curriculum"),
                    ("all N virtual sets at the warm-up's end (the paper's Fig. 3 ablation)", "all-at-once")]
# memvir.train's memory dtypes offered here: float16 halves MemVir's memory (demo/memory_budget.py offers it)
STORE_DTYPE_CHOICES = [("float32", "float32"), ("float16: half the memory", "float16")]
TEST_SPLIT, UPLOADED = "test split", "uploaded"
GALLERY_SOURCES = [("the checkpoint's test split", TEST_SPLIT), ("my uploaded images or zip", UPLOADED)]
DEFAULTS = dict(dataset="glyphs", backbone="convnet", loss="norm-softmax", batch_size=128, epochs=8, lr=1e-3, seed=0,
                memvir_n=2, memvir_m=50, warmup_epochs=2.0, memvir_schedule="curriculum", val_classes=0,
                memvir_store_dtype="float32",
                snapshot_every=10, eval_every=1)
POLL_SECONDS = 1.0
CSS = """
#run-status {min-height: 3.2em}
#notice {min-height: 1.6em; color: var(--body-text-color-subdued)}
.small-note {font-size: 0.9em; color: var(--body-text-color-subdued)}
"""
THEME = gr.themes.Soft(primary_hue="blue", secondary_hue="orange")


def _visitor(visitor: str | None, request: gr.Request | None) -> str:
    """Who is asking: the key the browser keeps (survives reloads), else the API client's session."""
    if visitor:
        return visitor
    return getattr(request, "session_hash", None) or "anonymous"


def _reporting(message_slot: int, outputs: int):
    """Turn a refused request into a warning toast and a message in output `message_slot`; other outputs keep
    their values. Unexpected errors are logged with their traceback for the operator, shown as one line."""

    def decorate(handler):
        @functools.wraps(handler)
        def wrapper(*args, **kwargs):
            try:
                return handler(*args, **kwargs)
            except ValueError as error:
                message = str(error)
            except Exception as error:  # noqa: BLE001 - the page shows a line, the log keeps the traceback
                log.exception("%s failed", handler.__name__)
                message = f"Something went wrong ({type(error).__name__}: {error})."
            gr.Warning(message)
            values = [gr.skip()] * outputs
            values[message_slot] = f"⚠️ {message}"
            return tuple(values) if outputs > 1 else values[0]

        return wrapper

    return decorate


def build_app(settings: AppSettings | None = None, runs: RunManager | None = None,
              retrieval: RetrievalService | None = None) -> gr.Blocks:
    """The whole page. `runs` and `retrieval` default to fresh ones for `settings` (from the environment)."""
    settings = settings or AppSettings.from_env()
    runs = runs or RunManager(settings)
    retrieval = retrieval or RetrievalService(settings, uploads_in_use=runs.dataset_folders_in_use)
    figure_builder = live_view.FigureBuilder()

    # ------------------------------------------------------------------------------------------ train handlers
    def dataset_name(dataset, folder_path, zip_file) -> str:
        if dataset == FOLDER_CHOICE:
            if not str(folder_path or "").strip():
                raise ValueError("type the path of a folder holding one sub-folder of images per class")
            return f"folder:{dataset_folder(folder_path.strip(), settings)}"
        if dataset == ZIP_CHOICE:
            if not zip_file:
                raise ValueError("upload a zip of class folders first (one folder of images per class)")
            root = unpack_upload(zip_file, settings, settings.max_training_images, runs.dataset_folders_in_use())
            return f"folder:{root}"
        return dataset

    @_reporting(message_slot=1, outputs=2)
    def start(tab, dataset, backbone, loss, batch_size, epochs, lr, seed, memvir_n, memvir_m, warmup_epochs,
              snapshot_every, eval_every, folder_path=None, zip_file=None, memvir_schedule="curriculum", val_classes=0,
              memvir_store_dtype="float32", visitor=None, request: gr.Request = None):
        from memvir.train import TrainConfig

        visitor = _visitor(visitor, request)
        # Every number is checked before the dataset: a refused setting never costs the unpacking of a zip.
        numbers = dict(
            batch_size=whole_number(batch_size, "batch size", 1), epochs=whole_number(epochs, "epochs", 1),
            lr=positive_number(lr, "learning rate"), seed=whole_number(seed, "seed", 0),
            memvir_n=whole_number(memvir_n, "N", 0), memvir_m=whole_number(memvir_m, "M", 0),
            warmup_epochs=float(warmup_epochs or 0),
            val_classes=whole_number(val_classes or 0, "validation classes", 0),
            snapshot_every=whole_number(snapshot_every, "snapshot every", 0),
            eval_every=whole_number(eval_every, "eval every", 0),
        )
        config = TrainConfig(
            dataset=dataset_name(dataset, folder_path, zip_file), backbone=backbone, loss=loss, **numbers,
            memvir_schedule=memvir_schedule or DEFAULTS["memvir_schedule"],
            memvir_store_dtype=memvir_store_dtype or DEFAULTS["memvir_store_dtype"],
            eval_at_start=False,  # the first loss point within seconds; Recall@1 follows at the first epoch's end
        )
        run = runs.start(config, visitor)
        return {"run_id": run.id, "after": None}, f"Started run `{run.id}`."

    def shown_run_id(tab, visitor) -> str | None:
        """The run this page shows (the buttons act on it), even before its first poll."""
        run = runs.attach(visitor, tab.get("run_id"), after=tab.get("after"))
        return run.id if run else None

    def owned_action(action, done: str):
        @_reporting(message_slot=0, outputs=1)
        def handler(tab, visitor=None, request: gr.Request = None):
            visitor = _visitor(visitor, request)
            run = action(shown_run_id(tab, visitor), visitor)
            return done.format(run=run)

        return handler

    stop = owned_action(runs.stop, "Stopping: the run saves a checkpoint before its next step.")
    pause = owned_action(runs.pause, "Pausing before the next step; Resume continues.")
    resume = owned_action(runs.resume, "Resumed.")
    compare = owned_action(runs.compare_with_baseline,
                           "Baseline (N = 0): {run.message}; it appears in grey on the curves.")

    @_reporting(message_slot=0, outputs=1)
    def update_memvir(tab, memvir_n, memvir_m, warmup_epochs, visitor=None, request: gr.Request = None):
        visitor = _visitor(visitor, request)
        run = runs.get(tab.get("run_id"))
        if run is None or not run.training:
            return "The new MemVir settings apply when you press Start."
        wanted = {"memvir_n": whole_number(memvir_n, "N", 0), "memvir_m": whole_number(memvir_m, "M", 0),
                  "warmup_epochs": float(warmup_epochs or 0)}
        changes = {name: value for name, value in wanted.items() if run.live_values.get(name) != value}
        if not changes:
            return "The run already uses these MemVir settings."
        runs.update(run.id, visitor, **changes)
        return "Asked for the new MemVir settings; the status line says at which step they apply."

    @_reporting(message_slot=1, outputs=12)
    def reset(tab, visitor=None, request: gr.Request = None):
        import time

        visitor = _visitor(visitor, request)
        run = runs.get(tab.get("run_id"))
        message = "Reset: choose the settings and press Start."
        if run is not None and run.owner == visitor and run.busy:
            runs.stop(run.id, visitor)
            message = "Stopped the run (its folder is kept for retrieval) and reset the settings."
        values = [DEFAULTS[name] for name in ("memvir_n", "memvir_m", "warmup_epochs", "batch_size", "epochs",
                                              "lr", "seed", "memvir_schedule", "val_classes", "memvir_store_dtype")]
        return ({"run_id": None, "after": time.time()}, message, *values)

    @_reporting(message_slot=0, outputs=1)
    def push_to_hub(tab, repo_id, visitor=None, request: gr.Request = None):
        from memvir.hub import push

        run = runs.get(tab.get("run_id"))
        if run is None:
            raise ValueError("there is no run to push: train one first")
        if run.owner != _visitor(visitor, request):
            raise ValueError("only the visitor who started this run can push it")
        if run.busy:
            raise ValueError("the run is still training: stop it or let it finish, then push")
        url = push(run.folder, (repo_id or "").strip())
        return f"Pushed to {url}"

    # ------------------------------------------------------------------------------------------ live view
    def poll(tab, color_by, follow, visitor=None, request: gr.Request = None):
        """Every second: status line always; figures only when what they show changed (gr.skip otherwise)."""
        visitor = _visitor(visitor, request)
        run = runs.attach(visitor, tab.get("run_id"), after=tab.get("after"))
        if run is not None and runs.umap_worker is not None:
            run.use_umap(runs.umap_worker)
        new_tab = dict(tab, run_id=run.id if run else tab.get("run_id"))
        status = live_view.status_markdown(run, visitor)
        curves = [gr.skip()] * 3
        if run is None:
            if tab.get("curves", "never") is not None:
                curves = list(live_view.empty_curves())
            new_tab["curves"] = None
        else:
            curve_key, built = figure_builder.curves(run)
            if curve_key != tab.get("curves"):
                curves, new_tab["curves"] = list(built), curve_key
        embedding, caption, slider = gr.skip(), gr.skip(), gr.skip()
        if run is None:
            if tab.get("snapshots", "never") is not None:
                embedding, caption = live_view.embedding_view(None, None, color_by)
                slider = gr.update(maximum=1, value=1)
            new_tab["snapshots"] = None
        elif follow:
            latest = figure_builder.latest_embedding(run, color_by)
            if latest is None and tab.get("snapshots") != (run.id, "none yet"):
                embedding, caption = live_view.embedding_view(None, None, color_by)
                new_tab["snapshots"] = (run.id, "none yet")
            elif latest is not None and (latest[0], color_by) != tab.get("snapshots"):
                # The slider's minimum stays 0: a bound moved per session would refuse values sent before it moved.
                _, step, embedding, caption = latest
                slider = gr.update(maximum=max(step, 1), value=step)
                new_tab["snapshots"] = (latest[0], color_by)
        elif tab.get("snapshots") != (run.id, run.snapshot_version, "scrubbing"):
            slider = gr.update(maximum=live_view.snapshot_range(run)[1])  # more to scrub to; the picture stays
            new_tab["snapshots"] = (run.id, run.snapshot_version, "scrubbing")
        return new_tab, status, *curves, embedding, caption, slider

    def show_snapshot(tab, step, color_by):
        """The snapshot at the scrubbed step; scrubbing back stops following the latest."""
        run = runs.get(tab.get("run_id"))
        figure, caption = live_view.embedding_view(run, step, color_by)
        _, last = live_view.snapshot_range(run)
        return dict(tab, step=step), figure, caption, step >= last

    def recolor(tab, follow, color_by):
        run = runs.get(tab.get("run_id"))
        return live_view.embedding_view(run, None if follow else tab.get("step"), color_by)

    def on_load(visitor=None, request: gr.Request = None):
        from huggingface_hub import get_token

        # A first visit keeps this session's key: a Start pressed before this load event returns was made under it
        # (see _visitor), so that run stays the visitor's own rather than "another visitor's".
        visitor = visitor or getattr(request, "session_hash", None) or uuid.uuid4().hex
        run = runs.attach(visitor, None)
        tab = {"run_id": run.id if run else None, "after": None}
        has_token = bool(get_token())
        note = ("Uploads config.json, model.safetensors, README.md and metrics.jsonl of the run shown here."
                if has_token else
                "Push to Hub is off: no Hugging Face token is configured. Set HF_TOKEN (or run `hf auth login`) "
                "where the app runs, then reload.")
        return visitor, tab, gr.update(interactive=has_token), note, gr.update(choices=retrieval.checkpoint_choices())

    def dataset_inputs(dataset):
        return gr.update(visible=dataset == FOLDER_CHOICE), gr.update(visible=dataset == ZIP_CHOICE)

    # ------------------------------------------------------------------------------------------ retrieval handlers
    def gallery_for(checkpoint, source, files):
        if source == UPLOADED:
            return retrieval.uploaded_gallery(files or [])
        return retrieval.test_split_gallery(checkpoint)

    def describe(checkpoint, gallery, indexed) -> str:
        config = checkpoint.config
        parts = [f"**Checkpoint** `{checkpoint.name}`: {config['backbone']}, {config['embedding_dim']}-d, trained on "
                 f"`{config['dataset']}`.",
                 f"**Gallery**: {gallery.description}, {gallery.size:,} images."]
        if indexed.metrics:
            parts.append(f"On this gallery the checkpoint reaches **Recall@1 {indexed.metrics['recall@1']:.3f}** "
                         f"and **MAP@R {indexed.metrics['map@r']:.3f}** (each item querying all others).")
        return "  \n".join(parts)

    @_reporting(message_slot=0, outputs=3)
    def prepare(checkpoint_choice, source, files=None):
        checkpoint = retrieval.load_checkpoint(checkpoint_choice)
        gallery = gallery_for(checkpoint, source, files)
        indexed = retrieval.index(checkpoint, gallery)
        sample = retrieval.sample(gallery)
        tiles = [(thumbnail(gallery.image(i), gallery.glyphs), gallery.class_of(i) or f"item {i}") for i in sample]
        return describe(checkpoint, gallery, indexed), tiles, {"sample": sample, "gallery": gallery.key}

    def results(checkpoint, gallery, query, k, drawn=False, exclude=None, query_class=None):
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

    @_reporting(message_slot=0, outputs=3)
    def search_upload(checkpoint_choice, source, k, query_class, query_file=None, files=None):
        if not query_file:
            raise ValueError("upload a query image first")
        checkpoint = retrieval.load_checkpoint(checkpoint_choice)
        gallery = gallery_for(checkpoint, source, files)
        image = load_image(query_file, settings.max_image_bytes, settings.max_image_pixels)
        return results(checkpoint, gallery, image, k, query_class=retrieval.match_class(gallery, query_class))

    @_reporting(message_slot=0, outputs=3)
    def search_drawing(checkpoint_choice, source, k, query_class, sketch=None, files=None):
        composite = load_sketch(sketch, settings.max_image_bytes, settings.max_image_pixels)
        if composite is None:
            raise ValueError("draw a character on the sketchpad first")
        checkpoint = retrieval.load_checkpoint(checkpoint_choice)
        gallery = gallery_for(checkpoint, source, files)
        return results(checkpoint, gallery, composite, k, drawn=True,
                       query_class=retrieval.match_class(gallery, query_class))

    @_reporting(message_slot=0, outputs=3)
    def search_gallery_item(checkpoint_choice, source, k, picked, files=None, evt: gr.SelectData = None):
        checkpoint = retrieval.load_checkpoint(checkpoint_choice)
        gallery = gallery_for(checkpoint, source, files)
        if not picked or picked.get("gallery") != gallery.key:
            raise ValueError("the gallery changed: press Load again, then pick an image")
        index = picked["sample"][evt.index]
        return results(checkpoint, gallery, gallery.image(index), k, exclude=index,
                       query_class=gallery.class_of(index))

    def checkpoint_list():
        return gr.update(choices=retrieval.checkpoint_choices())

    # ------------------------------------------------------------------------------------------ layout
    choices = retrieval.checkpoint_choices()
    with gr.Blocks(title="MemVir Studio") as app:
        visitor = gr.BrowserState("", storage_key="memvir-studio-visitor")
        tab = gr.State({"run_id": None, "after": None})
        picked = gr.State(None)
        gr.Markdown("# MemVir Studio\nDeep metric learning with **memory-based virtual classes** (Ko, Gu and Kim, "
                    "ICCV 2021): past steps' embeddings and class weights join the loss as extra classes, a few more "
                    "after each warm-up interval. Train here and watch it happen, then search with the model.")
        with gr.Tabs():
            with gr.Tab("Train", id="train"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=320):
                        dataset = gr.Dropdown(DATASET_CHOICES, value=DEFAULTS["dataset"], label="Dataset")
                        folder_path = gr.Textbox("", label="Folder path", placeholder="/data/my-classes", visible=False,
                                                 info="One sub-folder of images per class; the first half of the "
                                                      "classes (by name) trains, the rest tests.")
                        zip_file = gr.File(label="Zip of class folders", file_count="single", visible=False,
                                           file_types=[".zip"])
                        with gr.Row():
                            backbone = gr.Dropdown(list(BACKBONE_CHOICES), value=DEFAULTS["backbone"],
                                                   label="Backbone")
                            loss = gr.Dropdown(list(LOSS_CHOICES), value=DEFAULTS["loss"], label="Loss")
                        with gr.Row():
                            # Integer controls without precision=0, which rounds 1.5 to 2 unseen (demo/inputs.py).
                            batch_size = gr.Number(DEFAULTS["batch_size"], label="Batch size")
                            epochs = gr.Number(DEFAULTS["epochs"], label="Epochs")
                        with gr.Row():
                            lr = gr.Number(DEFAULTS["lr"], label="Learning rate")
                            seed = gr.Number(DEFAULTS["seed"], label="Seed")
                        with gr.Group():
                            gr.Markdown("**MemVir**: changes apply to a running run at its next step.",
                                        elem_classes="small-note", padding=True)
                            memvir_n = gr.Slider(0, 50, value=DEFAULTS["memvir_n"], step=1,
                                                 label="N: past steps used as virtual classes (0 = baseline)")
                            memvir_m = gr.Slider(0, 200, value=DEFAULTS["memvir_m"], step=1,
                                                 label="M: steps between the past steps used")
                            warmup = gr.Slider(0, 10, value=DEFAULTS["warmup_epochs"], step=0.5,
                                               label="Warm-up (epochs) before virtual classes")
                        with gr.Row():
                            start_button = gr.Button("Start", variant="primary", min_width=80, elem_id="start")
                            pause_button = gr.Button("Pause", min_width=80, elem_id="pause")
                            resume_button = gr.Button("Resume", min_width=80, elem_id="resume")
                        with gr.Row():
                            stop_button = gr.Button("Stop", variant="stop", min_width=80, elem_id="stop")
                            reset_button = gr.Button("Reset", min_width=80, elem_id="reset")
                        baseline_button = gr.Button("Compare with baseline (N = 0)", size="sm",
                                                    elem_id="baseline")
                        with gr.Accordion("Advanced", open=False):
                            snapshot_every = gr.Number(DEFAULTS["snapshot_every"],
                                                       label="Embedding snapshot every (steps; 0 = none)")
                            eval_every = gr.Number(DEFAULTS["eval_every"],
                                                   label="Recall@1 evaluation every (epochs; 0 = at the end)")
                            schedule = gr.Radio(SCHEDULE_CHOICES, value=DEFAULTS["memvir_schedule"],
                                                label="Virtual-class schedule (applies at Start)")
                            val_classes = gr.Number(DEFAULTS["val_classes"],
                                                    label="Validation classes held out of training (0 = none)",
                                                    info="Scored as validation R@1 (dashed) beside the test "
                                                         "classes: choose N and M on these, not on the test classes.")
                            store_dtype = gr.Radio(STORE_DTYPE_CHOICES, value=DEFAULTS["memvir_store_dtype"],
                                                   label="MemVir memory precision (applies at Start)")
                        with gr.Accordion("Push the run to the Hugging Face Hub", open=False):
                            repo_id = gr.Textbox(label="Repo id", placeholder="your-name/memvir-glyphs")
                            push_button = gr.Button("Push to Hub", interactive=False, size="sm")
                            push_note = gr.Markdown("", elem_classes="small-note")
                    with gr.Column(scale=3):
                        status = gr.Markdown(live_view.status_markdown(None, ""), elem_id="run-status")
                        notice = gr.Markdown("", elem_id="notice")
                        curves_plot = gr.Plot(label="Loss and Recall@1", show_label=False, elem_id="curves-plot")
                        with gr.Row():
                            classes_plot = gr.Plot(label="Classes in use s(i)", show_label=False,
                                                   elem_id="classes-plot")
                            cosine_plot = gr.Plot(label="Mean cos(x, W_y)", show_label=False, elem_id="cosine-plot")
                        with gr.Group():
                            embedding_plot = gr.Plot(label="Embedding snapshot", show_label=False,
                                                     elem_id="embedding-plot")
                            with gr.Row():
                                color_by = gr.Radio([("age", "age"), ("class", "class")], value="age",
                                                    label="Colour by", scale=1)
                                follow = gr.Checkbox(True, label="Follow the latest snapshot", scale=1)
                                snapshot_step = gr.Slider(0, 1, value=1, step=1, label="Scrub snapshots (step)",
                                                          scale=3)
                            snapshot_caption = gr.Markdown("No snapshot yet.", elem_id="snapshot-caption",
                                                           elem_classes="small-note", padding=True)
            with gr.Tab("Retrieve", id="retrieve") as retrieve_tab:
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=320):
                        checkpoint = gr.Dropdown(choices, value=choices[0][1] if choices else None,
                                                 allow_custom_value=True, label="Checkpoint",
                                                 info="Bundled, a run of this app, or type a Hub repo id "
                                                      "(owner/name).", elem_id="checkpoint")
                        source = gr.Radio(GALLERY_SOURCES, value=TEST_SPLIT, label="Gallery to search")
                        gallery_files = gr.File(label="Gallery upload: images, or one zip of class folders",
                                                file_count="multiple", elem_id="gallery-files")
                        load_button = gr.Button("Load checkpoint and gallery", variant="secondary",
                                                elem_id="load")
                        k = gr.Slider(1, 30, value=8, step=1, label="Results (k)")
                        query_class = gr.Textbox("", label="Query's class (optional)",
                                                 placeholder="e.g. Ж, to mark hits same/different")
                    with gr.Column(scale=2):
                        about = gr.Markdown("Choose a checkpoint and press **Load**, or search straight away.",
                                            elem_id="retrieval-summary")
                        with gr.Tabs():
                            with gr.Tab("Upload a query"):
                                query_file = gr.File(label="Query image (PNG, JPEG, BMP, WebP or GIF)",
                                                     file_count="single", elem_id="query-file")
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
                                sample_gallery = gr.Gallery(label="Click an image to search with it", columns=8,
                                                            height=300, allow_preview=False, elem_id="sample")
                        with gr.Row():
                            seen_query = gr.Image(label="Model input", height=160, width=160,
                                                  interactive=False, scale=1)
                            result_gallery = gr.Gallery(label="Nearest gallery images", columns=5, height=420,
                                                        scale=4, elem_id="results")

        # -------------------------------------------------------------------------------------- wiring
        train_settings = [dataset, backbone, loss, batch_size, epochs, lr, seed, memvir_n, memvir_m, warmup,
                          snapshot_every, eval_every, folder_path, zip_file, schedule, val_classes, store_dtype]
        app.load(on_load, [visitor], [visitor, tab, push_button, push_note, checkpoint], api_name="load")
        timer = gr.Timer(POLL_SECONDS)
        timer.tick(poll, [tab, color_by, follow, visitor],
                   [tab, status, curves_plot, classes_plot, cosine_plot, embedding_plot, snapshot_caption,
                    snapshot_step], api_name="poll", show_progress="hidden", concurrency_limit=None)
        dataset.change(dataset_inputs, [dataset], [folder_path, zip_file], api_name="dataset_choice",
                       show_progress="hidden")
        start_button.click(start, [tab, *train_settings, visitor], [tab, notice], api_name="start")
        stop_button.click(stop, [tab, visitor], [notice], api_name="stop")
        pause_button.click(pause, [tab, visitor], [notice], api_name="pause")
        resume_button.click(resume, [tab, visitor], [notice], api_name="resume")
        baseline_button.click(compare, [tab, visitor], [notice], api_name="compare_baseline")
        reset_button.click(reset, [tab, visitor], [tab, notice, memvir_n, memvir_m, warmup, batch_size, epochs, lr,
                                                   seed, schedule, val_classes, store_dtype], api_name="reset")
        for slider, name in ((memvir_n, "update_n"), (memvir_m, "update_m"), (warmup, "update_warmup")):
            slider.release(update_memvir, [tab, memvir_n, memvir_m, warmup, visitor], [notice], api_name=name,
                           show_progress="hidden")
        push_button.click(push_to_hub, [tab, repo_id, visitor], [push_note], api_name="push_to_hub")
        snapshot_step.release(show_snapshot, [tab, snapshot_step, color_by],
                              [tab, embedding_plot, snapshot_caption, follow], api_name="show_snapshot",
                              show_progress="hidden")
        color_by.change(recolor, [tab, follow, color_by], [embedding_plot, snapshot_caption],
                        api_name="color_snapshot", show_progress="hidden")
        follow.input(recolor, [tab, follow, color_by], [embedding_plot, snapshot_caption], api_name="follow_snapshots",
                     show_progress="hidden")

        retrieve_tab.select(checkpoint_list, None, [checkpoint], api_name="list_checkpoints",
                            show_progress="hidden")
        load_button.click(prepare, [checkpoint, source, gallery_files], [about, sample_gallery, picked],
                          api_name="prepare_retrieval")
        search_outputs = [about, result_gallery, seen_query]
        search_upload_button.click(search_upload, [checkpoint, source, k, query_class, query_file, gallery_files],
                                   search_outputs, api_name="search_upload")
        search_drawing_button.click(search_drawing, [checkpoint, source, k, query_class, sketch, gallery_files],
                                    search_outputs, api_name="search_drawing")
        sample_gallery.select(search_gallery_item, [checkpoint, source, k, picked, gallery_files], search_outputs,
                              api_name="search_gallery_item")
    app.run_manager = runs  # for app.py's shutdown and for tests
    app.figure_builder = figure_builder
    app.retrieval_service = retrieval
    return app
