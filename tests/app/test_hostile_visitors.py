"""The app under attack (issue 12): each case an outside attack run reproduced against the live app, sent here the same
way, with real files, against a real server in-process on a free port (a fresh `python app.py`'s first request is in
tests/app/test_space.py). Every refusal must end in a clear message with nothing lost; memory growth, files on disk
and messages are measured, not assumed."""

import contextlib
import io
import os
import struct
import time
import zipfile
import zlib
from pathlib import Path

import httpx
import pytest
from browser_calls import BrowserSession
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from served_app import free_port, page_status, poll_status_until, step_of

DEADLINE_S = 90.0


# ---------------------------------------------------------------------------------------------- a server in-process
@contextlib.contextmanager
def _serving(settings):
    from demo.page import build_app

    app = build_app(settings)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
               max_file_size=settings.max_zip_bytes)
    try:
        yield Client(f"http://127.0.0.1:{port}/", verbose=False), app
    finally:
        app.close()


def _settings(tmp_path, checkpoints, **limits):
    from demo.common.settings import AppSettings

    return AppSettings(data_dir=tmp_path / "data", checkpoints_dir=checkpoints, umap=False, **limits)


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory):
    settings = _settings(tmp_path_factory.mktemp("app"), tiny_checkpoints)
    with _serving(settings) as (client, app):
        yield {"client": client, "app": app, "settings": settings,
               "checkpoint": str(tiny_checkpoints / "glyphs-mini-tiny")}


def _refusal(client: Client, **arguments) -> str:
    """The reason a client API call is refused (its AppError's message); AssertionError when it is answered."""
    with pytest.raises(AppError) as refused:
        client.predict(**arguments)
    return str(refused.value)


# ---------------------------------------------------------------------------------------------- image limits
def _huge_png(path: Path, width: int, height: int) -> Path:
    """A valid PNG declaring width x height black pixels at 1 bit each: a few kB on disk, written row by row so
    the test never holds the canvas."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    row = b"\0" * (1 + (width + 7) // 8)  # filter byte, then the packed bits
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grayscale
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


class _PeakMemory:
    """This process's peak resident memory since `reset()` (the in-process server runs in its threads), read from
    /proc: VmHWM, which the kernel resets when "5" is written to clear_refs."""

    def __init__(self):
        self.start = 0

    @staticmethod
    def _status_kb(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"/proc/self/status has no {field}")

    def reset(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")
        self.start = self._status_kb("VmRSS")

    def growth_mb(self) -> float:
        return (self._status_kb("VmHWM") - self.start) / 1024


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    """12000 x 12000 pixels (144 megapixels; the app accepts 40) in a PNG of a few kB."""
    path = _huge_png(tmp_path_factory.mktemp("bomb") / "bomb.png", 12_000, 12_000)
    assert path.stat().st_size < 64_000
    return path


REFUSED_CANVAS = "is 12000x12000 pixels; images up to 40 megapixels are accepted"
MEMORY_SLACK_MB = 64  # decoding the canvas takes 138 MB even as 1-bit pixels, 576 MB more as RGBA


def _zip_of(path: Path, entries: dict) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, source in entries.items():
            archive.write(source, name) if isinstance(source, Path) else archive.writestr(name, source)
    return path


def _png_bytes(size=(8, 8), color=255) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def _class_zip(path: Path, classes: int, per_class: int, extra: dict | None = None, shade: int = 0) -> Path:
    entries = {f"class{c:03d}/{i}.png": _png_bytes(color=(c * 7 + shade) % 256)
               for c in range(classes) for i in range(per_class)}
    return _zip_of(path, {**entries, **(extra or {})})


def _uploaded(server, image: Path) -> dict:
    """`image` uploaded as the page uploads a file, named as an event names it."""
    answer = httpx.post(server["client"].src + "gradio_api/upload",
                        files={"files": (image.name, image.read_bytes(), "image/png")}, timeout=60)
    answer.raise_for_status()
    return {"path": answer.json()[0], "orig_name": image.name, "meta": {"_type": "gradio.FileData"}}


def _search_drawing(server, sketch: dict) -> str:
    """The Retrieve tab's search of a drawing, sent to the page's own (private) event as the page's script sends it;
    the answer's first line (the client API has no sketch: /search takes an image file)."""
    answer = BrowserSession(server["client"].src).call(
        "search_drawing", [server["checkpoint"], "test split", 3, "", sketch, None, ""])
    assert answer.error is None, answer
    return answer.data[0]


