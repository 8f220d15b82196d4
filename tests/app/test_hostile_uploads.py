"""Oversized and repeated uploads (issue 44, item 5), each sent as an outside attack run sent it, against `python
app.py` in a process of its own (the session's, started as a Space starts it: `space_app`): its memory (VmRSS) is read
from /proc before a request and five seconds after it, and its data folder's files counted, so that what the server
keeps is measured apart from what the test itself allocates. Every refusal must be in words, name no server path, and
leave memory and disk as they were."""

import io
import json
import os
import time
import uuid
from pathlib import Path

import httpx
import pytest
from PIL import Image

from demo.common import shims
from demo.common.settings import AppSettings

pytestmark = pytest.mark.slow  # a server of its own (python app.py), which takes a while to start

REPO_ROOT = Path(__file__).resolve().parents[2]
SETTLE_S = 5.0  # how long after a request its memory is read: what is kept then is kept for good
MIB = 2**20
# What a refused request may leave behind: nothing of its body is kept, so no more than the server's own drift.
REFUSED_SLACK_MB = 32
HUGE_DATA_URL = "data:image/png;base64," + "A" * 63_000_000  # the attack's 63 MB image written into the event
REFUSED_EVENT = ("the request is 60.1 MiB; requests up to 21.0 MiB are accepted: send images as uploaded files, up to "
                 "20.0 MiB each")


