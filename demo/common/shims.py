"""Every use the page makes of gradio and plotly outside their documented APIs, in one place.

Each is pinned by the exact versions in requirements.txt, checked here at import (a mismatch stops the app with a
message rather than letting a private attribute fail later), and each has a test that fails loudly when an upgrade
changes it (tests/app/test_shims.py).

- gradio's queue: how often an idle queue looks for work (`set_queue_timing`); gradio 6 has no public setting.
- gradio's Sketchpad: `pass_undecoded` hands the handler the drawing's parts undecoded, so that the app's image
  limits apply before any decoding (gr.Sketchpad decodes every part of its value before the handler runs, whatever
  its `type`: a small PNG declaring a 12000 x 12000 canvas would cost the server gigabytes). The instance's
  preprocess is replaced rather than subclassed: every gr.Component subclass makes gradio write a .pyi stub beside
  its source file when the class is defined. Its blob store (`ImageEditor.accept_blobs` keeps each drawing's parts
  until an event names them) is bounded by `BoundedBlobs`: blobs that no search ever names (the page sends a new
  drawing id at every stroke; a page closed mid-drawing, a client that only uploads) would stay in the server's memory
  for good. Its accept_blobs, which gradio serves at /gradio_api/component_server, is guarded (`_check_blob`): gradio
  makes a layer list as long as any index sent, kept with the drawing, and answers anything unexpected with HTTP 500.
- gradio's File: `without_file_per_request` passes a handler the uploaded file's path as gradio does, without the empty
  temporary file gradio's File.preprocess opens in the upload cache at every event (`_process_single_file`): a
  client repeating one search would leave one file more each time, for good.
- gradio's routes: `bounded_request_bodies` refuses, in words, a request body above a bound before it is read, except
  on gradio's upload route (/gradio_api/upload, which launch's max_file_size bounds and which writes to disk). gradio
  reads every event's body whole and parses it, whatever its size, before any component's check: an event carrying
  an image as a data URL keeps the server's memory higher long after its refusal (docs/benchmarks.md, "Oversized and
  repeated uploads").
- gradio's Dropdown and Radio: `refuse_outside_choices` checks a value sent for one (demo.common.inputs.check_text,
  then the choices) before gradio's own check, whose error quotes the value whole (a dataset name of megabytes comes
  back in a reply as large, a lone surrogate in a reply the server cannot encode) and prints a traceback per refusal.
  Replaced per instance, as the Sketchpad's.
- plotly's Figure without per-property validation (`unvalidated_figure`): most of the cost of the app's figures,
  which are redrawn every second while a run trains; tests/app/train/test_figure_validity.py has plotly validate
  every kind of figure instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
import types

import gradio as gr
import plotly
import plotly.graph_objects as go
from fastapi import HTTPException
from gradio.route_utils import API_PREFIX
from gradio.utils import NamedString
from gradio_client.utils import is_valid_file
from starlette.middleware import Middleware

from demo.common.inputs import InputRefused, check_text, shown
from memvir.memory.size import format_bytes

log = logging.getLogger(__name__)

PINNED = {"gradio": "6.31.0", "plotly": "7.1.0"}


def check_versions(installed: dict[str, str] | None = None) -> None:
    """RuntimeError naming each package whose installed version is not the one the shims were written for."""
    installed = installed or {"gradio": gr.__version__, "plotly": plotly.__version__}
    wrong = [f"{name} {installed[name]} (the page needs {version})" for name, version in PINNED.items()
             if installed[name] != version]
    if wrong:
        raise RuntimeError(
            f"MemVir Studio's page uses private parts of {', '.join(wrong)}: install the versions pinned in "
            "requirements.txt (pip install -r requirements.txt)"
        )


check_versions()


def set_queue_timing(blocks: gr.Blocks, idle_check_s: float, progress_check_s: float) -> None:
    """How often `blocks`' queue looks for new events while it is idle, and for progress updates."""
    queue = blocks._queue
    queue.sleep_when_free, queue.progress_update_sleep_when_free = idle_check_s, progress_check_s