def test_a_huge_canvas_as_the_sketch_is_refused_before_decoding(server, bomb):
    """Before, the sketch path skipped the 40-megapixel limit: a 31 kB 12000 x 12000 PNG raised memory by 2.8 GB."""
    sketch = {"background": None, "layers": [], "composite": _uploaded(server, bomb), "id": None}
    peak = _PeakMemory()
    peak.reset()
    about = _search_drawing(server, sketch)
    assert about.startswith("⚠️ the drawing ") and REFUSED_CANVAS in about
    assert peak.growth_mb() < MEMORY_SLACK_MB


def test_a_huge_canvas_as_a_sketch_layer_is_refused(server, bomb, glyph_query):
    about = _search_drawing(server, {"background": None, "layers": [_uploaded(server, bomb)],
                                     "composite": _uploaded(server, glyph_query), "id": None})
    assert about.startswith("⚠️ layer 1 of the drawing ") and REFUSED_CANVAS in about


@pytest.mark.parametrize("path", ["query", "gallery image", "gallery zip", "training zip"])
def test_a_huge_canvas_is_refused_on_every_other_image_path(server, bomb, glyph_query, tmp_path, path):
    client, uploads = server["client"], server["settings"].uploads_dir
    peak = _PeakMemory()
    peak.reset()
    if path == "query":
        message = _refusal(client, checkpoint=server["checkpoint"], k=3, query_image=handle_file(bomb),
                           api_name="/search")
    elif path == "gallery image":
        message = _refusal(client, checkpoint=server["checkpoint"],
                           gallery_files=[handle_file(glyph_query), handle_file(bomb)], api_name="/gallery")
    elif path == "gallery zip":
        archive = _class_zip(tmp_path / "gallery.zip", 2, 2, {"class000/bomb.png": bomb})
        message = _refusal(client, checkpoint=server["checkpoint"], gallery_files=[handle_file(archive)],
                           api_name="/gallery")
    else:
        archive = _class_zip(tmp_path / "train.zip", 4, 3, {"class002/bomb.png": bomb})
        message = _refusal(client, dataset="zip", zip_file=handle_file(archive), batch_size=4, epochs=1,
                           api_name="/start_run")
    assert "bomb.png " + REFUSED_CANVAS in message, message
    assert peak.growth_mb() < MEMORY_SLACK_MB
    assert not any(uploads.glob("zip-*")), "a refused zip left its files behind"


def test_a_huge_layer_uploaded_by_the_browser_editor_is_refused(bomb, glyph_query):
    """The browser's editor sends its parts as blobs (ImageEditor.accept_blobs) and the event only their id."""
    import gradio as gr
    from gradio.components.image_editor import EditorData, EditorDataBlobs

    from demo.common.shims import pass_undecoded
    from demo.common.uploads import UploadError, load_sketch

    sketch = pass_undecoded(gr.Sketchpad())
    sketch.blob_storage["drawing-1"] = EditorDataBlobs(background=None, layers=[bomb.read_bytes()],
                                                       composite=glyph_query.read_bytes())
    value = sketch.preprocess(EditorData(id="drawing-1"))
    assert "drawing-1" not in sketch.blob_storage
    with pytest.raises(UploadError, match="layer 1 of the drawing " + REFUSED_CANVAS):
        load_sketch(value, max_bytes=20 * 1024**2, max_pixels=40_000_000)
    sketch.blob_storage["drawing-2"] = EditorDataBlobs(background=None, layers=[], composite=glyph_query.read_bytes())
    drawn = load_sketch(sketch.preprocess(EditorData(id="drawing-2")), max_bytes=20 * 1024**2, max_pixels=40_000_000)
    assert drawn.size == (32, 32)


