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
  until an event names them) is bounded by `BoundedBlobs`: blobs that no search ever names (a page closed mid-drawing,
  a client that only uploads) stayed in the server's memory for good.
- gradio's Dropdown and Radio: `refuse_outside_choices` checks a value sent for one (demo.common.inputs.check_text,
  then the choices) before gradio's own check, whose error quotes the value whole (a 20 MB dataset name came back
  in a 21 MB reply, a lone surrogate as a reply the server could not encode) and prints a traceback per refusal.
  Replaced per instance, as the Sketchpad's.
- plotly's Figure without per-property validation (`unvalidated_figure`): most of the cost of the app's figures,
  which are redrawn every second while a run trains; tests/app/train/test_figure_validity.py has plotly validate
  every kind of figure instead.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import types

import gradio as gr
import plotly
import plotly.graph_objects as go

from demo.common.inputs import InputRefused, check_text, shown

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


def pass_undecoded(sketch: gr.Sketchpad) -> gr.Sketchpad:
    """`sketch`, from now on passing its handler the drawing's parts as files or bytes, none decoded, and keeping the
    blobs of drawings no event has named yet within bounds (`BoundedBlobs`)."""
    sketch.preprocess = types.MethodType(_preprocess_undecoded, sketch)
    sketch.blob_storage = BoundedBlobs()
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
