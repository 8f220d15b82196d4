"""A plot component whose figures are turned into JSON once, however many pages are sent them.

Every page watching a run is sent the same figure objects (demo.train.live_view.FigureBuilder draws them once for
all); gr.Plot would still write each one to JSON for every page that polls, a cost that grows with the watchers
(docs/benchmarks.md, "Many watchers"). The figures are never changed once drawn, so the JSON of a figure object is
kept while it is the one being sent.
"""

from __future__ import annotations

import threading
import weakref

import gradio as gr

KEPT = 32  # figures whose JSON is kept: a few runs' curves, spread figures and pictures at once


class SharedPlot(gr.Plot):
    """gr.Plot that writes a given figure object to JSON once, for every page and poll that sends it."""

    is_template = True  # the page draws it as gr.Plot (as gradio's own templates of a component, gradio.templates)
    _lock = threading.Lock()
    _kept: list[tuple[weakref.ref, object]] = []  # (the figure, its JSON), newest last; shared by every plot

    def postprocess(self, value):
        if value is None:
            return super().postprocess(value)
        with self._lock:
            for figure, data in self._kept:
                if figure() is value:
                    return data
        data = super().postprocess(value)
        with self._lock:
            SharedPlot._kept = [entry for entry in self._kept if entry[0]() is not None][-(KEPT - 1):]
            SharedPlot._kept.append((weakref.ref(value), data))
        return data
