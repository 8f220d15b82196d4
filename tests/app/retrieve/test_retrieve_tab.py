"""The Retrieve tab as a visitor meets it, from its handlers and the page built around them: result captions in full
(rank, class, similarity, same/other-class mark, escaped), a refused query clears the old results, the tab starts on
the bundled MemVir checkpoint with a query-class example the gallery has, the sketchpad's blank sheet, the progress
of a gallery index being built, and a checkpoint downloaded as a zip, also when the app's data folder lies outside
the working and temporary folders. Nothing is timed."""

import base64
import html
import io
import re
import shutil
import socket
import tempfile
import zipfile
from pathlib import Path

import gradio as gr
import pytest
import torch
from gradio_client import Client
from PIL import Image

from demo.common.settings import AppSettings
from demo.page import build_app
from demo.retrieve import tab as retrieve_tab
from demo.retrieve.service import RetrievalError, RetrievalService
from demo.retrieve.tiles import Tile, caption, tiles_html
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel

CHECKPOINTS = Path(__file__).resolve().parents[3] / "checkpoints"
BUNDLED_MEMVIR = CHECKPOINTS / "glyphs-norm-softmax-memvir"


def _captions(tiles: str) -> list[str]:
    return [html.unescape(text) for text in re.findall(r'<img [^>]*alt="([^"]*)"', tiles)]


def _service(root: Path, checkpoints: Path | None = None) -> RetrievalService:
    return RetrievalService(AppSettings(data_dir=root / "data", checkpoints_dir=checkpoints or root / "checkpoints",
                                        umap=False))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A service with one untrained glyphs-mini checkpoint, and that checkpoint's folder."""
    root = tmp_path_factory.mktemp("retrieve-tab")
    torch.manual_seed(0)
    EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                   dataset="glyphs-mini").save_pretrained(root / "checkpoints" / "tiny")
    return _service(root), str(root / "checkpoints" / "tiny")


def _query(tmp_path, index=40) -> tuple[Path, str]:
    split = load_dataset("glyphs-mini").test
    path = tmp_path / "query.png"
    split.image(index).save(path)
    return path, split.class_names[split.labels[index]]


# ---------------------------------------------------------------------------------------------- result tiles
def test_every_caption_names_rank_class_similarity_and_mark_in_full(tiny, tmp_path):
    service, checkpoint = tiny
    query, class_name = _query(tmp_path)
    handlers = retrieve_tab.RetrieveHandlers(service)
    _, tiles, _ = handlers.search_upload(checkpoint, "test split", 6, class_name.split(" ")[0], str(query))
    captions = _captions(tiles)
    assert len(captions) == 6 and captions[0] == f"#1 1.000 {class_name} same class"
    assert all(re.fullmatch(r"#[1-6] -?\d\.\d{3} \S+ U\+[0-9A-F]{4,6} (same|other) class", text) for text in captions)
    # The mark is a word in a badge the CSS draws; the tile says the same in its class for the border colour.
    assert tiles.count('class="hit-mark same">same class<') == tiles.count('class="result-tile same"') >= 1
    assert "✅" not in tiles and "❌" not in tiles

    _, unmarked, _ = handlers.search_upload(checkpoint, "test split", 2, "", str(query))
    assert _captions(unmarked)[0] == f"#1 1.000 {class_name}" and "hit-mark" not in unmarked


def test_tiles_escape_class_names_and_carry_their_images():
    glyph = Image.new("L", (96, 96), 255)
    photo = Image.new("RGB", (96, 64), (200, 30, 30))
    tiles = tiles_html([Tile(glyph, 1, 0.91234, '<img src=x onerror="alert(1)">', False),
                        Tile(photo, 2, -0.5, None, None)])
    assert "<img src=x" not in tiles and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in tiles
    assert _captions(tiles) == ['#1 0.912 <img src=x onerror="alert(1)"> other class', "#2 -0.500"]
    sources = re.findall(r'src="data:image/(png|jpeg);base64,([^"]+)"', tiles)
    assert [kind for kind, _ in sources] == ["png", "jpeg"]  # crisp glyphs, small photos
    decoded = [Image.open(io.BytesIO(base64.b64decode(data))) for _, data in sources]
    assert [image.size for image in decoded] == [(96, 96), (96, 64)]
    assert caption(Tile(glyph, 3, 0.5, "cats", True)) == "#3 0.500 cats same class"
    assert tiles_html([]) == ""


