"""demo.common.shims, the page's one door to gradio's and plotly's private parts: each fails loudly here when an
upgrade moves what it relies on."""

import json
import time
from pathlib import Path

import gradio as gr
import plotly
import plotly.graph_objects as go
import pytest
from gradio.components.image_editor import EditorData, EditorDataBlobs

from demo.common import shims

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements.txt"


def test_the_installed_gradio_and_plotly_are_the_versions_the_shims_were_written_for():
    # The pins of requirements.txt, read from the file, not from the shims.
    pins = dict(line.strip().split("==") for line in REQUIREMENTS.read_text().splitlines() if "==" in line)
    assert shims.PINNED == {"gradio": pins["gradio"], "plotly": pins["plotly"]}
    assert (gr.__version__, plotly.__version__) == (pins["gradio"], pins["plotly"])


def test_another_version_stops_the_app_with_what_to_install():
    with pytest.raises(RuntimeError, match=r"gradio 6\.99\.0 \(the page needs 6\.31\.0\).*pip install -r requirements"):
        shims.check_versions({"gradio": "6.99.0", "plotly": shims.PINNED["plotly"]})
    shims.check_versions(dict(shims.PINNED))  # the pinned versions pass


def test_queue_timing_reaches_the_queue_gradio_polls():
    with gr.Blocks() as blocks:
        gr.Button()
    shims.set_queue_timing(blocks, 0.1, 0.2)
    assert shims.queue_timing(blocks) == (0.1, 0.2)
    assert (blocks._queue.sleep_when_free, blocks._queue.progress_update_sleep_when_free) == (0.1, 0.2)


def test_an_unvalidated_figure_is_the_figure_plotly_would_validate():
    traces = [{"type": "scatter", "x": [1, 2], "y": [3, 4], "mode": "lines", "line": {"color": "red"}}]
    layout = {"title": {"text": "loss"}, "xaxis": {"title": {"text": "step"}}}
    unvalidated = shims.unvalidated_figure(traces, layout)
    validated = go.Figure(data=traces, layout=layout)
    assert json.loads(unvalidated.to_json()) == json.loads(validated.to_json())
    with pytest.raises(ValueError):  # validation is what it skips: plotly itself refuses the misspelling
        go.Figure(data=[{"type": "scatter", "x": [1], "colr": "red"}])
    shims.unvalidated_figure([{"type": "scatter", "x": [1], "colr": "red"}], {})  # the shim takes it as it is


def test_an_undecoded_sketchpad_hands_over_its_parts_as_files_or_bytes(tmp_path):
    sketch = shims.pass_undecoded(gr.Sketchpad())
    png = b"\x89PNG not decoded"
    sketch.blob_storage["id-1"] = EditorDataBlobs(background=None, layers=[png, None], composite=png)
    assert sketch.preprocess(EditorData(id="id-1")) == {"background": None, "layers": [png], "composite": png}
    assert "id-1" not in sketch.blob_storage  # taken out of the store, as gradio's own preprocess does
    assert sketch.preprocess(EditorData(id="gone")) == {"background": None, "layers": [], "composite": None}
    assert sketch.preprocess(None) is None


def test_a_sketchpads_unnamed_blobs_are_forgotten_past_a_size_and_an_age():
    from gradio.components.image_editor import AcceptBlobs

    now = [0.0]
    sketch = shims.pass_undecoded(gr.Sketchpad())
    sketch.blob_storage = shims.BoundedBlobs(max_bytes=1000, max_age_s=60, clock=lambda: now[0])

    def upload(drawing: str, part: str, size: int, index=None):  # what the browser's editor posts, through gradio
        sketch.accept_blobs(AcceptBlobs(data={"type": part, "index": index, "id": drawing, "file": b""},
                                        files=[("blob", b"x" * size)]))

    upload("a", "composite", 400)
    now[0] = 10
    upload("b", "composite", 300)
    upload("b", "layer", 200, index=1)  # one drawing, two parts: 500 bytes
    assert sketch.blob_storage.total_bytes == 900 and set(sketch.blob_storage) == {"a", "b"}
    now[0] = 20
    upload("c", "composite", 300)  # 1,200 bytes in all: the oldest drawing goes
    assert set(sketch.blob_storage) == {"b", "c"} and sketch.blob_storage.total_bytes == 800
    now[0] = 75
    upload("d", "composite", 10)  # "b" was last written at 10: unnamed for 65 s, past the age
    assert set(sketch.blob_storage) == {"c", "d"}
    upload("e", "composite", 5000)  # larger than the bound alone: not kept, and the others stay
    assert set(sketch.blob_storage) == {"c", "d"}
    # a search names a drawing: gradio's preprocess takes it out, and the store's count with it
    assert sketch.preprocess(EditorData(id="d"))["composite"] == b"x" * 10
    assert "d" not in sketch.blob_storage and sketch.blob_storage.total_bytes == sum(
        len(blobs.composite) for blobs in sketch.blob_storage.values())