# ---------------------------------------------------------------------------------------------- zips
def _files_under(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()] if folder.exists() else []


def test_a_zip_of_too_many_files_is_refused_before_anything_is_written(server, tmp_path):
    """Before, a zip of 10,000 tiny files was unpacked in full (10,012 files) before the 2,000-image limit refused
    it, and the files stayed."""
    archive = _zip_of(tmp_path / "many.zip", {f"class{i % 10}/{i}.png": b"x" for i in range(10_000)})
    about = _refusal(server["client"], checkpoint=server["checkpoint"], gallery_files=[handle_file(archive)],
                     api_name="/gallery")
    assert about == "many.zip holds 10,000 files; zips of at most 2,000 images are accepted"
    assert _files_under(server["settings"].uploads_dir) == []


@pytest.mark.parametrize("batch_size", [2, 128])
def test_a_training_zip_of_single_images_is_refused_at_start_whatever_the_batch(server, tmp_path, batch_size):
    """Before, 4 classes of 1 image at batch 2 started, trained and ended Failed at its evaluation ('no class has at
    least two members ... it had saved no checkpoint yet'); at batch 128 Start refused it for the batch size."""
    archive = _class_zip(tmp_path / "singles.zip", 4, 1)
    message = _refusal(server["client"], dataset="zip", zip_file=handle_file(archive), batch_size=batch_size,
                       epochs=1, api_name="/start_run")
    assert message.startswith("singles.zip: the test split ") and (
        "has no class with two or more images (its 2 classes have one each)") in message, message
    assert str(server["settings"].data_dir) not in message  # the zip as the visitor knows it, not the server's folder
    assert not any(server["settings"].uploads_dir.glob("zip-*")), "a refused zip left its files behind"


def test_a_refused_start_keeps_a_zip_that_a_training_run_uses(tiny_checkpoints, tmp_path):
    """A refused Start discards the zip it unpacked, except when a run trains on the same content (an upload is
    unpacked once per content): a second visitor's Start of it, refused for the busy slot, must not pull the files
    from under the first visitor's run."""
    archive = _class_zip(tmp_path / "classes.zip", 4, 3)
    settings = _settings(tmp_path, tiny_checkpoints)
    with _serving(settings) as (client, app):
        started = client.predict(dataset="zip", zip_file=handle_file(archive), batch_size=4, epochs=10_000,
                                 snapshot_every=0, api_name="/start_run")
        assert started["run_id"] and started["yours"] is True, started
        (folder,) = [path for path in settings.uploads_dir.glob("zip-*") if path.is_dir()]
        other = Client(client.src, verbose=False)  # another visitor's session
        refused = _refusal(other, dataset="zip", zip_file=handle_file(archive), batch_size=4, epochs=1,
                           api_name="/start_run")
        assert "another visitor's run is training" in refused, refused
        assert folder.is_dir() and app.run_manager.runs()[0].training
        client.predict(api_name="/stop_run")


def test_a_zip_gallery_is_unpacked_once_however_often_it_is_used(server, tmp_path, glyph_query):
    """Before, every load or search unpacked the zip again into a new uploads/zip-* folder (3 loads, 3 copies)."""
    client, uploads = server["client"], server["settings"].uploads_dir
    archive = _class_zip(tmp_path / "gallery.zip", 3, 2)
    for _ in range(3):
        loaded = client.predict(checkpoint=server["checkpoint"], gallery_files=[handle_file(archive)],
                                api_name="/gallery")
        assert "gallery.zip (6 images in 3 classes)" in loaded["gallery"]
    found = client.predict(checkpoint=server["checkpoint"], k=2, query_image=handle_file(glyph_query),
                           gallery_files=[handle_file(archive)], api_name="/search")
    assert len(found["hits"]) == 2
    assert len([folder for folder in uploads.glob("zip-*") if folder.is_dir()]) == 1
    assert len([path for path in _files_under(uploads) if path.suffix == ".png"]) == 6


