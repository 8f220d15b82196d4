"""The house style every figure of the Train tab shares, and how a figure is built.

Traces and layout are plain dicts in plotly's own nested form (`scatter`; ``title=dict(text=...)``, never plotly's
``title_text`` shorthand), and a figure is made of them whole without plotly's validation (`built`): the app redraws
every second, so the figures stay light. tests/app/train/test_figure_validity.py checks every kind of figure against
plotly's validators.
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from demo.common import shims

FIGURE_HEIGHT = 350
BASELINE_COLOR = "#a0a0a0"
MAIN_COLOR = "#1f5fa8"
# The house look: plotly's "plotly_white" for 2-D charts, set directly. Naming the template instead makes plotly copy
# all of it (the defaults of every trace type) into each figure, 6 KB of its JSON; plotly's empty template ("none", as
# it is sent) keeps plotly.js from applying its own. The backgrounds are transparent, not plotly_white's white: the
# page's own background shows through, so a chart follows the page into dark mode (whose text and grid colours
# demo/static/page.css sets; a figure cannot read the page's theme).
TRANSPARENT = "rgba(0,0,0,0)"
HOUSE_LAYOUT = dict(template=pio.templates["none"].to_plotly_json(), paper_bgcolor=TRANSPARENT,
                    plot_bgcolor=TRANSPARENT, font=dict(color="#2a3f5f"), hoverlabel=dict(align="left"))
HOUSE_AXIS = dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="",
                  automargin=True, title=dict(standoff=15))


def built(traces: list[dict], layout: dict) -> go.Figure:
    """The figure of `traces` (`scatter` dicts) and `layout`, taken as they are, without plotly's validation of each
    property (demo.common.shims.unvalidated_figure, and docs/benchmarks.md for what it costs)."""
    # empty lists (no shapes, no annotations) left out, as plotly's validation leaves them out of the JSON
    layout = {key: value for key, value in layout.items() if not (isinstance(value, list) and not value)}
    return shims.unvalidated_figure(traces, layout)


def scatter(**properties) -> dict:
    """A scatter trace as plotly's JSON has it: nested dicts (``line=dict(dash="dash")``, not ``line_dash``)."""
    return dict(type="scatter", **properties)


def merged(base: dict, more: dict) -> dict:
    """`base` with `more` on top, nested dicts merged key by key (as plotly's update_layout merges)."""
    result = dict(base)
    for key, value in more.items():
        result[key] = merged(result[key], value) if isinstance(value, dict) and isinstance(result.get(key), dict) \
            else value
    return result


def empty_figure(message: str) -> go.Figure:
    """A blank figure that says ``message`` in its middle (no axes), sized like the others."""
    note = dict(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                font=dict(size=14, color="#666666"))
    return built([], dict(**HOUSE_LAYOUT, height=FIGURE_HEIGHT, xaxis=dict(visible=False), yaxis=dict(visible=False),
                          margin=dict(l=20, r=20, t=40, b=20), annotations=[note]))


def house_layout(title: str, x_title: str, y_title: str, uirevision: str, **more) -> dict:
    """The house style (HOUSE_LAYOUT: plotly_white's look), compact height, legend in a row above the plot, zoom kept
    across updates (``uirevision`` stays the same while the data change); `more` on top (`merged`)."""
    return merged(dict(
        **HOUSE_LAYOUT, height=FIGURE_HEIGHT, uirevision=uirevision,
        title=dict(text=title, x=0.01, xanchor="left", y=0.97, yanchor="top", font=dict(size=15)),
        legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom", font=dict(size=11)),
        margin=dict(l=60, r=60, t=80, b=45), hovermode="closest",
        xaxis=merged(HOUSE_AXIS, dict(title=dict(text=x_title))),
        yaxis=merged(HOUSE_AXIS, dict(title=dict(text=y_title))),
    ), more)