def test_a_blob_upload_the_page_would_not_send_is_refused_in_words():
    from fastapi import HTTPException
    from gradio.data_classes import DataWithFiles

    sketch = shims.pass_undecoded(gr.Sketchpad())
    assert sketch.accept_blobs._is_server_fn  # else /gradio_api/component_server answers 404

    def upload(files=(("blob", b"png"),), **fields):
        form = {"component_id": "7", "session_hash": "s", "fn_name": "accept_blobs", "type": "layer", "index": "2",
                "id": "k3j5h1", **fields}
        sketch.accept_blobs(DataWithFiles(data={key: value for key, value in form.items() if value is not None},
                                          files=list(files)))

    upload()  # as the page's editor sends a layer, and its background and composite (index null)
    upload(type="composite", index="null")
    assert sketch.blob_storage["k3j5h1"].layers == [None, None, b"png"]
    for fields, files, words in [
        ({"index": str(10**7)}, None, "its layer index must be null or a whole number from 0 to 99, got 10000000"),
        ({"index": "1" * 5000}, None, "its layer index must be null or a whole number from 0 to 99, got 111"),
        ({"index": "٣"}, None, "its layer index must be null or a whole number from 0 to 99, got ٣"),
        ({"index": None}, None, "its layer index must be null or a whole number from 0 to 99, got None"),
        ({"type": "mask"}, None, "its type must be one of background, layer, composite, got mask"),
        ({"id": "x" * 65}, None, "its drawing id must be text of 1 to 64 characters"),
        ({"id": ""}, None, "its drawing id must be text of 1 to 64 characters"),
        ({}, [], "it must carry one file, not 0"),
        ({}, [("a", b""), ("b", b"")], "it must carry one file, not 2"),
    ]:
        with pytest.raises(HTTPException) as refused:
            upload(**fields) if files is None else upload(files=files, **fields)
        assert refused.value.status_code == 400
        assert refused.value.detail.startswith("the drawing's part was refused: " + words), refused.value.detail
    with pytest.raises(HTTPException, match=r"send it as the page's editor does"):
        sketch.accept_blobs({"type": "layer"})  # a JSON body, not a form
    assert list(sketch.blob_storage) == ["k3j5h1"] and len(sketch.blob_storage["k3j5h1"].layers) == 3


def test_a_drawing_nobody_names_is_forgotten_though_no_other_blob_arrives():
    from gradio.components.image_editor import EditorDataBlobs

    store = shims.BoundedBlobs(max_bytes=1000, max_age_s=0.1)
    store["quiet"] = EditorDataBlobs(background=None, layers=[], composite=b"x" * 10)
    deadline = time.monotonic() + 10
    while "quiet" in store and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "quiet" not in store and store.total_bytes == 0