def test_the_uploads_folder_keeps_within_its_size_and_age(tiny_checkpoints, tmp_path):
    zips = [_class_zip(tmp_path / f"gallery-{n}.zip", 2, 2, shade=n + 1) for n in range(4)]  # 4 images each
    image_bytes = len(_png_bytes())
    settings = _settings(tmp_path, tiny_checkpoints, max_uploads_bytes=14 * image_bytes, max_upload_age_s=3600)
    uploads = settings.uploads_dir
    copies = {}

    def load(n: int) -> set[int]:
        """Load zip n as the gallery; which zips have a copy on disk afterwards."""
        client.predict(checkpoint=str(tiny_checkpoints / "glyphs-mini-tiny"), gallery_files=[handle_file(zips[n])],
                       api_name="/gallery")  # an AppError were it refused
        on_disk = {path.name for path in uploads.glob("zip-*") if path.is_dir()}
        assert {path.stem for path in uploads.glob("zip-*.json")} == on_disk, "a copy and its record go together"
        if n not in copies:
            (copies[n],) = on_disk - set(copies.values())
        return {m for m, name in copies.items() if name in on_disk}

    with _serving(settings) as (client, _):
        assert load(0) == {0} and load(1) == {0, 1} and load(0) == {0, 1}  # 0 used again: 1 is now the oldest
        assert load(2) == {0, 1, 2}  # 12 images' bytes: within the bound of 14
        assert load(3) == {0, 2, 3}, "past the size bound the least recently used copy goes (not the first made)"
        long_ago = time.time() - 7200
        os.utime(uploads / f"{copies[0]}.json", (long_ago, long_ago))
        assert load(2) == {2, 3}, "a copy unused for longer than the age bound goes, though the size is within"


def test_pruning_spares_the_dataset_of_a_training_run(tmp_path):
    from demo.common import upload_store
    from demo.common.uploads import unpack_class_zip

    uploads = tmp_path / "uploads"
    roots = [unpack_class_zip(_class_zip(tmp_path / f"{n}.zip", 2, 2 + n), uploads, 10**6, 10**6) for n in range(3)]
    deleted = upload_store.prune(uploads, max_bytes=0, max_age_s=3600, in_use=[roots[0] / "class000"])
    assert sorted(deleted) == sorted(roots[1:])
    assert roots[0].is_dir() and [path.parent for path in uploads.glob("zip-*.json")] == [uploads]


# ---------------------------------------------------------------------------------------------- MemVir's memory
def _ring_mb(num_steps, margin, dtype="float32") -> float:
    """MemVir's full memory on glyphs-mini (24 training classes, 128-d, batch 32), computed by the library."""
    import torch

    from memvir.memory.size import ring_bytes

    return ring_bytes(num_steps, margin, 32, 24, 128, getattr(torch, dtype)) / 1e6


def test_memory_past_the_budget_is_refused_at_start(tiny_checkpoints, tmp_path):
    """Before, N = 50, M = 200, warm-up 0 started whatever the memory (5.9 GB on the default dataset)."""
    assert _ring_mb(50, 200) > 250 and _ring_mb(50, 200, "float16") < 150  # 290.7 MB and 146.7 MB
    settings = _settings(tmp_path, tiny_checkpoints, memory_budget=200_000_000)
    settings_kw = dict(dataset="glyphs-mini", batch_size=32, epochs=50, memvir_n=50, memvir_m=200, warmup_epochs=0,
                       api_name="/start_run")
    with _serving(settings) as (client, app):
        notice = _refusal(client, **settings_kw)
        # the library's refusal (its limit is the budget the run's process took), and where that limit came from
        assert notice == (
            "MemVir: N=50, M=200 keep N(M+1) = 10,050 past steps: 277.3 MiB (290,726,400 bytes) at batch 32, "
            "24 classes, dimension 128, float32, over the memory limit of 190.7 MiB (200,000,000 bytes). Lower N or "
            "M, store the memory in float16/bfloat16 (139.9 MiB), or raise the limit (max_memory_bytes=..., or the "
            "MEMVIR_MAX_MEMORY_BYTES environment variable, in bytes). Here the limit is the run's memory budget, "
            "set by MEMVIR_MEMORY_BUDGET.")
        assert app.run_manager.runs() == [] and not settings.runs_dir.exists(), "a refused start leaves nothing"
        started = client.predict(**settings_kw, memvir_store_dtype="float16")
        assert started["run_id"] and started["yours"] is True, started
        client.predict(api_name="/stop_run")
        poll_status_until(client, lambda status: status.startswith("**Stopped**"), "the run stopped", DEADLINE_S)