# ---------------------------------------------------------------------------------------------- refusals
def test_a_refused_query_clears_the_previous_results(tiny, tmp_path):
    service, checkpoint = tiny
    query, class_name = _query(tmp_path)
    handlers = retrieve_tab.RetrieveHandlers(service)
    _, tiles, seen = handlers.search_upload(checkpoint, "test split", 3, "", str(query))
    assert len(_captions(tiles)) == 3 and seen is not None
    with pytest.warns(UserWarning):
        about, tiles, seen = handlers.search_upload(checkpoint, "test split", 3, "Ж", str(query))
    assert about.startswith("⚠️ the gallery has no class 'Ж'") and (tiles, seen) == ("", None)
    with pytest.warns(UserWarning):
        assert handlers.search_drawing(checkpoint, "test split", 3, "", None)[1:] == ("", None)
    with pytest.warns(UserWarning):
        about, sample, picked = handlers.prepare("not a repo id!", "test split")
    assert about.startswith("⚠️ the checkpoint typed is neither") and (sample, picked) == ([], None)


def test_the_blank_sheet_the_sketchpad_starts_with_is_refused_as_an_empty_drawing(tiny, tmp_path):
    service, checkpoint = tiny
    paper = tmp_path / "paper.png"
    retrieve_tab.PAPER["background"].save(paper)
    assert retrieve_tab.PAPER["background"].size == (retrieve_tab.SKETCH_SIZE,) * 2
    # What the page sends for an untouched sheet (demo.retrieve.sketchpad passes the parts as files).
    handlers = retrieve_tab.RetrieveHandlers(service)
    with pytest.warns(UserWarning):
        about, tiles, _ = handlers.search_drawing(checkpoint, "test split", 3, "",
                                                  {"background": str(paper), "layers": [], "composite": str(paper)})
    assert about == "⚠️ the drawing is empty: draw a character on the sketchpad first" and tiles == ""


# ---------------------------------------------------------------------------------------------- what the tab offers
def _component(app, elem_id):
    return next(block for block in app.blocks.blocks.values() if getattr(block, "elem_id", None) == elem_id)


def test_the_tab_starts_on_the_bundled_memvir_checkpoint_with_an_example_class_it_has(tmp_path):
    app = build_app(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=CHECKPOINTS, umap=False))
    try:
        assert _component(app, "checkpoint").value == str(BUNDLED_MEMVIR)
        assert _component(app, "query-class").placeholder == "e.g. A"
        service = app.retrieval_service
        assert service.match_class(service.test_split_gallery(service.load_checkpoint(str(BUNDLED_MEMVIR))), "A")
    finally:
        app.close()


def test_the_query_class_example_follows_the_gallery_chosen(tiny, tmp_path):
    service, checkpoint = tiny
    handlers = retrieve_tab.RetrieveHandlers(service)
    placeholder, class_list = handlers.query_class_hint(checkpoint, "test split")
    assert placeholder == gr.update(placeholder="e.g. z")
    mini = load_dataset("glyphs-mini").test
    assert class_list == gr.update(choices=[(name, name.split(" ")[0]) for name in mini.class_names], value=None)
    archive = tmp_path / "shapes.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name in ("circles/1.png", "circles/2.png", "squares/1.png"):
            buffer = io.BytesIO()
            Image.new("RGB", (20, 20), (10, 200, 10)).save(buffer, format="PNG")
            handle.writestr(name, buffer.getvalue())
    assert retrieve_tab.query_class_example(service, checkpoint, "uploaded", [str(archive)]) == "e.g. circles"
    generic = "a class of the gallery, e.g. a folder name of your zip"
    assert retrieve_tab.query_class_example(service, checkpoint, "uploaded", []) == generic  # no upload yet
    assert retrieve_tab.query_class_example(service, "not a repo id!", "test split") == generic


