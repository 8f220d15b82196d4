"""demo.common.shims, the page's one door to gradio's and plotly's private parts: each fails loudly here when an
upgrade moves what it relies on."""

import json
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