def test_without_the_float16_way_out_the_message_offers_none(tiny_checkpoints, tmp_path):
    settings = _settings(tmp_path, tiny_checkpoints, memory_budget=100_000_000)
    with _serving(settings) as (client, _):
        notice = _refusal(client, dataset="glyphs-mini", batch_size=32, memvir_n=50, memvir_m=200, warmup_epochs=0,
                          api_name="/start_run")
    assert notice.startswith("MemVir: N=50, M=200 keep N(M+1) = 10,050 past steps: 277.3 MiB")
    assert ("over the memory limit of 95.4 MiB (100,000,000 bytes). Lower N or M, or raise the limit" in notice
            and "float16/" not in notice and notice.endswith("the run's memory budget, set by MEMVIR_MEMORY_BUDGET."))


@pytest.mark.slow
def test_a_live_change_past_the_budget_leaves_the_run_training(tiny_checkpoints, tmp_path):
    """Before, moving N from 10 to 50 on a running run past the machine's memory turned it to Failed, with no
    checkpoint: its progress was lost."""
    assert _ring_mb(20, 2) < 3 < _ring_mb(50, 2)  # 1.7 MB < 3 MB < 4.3 MB
    settings = _settings(tmp_path, tiny_checkpoints, memory_budget=3_000_000)
    with _serving(settings) as (client, app):
        started = client.predict(dataset="glyphs-mini", batch_size=32, epochs=500, memvir_n=10, memvir_m=2,
                                 warmup_epochs=0, snapshot_every=0, api_name="/start_run")
        assert started["run_id"] and started["yours"] is True, started
        before = poll_status_until(client, lambda status: status.startswith("**Training**") and "virtual sets 10 of 10"
                                   in status, "all 10 virtual sets in use", DEADLINE_S)
        notice = _refusal(client, setting="memvir_n", value=50, api_name="/update_run")
        assert notice == (
            "MemVir: N=50, M=2 keep N(M+1) = 150 past steps: 4.1 MiB (4,339,200 bytes) at batch 32, 24 classes, "
            "dimension 128, float32, over the memory limit of 2.9 MiB (3,000,000 bytes). Lower N or M, store the "
            "memory in float16/bfloat16 (2.1 MiB), or raise the limit (max_memory_bytes=..., or the "
            "MEMVIR_MAX_MEMORY_BYTES environment variable, in bytes). Here the limit is the run's memory budget, set "
            "by MEMVIR_MEMORY_BUDGET. The run trains on with N = 10 and M = 2.")
        later = poll_status_until(client, lambda status: step_of(status) > step_of(before) + 5, "the run training on",
                                  DEADLINE_S)
        assert later.startswith("**Training**") and "virtual sets 10 of 10" in later
        assert app.run_manager.runs()[0].live_values["memvir_n"] == 10
        # a change within the budget still applies
        assert client.predict(setting="memvir_n", value=20, api_name="/update_run")["message"].startswith("Asked")
        poll_status_until(client, lambda status: "virtual sets" in status and "of 20" in status, "N = 20 applied",
                          DEADLINE_S)
        client.predict(api_name="/stop_run")
        poll_status_until(client, lambda status: status.startswith("**Stopped**"), "the run stopped", DEADLINE_S)