class App:
    """The session's `python app.py` (`space_app`, tests/app/conftest.py: started as a Space starts it, on 127.0.0.1
    too) with the page's events and components by name."""

    def __init__(self, served):
        self.process, self.data, self.log, self.checkpoint = served.process, served.data, served.log, served.checkpoint
        self.url = served.url
        self.config = httpx.get(self.url + "config", timeout=30).json()
        self.events = {dependency["api_name"]: dependency["id"] for dependency in self.config["dependencies"]
                       if dependency.get("api_name")}

    def component(self, elem_id: str) -> int:
        return next(component["id"] for component in self.config["components"]
                    if component.get("props", {}).get("elem_id") == elem_id)

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024

    def event(self, api_name: str, data: list) -> tuple[int, str]:
        """Send one event as the page's script does (queue/join, then the stream): (HTTP status of the join, the
        answer's text: the refusal's detail, or the event's first output or error)."""
        session = uuid.uuid4().hex[:11]
        body = json.dumps({"data": data, "event_data": None, "fn_index": self.events[api_name], "trigger_id": None,
                           "session_hash": session})
        joined = httpx.post(self.url + "gradio_api/queue/join", content=body,
                            headers={"content-type": "application/json"}, timeout=120)
        del body
        if joined.status_code != 200:
            return joined.status_code, joined.json()["detail"]
        with httpx.stream("GET", self.url + "gradio_api/queue/data", params={"session_hash": session},
                          timeout=120) as stream:
            for line in stream.iter_lines():
                message = json.loads(line[5:]) if line.startswith("data:") else {}
                if message.get("msg") in ("process_completed", "close_stream", "unexpected_error"):
                    output = message.get("output") or {}
                    return 200, str(output.get("error") or (output.get("data") or [None])[0])
        raise AssertionError(f"{api_name} never answered")

    def blob(self, kind: str, index, drawing: str, payload: bytes) -> httpx.Response:
        """One part of a drawing as the page's editor uploads it (ImageEditor.accept_blobs, a multipart form)."""
        fields = {"component_id": str(self.component("sketch")), "session_hash": uuid.uuid4().hex[:11],
                  "fn_name": "accept_blobs", "type": kind, "index": "null" if index is None else str(index),
                  "id": drawing}
        return httpx.post(self.url + "gradio_api/component_server", data=fields,
                          files={"file": ("blob", payload, "application/octet-stream")}, timeout=120)

    def files(self) -> set[str]:
        return {str(path.relative_to(self.data)) for path in self.data.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def app(space_app, glyph_query):
    served = App(space_app)
    # one real search first: what a first search imports and caches is not what a refusal leaves
    status, about = served.event("prepare_retrieval", [served.checkpoint, "test split", None])
    assert status == 200 and "Checkpoint** `glyphs-mini-tiny`" in about, about
    served.query = _uploaded(served, glyph_query)
    status, about = served.event("search_upload", [served.checkpoint, "test split", 3, "", served.query, None, ""])
    assert status == 200 and not about.startswith("⚠️"), about
    yield served
    output = space_app.output()  # what it printed while these tests sent their requests (its output is unbuffered)
    assert "Traceback" not in output, output


def _uploaded(app: App, image: Path) -> dict:
    """`image` uploaded as the page uploads a file, named as an event names it."""
    answer = httpx.post(app.url + "gradio_api/upload", files={"files": (image.name, image.read_bytes(), "image/png")},
                        timeout=60)
    answer.raise_for_status()
    return {"path": answer.json()[0], "orig_name": image.name, "meta": {"_type": "gradio.FileData"}}


def _no_server_path(app: App, text: str) -> None:
    assert str(app.data) not in text and str(REPO_ROOT) not in text and "/tmp" not in text, text


# ---------------------------------------------------------------------------------------------- a 63 MB event
@pytest.mark.parametrize("where", ["checkpoint text", "sketch composite", "query file"])
def test_a_63_mb_data_url_is_refused_in_words_before_it_is_read(app, where):
    """Before, each was read whole and parsed before anything looked at it: the checkpoint text was refused by its
    length, the two files with a traceback in the log and no words; and the first of them kept the server's RSS
    higher by twice the request, five seconds later (the first case here runs on a server that has only searched;
    docs/benchmarks.md, "Oversized and repeated uploads")."""
    file = {"url": HUGE_DATA_URL, "meta": {"_type": "gradio.FileData"}}
    if where == "checkpoint text":
        api_name, data = "search_upload", [HUGE_DATA_URL, "test split", 3, "", None, None, ""]
    elif where == "sketch composite":
        api_name = "search_drawing"
        data = [app.checkpoint, "test split", 3, "", {"background": None, "layers": [], "composite": file, "id": None},
                None, ""]
    else:
        api_name, data = "search_upload", [app.checkpoint, "test split", 3, "", file, None, ""]
    before = app.rss_mb()
    status, answer = app.event(api_name, data)
    time.sleep(SETTLE_S)
    after = app.rss_mb()
    print(f"63 MB data URL as the {where}: RSS {before:.0f} -> {after:.0f} MB five seconds later ({status})")
    assert after - before < REFUSED_SLACK_MB, f"{before:.0f} MB -> {after:.0f} MB; {answer[:200]}"
    assert (status, answer) == (413, REFUSED_EVENT)
    _no_server_path(app, answer)


# ---------------------------------------------------------------------------------------------- the sketch's blobs
def test_unused_drawings_and_a_silly_layer_index_are_not_kept(app):
    """Before, 5 parts of 20 MB under ids no search named, then a layer index of 10**7 (gradio made a list of that
    many slots, kept with the drawing), kept the server's RSS far above the store's bound, and every upload answered
    200 (docs/benchmarks.md, "Oversized and repeated uploads")."""
    before = app.rss_mb()
    for number in range(5):
        assert app.blob("composite", None, f"unused-{number}", os.urandom(20_000_000)).status_code == 200
    refused = app.blob("layer", 10**7, "unused-layer", b"x" * 100)
    time.sleep(SETTLE_S)
    after = app.rss_mb()
    print(f"5 unused parts of 20 MB and a layer index of 10**7: RSS {before:.0f} -> {after:.0f} MB five seconds "
          f"later ({refused.status_code})")
    # the store keeps at most its bound of unnamed drawings; beside it, what one upload holds while it is read
    assert after - before < shims.SKETCH_BLOBS_MAX_BYTES / MIB + 32, (
        f"{before:.0f} MB -> {after:.0f} MB; the layer index answered {refused.status_code}")
    assert refused.status_code == 400 and refused.json()["detail"] == (
        "the drawing's part was refused: its layer index must be null or a whole number from 0 to 99, got 10000000")
    for kind, index, drawing, detail in [
        ("layer", "-1", "d", "its layer index must be null or a whole number from 0 to 99, got -1"),
        ("layer", "1" * 5000, "d", "its layer index must be null or a whole number from 0 to 99, got 111111111"),
        ("mask", None, "d", "its type must be one of background, layer, composite, got mask"),
        ("composite", None, "d" * 10_000, "its drawing id must be text of 1 to 64 characters"),
    ]:
        answer = app.blob(kind, index, drawing, b"x")
        assert answer.status_code == 400 and answer.json()["detail"].startswith(
            "the drawing's part was refused: " + detail), answer.text
        assert len(answer.text) < 500
    # a part past the bound of a request is refused before it is read, as any other request
    answer = app.blob("composite", None, "big", b"x" * 30_000_000)
    assert answer.status_code == 413 and answer.json()["detail"].startswith("the request is 28.6 MiB; requests up to "
                                                                            "21.0 MiB are accepted")


def test_a_chunked_body_past_the_bound_is_cut_off_and_refused(app):
    """A body sent without a Content-Length is counted as it arrives. (It runs after the blobs' test: on the code
    before, it was read whole, and the memory it freed hid the blobs' growth.)"""
    def chunks():
        for _ in range(63):
            yield b" " * 1_000_000

    answer = httpx.post(app.url + "gradio_api/queue/join", content=chunks(),
                        headers={"content-type": "application/json"}, timeout=120)
    assert answer.status_code == 413
    assert answer.json()["detail"].startswith("the request is more than 21.0 MiB; requests up to 21.0 MiB are "
                                              "accepted")


# ---------------------------------------------------------------------------------------------- files per request
def test_repeated_searches_with_one_upload_leave_no_file_each(app, glyph_query):
    """Before, gradio's File box opened an empty temporary file in the app's data folder at every event that named an
    upload: 10 searches with the same query left 11 new files (10 of them empty, one the model input's thumbnail,
    which gradio caches once per content)."""
    query = _uploaded(app, glyph_query)
    before = app.files()
    for _ in range(10):
        status, about = app.event("search_upload", [app.checkpoint, "test split", 3, "", query, None, ""])
        assert status == 200 and "nearest of" in about, about
    print(f"10 searches with one upload: {len(before)} -> {len(app.files())} files in the data folder")
    assert app.files() - before == set()


def test_a_file_box_still_refuses_the_kinds_it_does_not_take(app, tmp_path):
    """The Train tab's zip box takes .zip files only, as gradio's own check did, now in words."""
    image = tmp_path / "photo.png"
    buffer = io.BytesIO()
    Image.new("L", (8, 8)).save(buffer, format="PNG")
    image.write_bytes(buffer.getvalue())
    # the page's Start (private) takes the parameters of the client API's /start_run, in its order
    names = httpx.get(app.url + "gradio_api/info", timeout=30).json()["named_endpoints"]["/start_run"]["parameters"]
    values = {"dataset": "zip", "zip_file": _uploaded(app, image)}
    status, answer = app.event("start", [values.get(parameter["parameter_name"], parameter.get("parameter_default"))
                                         for parameter in names])
    assert status == 200 and answer == "this box takes .zip files only, and photo.png is not one", answer


def test_what_the_app_reads_still_comes_through(app):
    """The bound is the app's image limit and a margin: the largest event the app reads still reaches its checks (a
    20 MB text, refused by its length, in words), and a drawing's part at the image limit is kept for its search."""
    assert AppSettings(data_dir=app.data, checkpoints_dir=app.data).max_image_bytes == 20 * MIB  # REFUSED_EVENT's
    status, answer = app.event("search_upload", [app.checkpoint, "test split", 3, "x" * 20_000_000, app.query, None,
                                                 ""])
    assert (status, answer) == (200, "⚠️ the query's class is 20,000,000 characters long; at most 1,000 are "
                                     "accepted: shorten it")
    assert app.blob("composite", None, "at-the-limit", b"x" * (20 * MIB)).status_code == 200
    status, answer = app.event("search_drawing", [app.checkpoint, "test split", 3, "",
                                                  {"background": None, "layers": [], "composite": None,
                                                   "id": "at-the-limit"}, None, ""])
    assert (status, answer) == (200, "⚠️ the drawing is not an image this app can read (PNG, JPEG, BMP, WebP or GIF)")