def queue_timing(blocks: gr.Blocks) -> tuple[float, float]:
    """(idle check, progress check) of `blocks`' queue, in seconds."""
    return blocks._queue.sleep_when_free, blocks._queue.progress_update_sleep_when_free


def unvalidated_figure(traces: list[dict], layout: dict) -> go.Figure:
    """A plotly Figure of `traces` and `layout` (plain dicts in plotly's nested form), taken as they are."""
    return go.Figure(data=traces, layout=layout, _validate=False)


def _preprocess_undecoded(sketch: gr.Sketchpad, payload):
    """{"background": source, "layers": [source, ...], "composite": source}, each a file path or bytes (or None)."""
    if payload is None:
        return None
    if payload.id is not None:
        # The browser's editor uploads its parts as blobs ahead of the event (ImageEditor.accept_blobs), then sends
        # only their id; take them out of the store, as ImageEditor.preprocess does.
        blobs = sketch.blob_storage.pop(payload.id, None)
        if blobs is None:
            return {"background": None, "layers": [], "composite": None}
        background, layers, composite = blobs.background, blobs.layers, blobs.composite
    else:
        background, layers, composite = payload.background, payload.layers, payload.composite

    def source(part):
        return part if part is None or isinstance(part, bytes) else part.path

    return {"background": source(background),
            "layers": [source(layer) for layer in layers or [] if layer is not None],
            "composite": source(composite)}


# A drawing's parts are a few hundred kB; a page's search names them within seconds of the drawing's last stroke.
SKETCH_BLOBS_MAX_BYTES = 32 * 2**20
SKETCH_BLOBS_MAX_AGE_S = 600.0
# The page's editor names a drawing by Math.random().toString(36) (about 11 characters), and a visitor adds a layer
# by hand: far fewer than this.
SKETCH_PARTS = ("background", "layer", "composite")
SKETCH_ID_MAX_CHARS = 64
SKETCH_MAX_LAYERS = 100


def _blob_bytes(blobs) -> int:
    parts = [blobs.background, blobs.composite, *(blobs.layers or [])]
    return sum(len(part) for part in parts if isinstance(part, bytes | bytearray))