def test_the_budget_comes_from_free_memory_or_the_environment(monkeypatch):
    import torch

    from demo.common.settings import AppSettings
    from demo.runs.memory_budget import memory_budget

    available = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemAvailable:"))
    budget = memory_budget(None, torch.device("cpu"))
    assert abs(budget.bytes - available / 2) < 0.1 * available and "free memory" in budget.source
    for text, expected in [("4GB", 4 * 10**9), ("3.5GiB", int(3.5 * 2**30)), ("250000000", 250_000_000)]:
        monkeypatch.setenv("MEMVIR_MEMORY_BUDGET", text)
        assert AppSettings.from_env().memory_budget == expected
        assert memory_budget(expected, torch.device("cpu")).bytes == expected
    monkeypatch.setenv("MEMVIR_MEMORY_BUDGET", "lots")
    with pytest.raises(ValueError, match="MEMVIR_MEMORY_BUDGET='lots' is not a size"):
        AppSettings.from_env()


# ---------------------------------------------------------------------------------------------- integer controls
_ZERO_OK = ("seed", "snapshot_every", "eval_every", "val_classes")
# N and M: read off their sliders by the page, judged by TrainConfig alone, in a live change's words
_MEMVIR_CONTROLS = ("memvir_n", "memvir_m")


@pytest.mark.parametrize(("control", "name"), [
    ("batch_size", "batch size"), ("epochs", "epochs"), ("seed", "seed"), ("memvir_n", "N"), ("memvir_m", "M"),
    ("snapshot_every", "snapshot every"), ("eval_every", "eval every"), ("val_classes", "validation classes"),
])
def test_a_fraction_in_an_integer_control_is_refused_not_rounded(server, control, name):
    """Before, batch size 1.5 was silently rounded to 2 (gr.Number(precision=0) rounds before the handler)."""
    notice = _refusal(server["client"], dataset="glyphs-mini", **{control: 1.5}, api_name="/start_run")
    if control in _MEMVIR_CONTROLS:
        assert notice == f"{name} must be an integer >= 0, got 1.5"  # TrainConfig's words, the page's name
    else:
        assert notice == f"{name} must be a whole number of at least {0 if control in _ZERO_OK else 1}, got 1.5"
    assert server["app"].run_manager.runs() == []


def test_a_fraction_of_results_is_refused(server, glyph_query):
    about = _refusal(server["client"], checkpoint=server["checkpoint"], k=2.5, query_image=handle_file(glyph_query),
                     api_name="/search")
    assert about == "results (k) must be a whole number of at least 1, got 2.5"


def test_a_fraction_sent_as_a_live_change_is_refused(tiny_checkpoints, tmp_path):
    with _serving(_settings(tmp_path, tiny_checkpoints)) as (client, app):
        client.predict(dataset="glyphs-mini", batch_size=32, epochs=500, memvir_n=2, memvir_m=2, snapshot_every=0,
                       api_name="/start_run")
        assert _refusal(client, setting="memvir_n", value=3.5, api_name="/update_run") == (
            "N must be an integer >= 0, got 3.5. The run trains on with N = 2 and M = 2.")
        assert app.run_manager.runs()[0].live_values["memvir_n"] == 2
        client.predict(api_name="/stop_run")


# ---------------------------------------------------------------------------------------------- server paths
def _outside_checkpoint(tmp_path) -> Path:
    """A real, loadable checkpoint in a folder the app was not told about."""
    from memvir.models.embedding_model import EmbeddingModel

    folder = tmp_path / "elsewhere" / "private-model"
    EmbeddingModel(embedding_dim=8, in_channels=1, image_size=32, mean=(0.1,), std=(0.3,),
                   dataset="glyphs-mini").save_pretrained(folder)
    return folder


def _escape_from(base: Path, target: Path) -> str:
    """`target` written as a `../..` path from `base`."""
    return os.path.relpath(target, base)