def test_a_file_box_passes_the_uploads_path_without_writing_a_file(tmp_path):
    from gradio.data_classes import FileData, ListFiles

    upload = tmp_path / "query.png"
    upload.write_bytes(b"png")
    with gr.Blocks() as blocks:
        single, many = gr.File(file_count="single"), gr.File(file_count="multiple")
        zips, binary = gr.File(file_types=[".zip"]), gr.File(type="binary")
    cache = Path(single.GRADIO_CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    before = set(cache.iterdir())
    gr.File().preprocess(FileData(path=str(upload)))  # gradio's own: a temporary file more in its cache
    assert len(set(cache.iterdir()) - before) == 1
    shims.without_file_per_request(blocks)
    before = set(cache.iterdir())
    path = single.preprocess(FileData(path=str(upload)))
    assert path == str(upload) and path.name == str(upload)  # a NamedString, as gradio's
    assert many.preprocess(ListFiles(root=[FileData(path=str(upload))] * 2)) == [str(upload)] * 2
    assert binary.preprocess(FileData(path=str(upload))) == b"png"
    assert zips.preprocess(FileData(path=str(tmp_path / "classes.zip"))) == str(tmp_path / "classes.zip")
    with pytest.raises(gr.Error, match=r"this box takes \.zip files only, and query\.png is not one"):
        zips.preprocess(FileData(path=str(upload), orig_name="query.png"))
    assert set(cache.iterdir()) == before


def _asgi_call(middleware, path: str, chunks: list[bytes], declared: int | None = None):
    """(what the middleware sent back, the chunks left unread) for one POST of `chunks`."""
    import asyncio
    import concurrent.futures

    incoming = [{"type": "http.request", "body": chunk, "more_body": number < len(chunks) - 1}
                for number, chunk in enumerate(chunks)]
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    call = middleware({"type": "http", "method": "POST", "path": path, "headers": headers}, receive, send)
    # on a thread of its own: a browser test earlier on this test worker keeps Playwright's event loop running in
    # the main thread (its session-wide browser), where asyncio.run refuses to start another
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(asyncio.run, call).result()
    return sent, incoming


def _reading_app(read: list):
    async def app(scope, receive, send):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                await send({"type": "http.response.start", "status": 400, "headers": []})
                await send({"type": "http.response.body", "body": b"There was an error parsing the body"})
                return
            read.append(message["body"])
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % sum(map(len, read))})

    return app


def _answer(sent) -> tuple[int, bytes]:
    return sent[0]["status"], b"".join(message.get("body", b"") for message in sent[1:])


def test_a_request_body_past_the_bound_is_refused_before_it_is_kept(monkeypatch):
    monkeypatch.setattr(shims, "format_bytes", lambda n: f"{n} B")
    read = []
    middleware = shims.BoundedRequestBodies(_reading_app(read), max_bytes=100, advice="send images as files")
    refusal = b'{"detail": "the request is %s; requests up to 100 B are accepted: send images as files"}'
    # declared past the bound: the app never runs, the body is read and dropped so that the client reads the answer
    sent, left = _asgi_call(middleware, "/gradio_api/queue/join", [b"x" * 60] * 3, declared=180)
    assert _answer(sent) == (413, refusal % b"180 B") and read == [] and left == []
    # no length declared (chunked): cut off at the bound, the app's answer to the cut replaced by the refusal
    sent, left = _asgi_call(middleware, "/gradio_api/queue/join", [b"x" * 60] * 3)
    assert _answer(sent) == (413, refusal % b"more than 100 B") and read == [b"x" * 60] and left == []
    read.clear()
    sent, _ = _asgi_call(middleware, "/gradio_api/queue/join", [b"x" * 60, b"x" * 40], declared=100)
    assert _answer(sent) == (200, b"100")  # at the bound: read
    read.clear()
    sent, _ = _asgi_call(middleware, "/gradio_api/upload", [b"x" * 60] * 3, declared=180)
    assert _answer(sent) == (200, b"180")  # file uploads: launch's max_file_size bounds them, on disk
    assert shims.bounded_request_bodies(100).kwargs == {"max_bytes": 100, "advice": ""}  # as launch's app_kwargs take


@pytest.mark.parametrize("private", [r"\b_process_single_file\b", r"\baccept_blobs\b", r"\bblob_storage\b",
                                     r"\bAPI_PREFIX\b", r"\bNamedString\b", r"\b_is_server_fn\b"])
def test_the_private_gradio_names_of_these_shims_appear_here_only(private):
    import re

    root = REQUIREMENTS.parent
    sources = [*root.glob("*.py"), *(path for top in ("memvir", "demo") for path in (root / top).rglob("*.py"))]
    users = sorted(str(path.relative_to(root)) for path in sources if re.search(private, path.read_text()))
    assert users == ["demo/common/shims.py"]