class BoundedBlobs(dict):
    """A Sketchpad's blob store (id -> its drawing's parts, as ImageEditor.accept_blobs writes it) that forgets the
    oldest drawings once all of them hold more than `max_bytes`, and any drawing not named for `max_age_s`; a drawing
    larger than `max_bytes` alone is not kept at all (its search then finds no drawing and says so)."""

    def __init__(self, max_bytes: int = SKETCH_BLOBS_MAX_BYTES, max_age_s: float = SKETCH_BLOBS_MAX_AGE_S,
                 clock=time.monotonic):
        super().__init__()
        self.max_bytes, self.max_age_s, self._clock = max_bytes, max_age_s, clock
        self._stored: dict[str, tuple[float, int]] = {}  # id -> (when last written, bytes), oldest first
        self._lock = threading.Lock()  # blobs arrive on many request threads at once
        self._timer: threading.Timer | None = None

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self._stored.values())

    def __setitem__(self, key, blobs) -> None:
        size = _blob_bytes(blobs)
        with self._lock:
            self._stored.pop(key, None)
            if size > self.max_bytes:  # alone past the bound: refused, the others kept
                super().pop(key, None)
                log.info("a drawing's blobs (%d bytes, more than %d) were not kept", size, self.max_bytes)
                return
            super().__setitem__(key, blobs)
            self._stored[key] = (self._clock(), size)
            self._forget(self._clock())
            self._wake_at_next_expiry()

    def pop(self, key, *default):
        with self._lock:
            self._stored.pop(key, None)
            return super().pop(key, *default)

    def _forget(self, now: float) -> None:
        total = self.total_bytes
        for key, (written, size) in list(self._stored.items()):
            if total <= self.max_bytes and now - written <= self.max_age_s:
                break
            del self._stored[key]
            super().pop(key, None)
            total -= size
            log.info("a drawing's blobs (%d bytes) were forgotten unused", size)

    def _wake_at_next_expiry(self) -> None:
        """Forget the oldest drawing when it expires even if no blob arrives by then: a server left quiet after a
        burst of unnamed drawings would otherwise hold them for good. Called under the lock."""
        if self._timer is not None or not self._stored:
            return
        written, _ = next(iter(self._stored.values()))
        self._timer = threading.Timer(max(0.0, written + self.max_age_s - self._clock()) + 1.0, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            self._timer = None
            self._forget(self._clock())
            self._wake_at_next_expiry()


def _refuse_blob(reason: str):
    log.warning("a drawing's part was refused: %s", reason)
    raise HTTPException(status_code=400, detail=f"the drawing's part was refused: {reason}")


def _check_blob(data) -> None:
    """Refuse (HTTP 400, in words) a blob upload the page's editor would not send, before gradio's accept_blobs reads
    it: it made a layer list as long as any index sent, and raised (HTTP 500, a traceback) on a missing field."""
    fields, files = getattr(data, "data", None), getattr(data, "files", None)
    if not isinstance(fields, dict) or not isinstance(files, list):
        _refuse_blob("send it as the page's editor does: a form with its type, index and drawing id, and one file")
    kind, index, drawing = fields.get("type"), fields.get("index"), fields.get("id")
    if kind not in SKETCH_PARTS:
        _refuse_blob(f"its type must be one of {', '.join(SKETCH_PARTS)}, got {shown(kind)}")
    if not isinstance(drawing, str) or not 0 < len(drawing) <= SKETCH_ID_MAX_CHARS:
        _refuse_blob(f"its drawing id must be text of 1 to {SKETCH_ID_MAX_CHARS} characters")
    if isinstance(index, str) and len(index) <= 3 and index.isascii() and index.isdigit():
        index = int(index)  # a form's field
    layer = isinstance(index, int) and not isinstance(index, bool) and 0 <= index < SKETCH_MAX_LAYERS
    if "index" not in fields or not (layer or index in (None, "", "null")):
        _refuse_blob(f"its layer index must be null or a whole number from 0 to {SKETCH_MAX_LAYERS - 1}, got "
                     f"{shown(index)}")
    if len(files) != 1:
        _refuse_blob(f"it must carry one file, not {len(files)}")


def pass_undecoded(sketch: gr.Sketchpad) -> gr.Sketchpad:
    """`sketch`, from now on passing its handler the drawing's parts as files or bytes, none decoded, keeping the
    blobs of drawings no event has named yet within bounds (`BoundedBlobs`), and refusing a blob upload the page would
    not send (`_check_blob`)."""
    sketch.preprocess = types.MethodType(_preprocess_undecoded, sketch)
    sketch.blob_storage = BoundedBlobs()
    accept = sketch.accept_blobs

    def accept_blobs(data):
        _check_blob(data)
        return accept(data)

    accept_blobs._is_server_fn = True  # what /gradio_api/component_server asks of a function it may call
    sketch.accept_blobs = accept_blobs
    return sketch


def _preprocess_choice(component, name: str, original, payload):
    """`original`(payload) once each value in `payload` is text the app reads and, unless the component takes custom
    values, one of its choices; else a gr.Error in the app's words, logged as one line."""
    custom = getattr(component, "allow_custom_value", False)
    values = [value for _, value in component.choices]
    for value in payload if isinstance(payload, list) else [payload]:
        try:
            check_text(value, name)
            if value is not None and not custom and value not in values:
                raise InputRefused(f"{name} must be one of {', '.join(map(str, values))}, got {shown(value)}")
        except InputRefused as error:
            log.warning("%s refused: %s", name, error)
            raise gr.Error(str(error), print_exception=False) from None
    return original(payload)


def refuse_outside_choices(component, name: str):
    """`component` (a gr.Dropdown or gr.Radio), from now on refusing a value that is not text, or not one of its
    choices, in words naming it `name`, without quoting the value whole."""
    component.preprocess = functools.partial(_preprocess_choice, component, name, component.preprocess)
    return component


def _file_by_path(component: gr.File, original, payload):
    """What gradio's File._process_single_file passes a handler (the uploaded file's path, as a NamedString), without
    the temporary file it opened in the upload cache and never closed nor removed."""
    if component.type != "filepath":
        return original(payload)
    if component.file_types and not is_valid_file(payload.path, component.file_types):
        message = (f"this box takes {', '.join(component.file_types)} files only, and "
                   f"{shown(payload.orig_name or 'the file sent')} is not one")
        log.warning("an upload was refused: %s", message)
        raise gr.Error(message, print_exception=False)
    return NamedString(payload.path)


def without_file_per_request(blocks: gr.Blocks) -> gr.Blocks:
    """`blocks`, each of its gr.File boxes from now on passing its handler the upload's path without writing a file."""
    for block in blocks.blocks.values():
        if isinstance(block, gr.File):
            block._process_single_file = functools.partial(_file_by_path, block, block._process_single_file)
    return blocks


_UPLOAD_ROUTE = f"{API_PREFIX}/upload"
# How long a refused body is read and dropped before the refusal is sent: a client that has not finished sending
# reads no answer from a connection closed under it, and one that sends for longer than this gets it all the same.
_REFUSED_BODY_LINGER_S = 10.0


def _declared_length(scope) -> int | None:
    for name, value in scope.get("headers") or []:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BoundedRequestBodies:
    """ASGI middleware answering a request whose body is longer than `max_bytes` with HTTP 413 and a sentence (as
    {"detail": ...}, the shape of FastAPI's own refusals), except on gradio's upload route. A declared Content-Length
    is judged before a byte of the body is kept; a body without one (chunked) is counted as it arrives and cut off at
    the bound, and whatever the app answered to the cut gives way to the refusal. The rest of a refused body is read
    and dropped, a chunk at a time, for up to `_REFUSED_BODY_LINGER_S`, so that the client can read the answer."""

    def __init__(self, app, max_bytes: int, advice: str = ""):
        self.app, self.max_bytes, self.advice = app, max_bytes, advice

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "").rstrip("/").endswith(_UPLOAD_ROUTE):
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(receive, send, declared)
            return
        received, cut, answering = 0, False, False

        async def counted():
            nonlocal received, cut
            if cut:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    cut = True
                    return {"type": "http.disconnect"}  # the app sees a client gone, and keeps nothing more
            return message

        async def unless_cut(message):
            nonlocal answering
            if cut and not answering:
                return
            answering = True
            await send(message)

        try:
            await self.app(scope, counted, unless_cut)
        except Exception:
            if not cut or answering:
                raise
        if cut and not answering:
            await self._refuse(receive, send, self.max_bytes, more=True)

    async def _refuse(self, receive, send, size: int, more: bool = False) -> None:
        message = (f"the request is {'more than ' * more}{format_bytes(size)}; requests up to "
                   f"{format_bytes(self.max_bytes)} are accepted" + (f": {self.advice}" if self.advice else ""))
        log.warning("a request was refused: %s", message)
        deadline = time.monotonic() + _REFUSED_BODY_LINGER_S
        drained = False
        with contextlib.suppress(TimeoutError):
            while not drained:
                dropped = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
                drained = dropped["type"] != "http.request" or not dropped.get("more_body", False)
        body = json.dumps({"detail": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if not drained:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def bounded_request_bodies(max_bytes: int, advice: str = "") -> Middleware:
    """`BoundedRequestBodies` as launch takes it (app_kwargs={"middleware": [...]})."""
    return Middleware(BoundedRequestBodies, max_bytes=max_bytes, advice=advice)