# ---------------------------------------------------------------------------------------------- index progress
class _Builds:
    """A stand-in for RetrievalService's index progress: answers from a script, records background builds."""

    def __init__(self, answers, builder_alive=True):
        self.answers = list(answers)
        self.started = []
        self.builder_alive = builder_alive

    def indexing_progress(self, choice):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def index_in_background(self, choice):
        self.started.append(choice)
        return type("Thread", (), {"is_alive": lambda _: self.builder_alive})()


class _Bar:
    def __init__(self):
        self.shown = []

    def __call__(self, fraction, desc=None):
        self.shown.append((fraction, desc))


@pytest.mark.parametrize(("answers", "builder_alive", "started", "shown"), [
    ([1.0], True, [], []),  # ready: no bar
    ([0.25, 0.5, 1.0], True, [], [0.25, 0.5]),  # a run's background build in flight: followed, not restarted
    ([None, None, 0.5, 1.0], True, ["run"], [0.0, 0.0, 0.5]),  # none yet: started where its progress shows
    ([0.3, RetrievalError("indexing failed: disk full")], True, [], [0.3]),  # failed: the search builds again
    ([None], False, ["run"], []),  # the build stopped before it began: the search's own build says why
])
def test_a_search_shows_how_far_the_gallery_index_has_got(monkeypatch, answers, builder_alive, started, shown):
    monkeypatch.setattr(retrieve_tab, "INDEX_POLL_S", 0)
    builds, bar = _Builds(answers, builder_alive), _Bar()
    retrieve_tab.follow_indexing(builds, "run", bar)
    assert builds.started == started and [fraction for fraction, _ in bar.shown] == shown
    assert all(desc == "Indexing the gallery (once per checkpoint)" for _, desc in bar.shown)
    assert builds.answers == []


def test_a_runs_first_search_builds_its_index_in_the_background_and_finds(tmp_path):
    run = tmp_path / "data" / "runs" / "20260101-run"
    torch.manual_seed(1)
    EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                   dataset="glyphs-mini").save_pretrained(run)
    service = _service(tmp_path)
    assert service.indexing_progress(str(run)) is None
    query, class_name = _query(tmp_path)
    bar = _Bar()
    handlers = retrieve_tab.RetrieveHandlers(service)
    _, tiles, _ = handlers.search_upload(str(run), "test split", 3, class_name, str(query), progress=bar)
    assert _captions(tiles)[0] == f"#1 1.000 {class_name} same class"
    assert service.indexing_progress(str(run)) == 1.0 and (run / "gallery").is_dir()  # kept beside the run


# ---------------------------------------------------------------------------------------------- download
def test_a_checkpoint_downloads_as_a_zip_and_a_refusal_hides_the_old_one(tiny, tmp_path):
    service, checkpoint = tiny
    handlers = retrieve_tab.RetrieveHandlers(service)
    note, offered = handlers.download_checkpoint(checkpoint)
    assert note.startswith("`tiny.zip`: unzip it") and Path(offered).name == "tiny.zip"
    with zipfile.ZipFile(offered) as archive:
        archive.extractall(tmp_path / "unzipped")
    assert EmbeddingModel.from_pretrained(tmp_path / "unzipped" / "tiny").config["dataset"] == "glyphs-mini"
    with pytest.warns(UserWarning):
        note, offered = handlers.download_checkpoint("/etc")
    assert note.startswith("⚠️ the checkpoint typed is neither") and offered is None


def test_the_zip_is_served_when_the_data_folder_is_outside_the_working_and_temporary_folders(tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))  # the data folder below is outside it
    (tmp_path / "temp").mkdir()
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(BUNDLED_MEMVIR, checkpoints / BUNDLED_MEMVIR.name, ignore=shutil.ignore_patterns("gallery"))
    app = build_app(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=checkpoints, umap=False))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        path = client.predict(checkpoint=str(checkpoints / BUNDLED_MEMVIR.name), api_name="/checkpoint_zip")
        assert Path(path).name == f"{BUNDLED_MEMVIR.name}.zip"
        with zipfile.ZipFile(path) as archive:
            assert sorted(archive.namelist()) == [f"{BUNDLED_MEMVIR.name}/{name}"
                                                  for name in ("README.md", "config.json", "model.safetensors")]
    finally:
        app.close()


