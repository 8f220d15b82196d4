"""demo.common.shared_plot: a figure sent to many pages is written to JSON once, and the page draws it as gr.Plot."""

import json

import gradio as gr
import plotly.graph_objects as go

from demo.common.shared_plot import KEPT, SharedPlot


def _figure(y):
    return go.Figure(go.Scatter(x=[0, 1, 2], y=y, mode="lines"))


def test_one_figure_is_written_once_for_every_page_and_as_plotly_writes_it(monkeypatch):
    with gr.Blocks():
        first, second = SharedPlot(), SharedPlot()
    figure, written = _figure([3, 1, 2]), []
    expected = json.loads(figure.to_json())
    original = figure.to_json
    monkeypatch.setattr(figure, "to_json", lambda: written.append(1) or original())
    answers = [plot.postprocess(figure) for plot in (first, second, first, second)]
    assert len(written) == 1 and all(answer is answers[0] for answer in answers)
    assert answers[0].type == "plotly" and json.loads(answers[0].plot) == expected


def test_another_figure_gets_its_own_json_and_old_ones_are_let_go():
    with gr.Blocks():
        plot = SharedPlot()
    figures = [_figure([k, 0, 1]) for k in range(KEPT + 5)]
    answers = [plot.postprocess(f) for f in figures]
    assert [json.loads(a.plot)["data"][0]["y"][0] for a in answers] == list(range(KEPT + 5))
    assert len(SharedPlot._kept) <= KEPT
    assert plot.postprocess(None) is None


def test_the_page_draws_it_with_gradio_s_plot():
    with gr.Blocks() as page:
        SharedPlot(elem_id="shared")
    (component,) = [c for c in page.config["components"] if c.get("props", {}).get("elem_id") == "shared"]
    assert component["type"] == "plot"