def test_a_checkpoint_path_outside_the_allowed_places_is_refused_alike(server, tmp_path):
    """Before, any folder of the server loaded as a checkpoint by typing its path, and '../../etc'-style paths told
    whether a folder existed."""
    settings = server["settings"]
    private = _outside_checkpoint(tmp_path)
    refused = [str(private), "/etc", "/no/such/folder", _escape_from(Path.cwd(), Path("/etc")),
               _escape_from(Path.cwd(), Path("/no/such/folder")),
               str(settings.checkpoints_dir / ".." / private.relative_to(tmp_path.parent.parent)),
               str(settings.runs_dir / ".." / ".." / "gradio"), "not a repo id!"]
    messages = {choice: _refusal(server["client"], checkpoint=choice, api_name="/gallery") for choice in refused}
    assert set(messages.values()) == {
        "the checkpoint typed is neither an existing folder nor a Hub repo id this app may load: choose a bundled "
        "checkpoint or a run of this app from the list, or type a Hub repo id such as owner/name"}, messages
    # what the app offers still loads
    loaded = server["client"].predict(checkpoint=server["checkpoint"], api_name="/gallery")
    assert loaded["checkpoint"] == "glyphs-mini-tiny"


def test_a_folder_the_operator_allows_loads_and_trains(tiny_checkpoints, tmp_path):
    private = _outside_checkpoint(tmp_path)
    classes = tmp_path / "elsewhere" / "photos"
    for c in range(4):
        for i in range(3):
            (classes / f"class{c}").mkdir(parents=True, exist_ok=True)
            (classes / f"class{c}" / f"{i}.png").write_bytes(_png_bytes(color=60 * c))
    settings = _settings(tmp_path, tiny_checkpoints, allowed_folders=(tmp_path / "elsewhere",))
    with _serving(settings) as (client, _):
        loaded = client.predict(checkpoint=str(private), api_name="/gallery")
        assert loaded["checkpoint"] == "private-model", loaded
        started = client.predict(dataset="folder", folder_path=str(classes), batch_size=4, epochs=1,
                                 snapshot_every=0, api_name="/start_run")
        assert started["yours"] is True and "-folder-" in started["run_id"], started
        poll_status_until(client, lambda status: status.startswith(("**Finished**", "**Failed**")), "the run ending",
                          DEADLINE_S)
        assert page_status(client).startswith("**Finished**")
        outside = _refusal(client, dataset="folder", folder_path=str(tmp_path / "elsewhere" / ".." / "data"),
                           api_name="/start_run")
        assert outside == (f"the folder typed is not under a folder this app may read ({tmp_path / 'elsewhere'}): "
                           "type a folder there, or upload a zip of class folders")


def test_a_training_folder_path_is_refused_alike_without_an_allow_list(server, tmp_path):
    """Before, the Train tab's folder dataset took any server path."""
    folder = tmp_path / "classes"
    for c in range(4):
        (folder / f"class{c}").mkdir(parents=True)
        (folder / f"class{c}" / "0.png").write_bytes(_png_bytes())
    messages = {path: _refusal(server["client"], dataset="folder", folder_path=path, api_name="/start_run")
                for path in (str(folder), "/etc", "/no/such/folder", "../../etc", "../../no/such/folder")}
    assert set(messages.values()) == {
        "this app trains on no folder of its machine (its operator may list some in MEMVIR_ALLOWED_FOLDERS): "
        "upload a zip of class folders instead"}, messages
    assert server["app"].run_manager.runs() == []


def test_a_dataset_name_cannot_smuggle_a_folder_in(server):
    """The client API's /start_run takes the choices the page's dropdowns offer, no other name the library reads."""
    with pytest.raises(AppError, match="the dataset must be one of glyphs, glyphs-mini, folder, zip, hub, got "
                                       "folder:/etc"):
        server["client"].predict(dataset="folder:/etc", api_name="/start_run")
    with pytest.raises(AppError, match="the backbone must be one of convnet, .*, got timm:resnet50"):
        server["client"].predict(dataset="glyphs-mini", backbone="timm:resnet50", api_name="/start_run")
    assert server["app"].run_manager.runs() == []


def test_allowed_folders_come_from_the_environment(monkeypatch, tmp_path):
    from demo.common.settings import AppSettings

    monkeypatch.setenv("MEMVIR_ALLOWED_FOLDERS", os.pathsep.join([str(tmp_path / "a"), "", "~/b"]))
    assert AppSettings.from_env().allowed_folders == (tmp_path / "a", Path("~/b").expanduser())
    monkeypatch.delenv("MEMVIR_ALLOWED_FOLDERS")
    assert AppSettings.from_env().allowed_folders == ()