# ---------------------------------------------------------------------------------------------- issue 31, item 7
def test_the_query_class_is_typed_as_the_character_or_picked_from_the_gallery_s_classes(tiny):
    service, checkpoint = tiny
    mini = load_dataset("glyphs-mini").test
    choices = retrieve_tab.query_class_choices(service, checkpoint, "test split")
    # Every class of the gallery, labelled in full, its value the character a visitor types.
    assert choices == [(name, name.split(" ")[0]) for name in mini.class_names] and len(choices) == 24
    gallery = service.test_split_gallery(service.load_checkpoint(checkpoint))
    for label, value in choices:
        assert service.match_class(gallery, value) == service.match_class(gallery, label) == label
    name = mini.class_names[3]
    assert service.match_class(gallery, name.split(" ")[1].lower()) == name  # its code point, e.g. u+0416
    assert retrieve_tab.picked_class(choices[3][1]) == choices[3][1]
    assert retrieve_tab.picked_class(None) == gr.skip()
    assert retrieve_tab.query_class_choices(service, "not a repo id!", "test split") == []


def test_a_class_the_gallery_lacks_is_refused_with_where_its_classes_are_listed(tiny, tmp_path):
    service, checkpoint = tiny
    gallery = service.test_split_gallery(service.load_checkpoint(checkpoint))
    with pytest.raises(RetrievalError) as refused:
        service.match_class(gallery, "R")  # a class of the training split, not of this gallery
    message = str(refused.value)
    assert message == ("the gallery has no class 'R': the glyphs-mini test split holds 24 classes, listed under "
                       "\u201cor pick one of the gallery's classes\u201d (e.g. z); pick one there, or leave the "
                       "query's class empty")
    assert "U+" not in message  # the example is what a visitor types, not the class's full name


def test_an_unreachable_hub_is_said_in_the_visitor_s_words_in_one_toast(tiny):
    service, _ = tiny
    handlers = retrieve_tab.RetrieveHandlers(service)
    with pytest.warns(UserWarning) as toasts:
        about, sample, picked = handlers.prepare("someone/some-model", "test split")
    assert [str(toast.message) for toast in toasts] == [
        "'someone/some-model' is not on this server and the Hub cannot be reached from this server; pick a "
        "bundled checkpoint (or one of this app's runs)"]
    assert about == f"⚠️ {toasts[0].message}" and (sample, picked) == ([], None)
    for operator_words in ("HF_HUB_OFFLINE", "cache", "/"):
        assert operator_words not in str(toasts[0].message).replace("someone/some-model", "")


def test_pick_opened_before_load_shows_the_chosen_gallerys_sample_and_leaves_a_shown_one_alone(tiny):
    service, checkpoint = tiny
    handlers = retrieve_tab.RetrieveHandlers(service)
    about, tiles, picked = handlers.sample_unless_shown(checkpoint, "test split", None, None)
    loaded = handlers.prepare(checkpoint, "test split")
    assert picked == loaded[2] and about == loaded[0]  # what Load gives: the same sample of the same gallery
    assert [caption for _, caption in tiles] == [caption for _, caption in loaded[1]] and len(tiles) > 0
    assert handlers.sample_unless_shown(checkpoint, "test split", None, picked) == (gr.skip(),) * 3


def test_pick_images_are_captioned_as_typed_and_shown_whole(tiny, tmp_path):
    service, checkpoint = tiny
    handlers = retrieve_tab.RetrieveHandlers(service)
    _, tiles, picked = handlers.prepare(checkpoint, "test split")
    mini = load_dataset("glyphs-mini").test
    assert [caption for _, caption in tiles] == [mini.class_names[mini.labels[item]].split(" ")[0]
                                                 for item in picked["sample"]]
    app = build_app(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=CHECKPOINTS, umap=False))
    try:
        assert _component(app, "sample").object_fit == "contain"  # not cropped to the square tile
        # The gallery's drop zone only once uploads are chosen (on a phone it would come before the query's).
        assert _component(app, "gallery-files").visible is False
        assert retrieve_tab.gallery_upload_shown("uploaded") == gr.update(visible=True)
        assert retrieve_tab.gallery_upload_shown("test split") == gr.update(visible=False)
        class_list = _component(app, "query-class-list")
        assert len(class_list.choices) == len(load_dataset("glyphs").test.class_names)
    finally:
        app.close()
