"""A sketchpad whose handler receives the drawing undecoded, so the app's image limits apply before any decoding.

gr.Sketchpad (an ImageEditor) decodes and converts every part of its value (background, layers, composite) before
the handler runs, whatever its `type`: a client can send a small PNG declaring a 12000 x 12000 canvas as the "drawing"
and cost the server gigabytes before any check of the app's. `pass_undecoded` makes one hand over the uploaded files'
paths (or the bytes the browser's editor sent) as they are; `demo.common.uploads.load_sketch` checks each header and
decodes the composite only. The page and the API see the same component as before.

The instance's preprocess is replaced rather than subclassed: every gr.Component subclass makes Gradio write a
.pyi stub beside its source file when the class is defined.
"""

from __future__ import annotations

import types

import gradio as gr


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


def pass_undecoded(sketch: gr.Sketchpad) -> gr.Sketchpad:
    """`sketch`, from now on passing its handler the drawing's parts as files or bytes, none decoded."""
    sketch.preprocess = types.MethodType(_preprocess_undecoded, sketch)
    return sketch
