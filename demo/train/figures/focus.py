"""The few-class picture (the paper's Fig. 7, for a few classes): a plotly figure of a `FocusView`
(demo.runs.focus_track).

Each class has one colour, the same in every snapshot (its place among the focus classes, sorted); age shades it
towards white, so a virtual set of j(M+1) steps ago is the paler the older it is. Symbols say what a point is: a dot
is an image embedded by the network now, a diamond a class weight (outlined: the live one), a ring an embedding stored
in a virtual set. The map (PCA or UMAP) places the images and the live weights; each stored class weight is drawn
around its class's live weight to the scale the bar in the corner states (memvir.analysis.projection, DRIFT_SCALE),
joined to it by a line, so the distance a virtual class has drifted is a length on screen, true to that scale. Every
point's angle to its class's live weight is in its hover text. Pure: no gradio, no run.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, qualitative

from demo.runs.focus_track import FocusView
from demo.train.figures.embeddings import age_label
from demo.train.figures.style import built, empty_figure, house_layout, scatter

FEW_PALETTE = qualitative.T10  # ten clearly different colours: the default view shows 8 classes
MANY_PALETTE = qualitative.Alphabet  # up to 26, for a visitor who asks for more
_OLDEST_WHITE = 0.7  # the oldest virtual set is its class colour mixed this far towards white
LINE_COLOR = "rgba(60, 60, 60, 0.55)"
LEGEND_GREY = "#5f6b7a"
FEW_CLASS_HEIGHT = 560
SCALE_BAR_DEGREES = 10  # the drift scale's bar: near the drift of a first virtual set on glyphs (cos 0.985)
SCALE_BAR_INSET = 0.05  # of the axis span, from the picture's lower left corner


def class_colors(classes) -> dict[int, str]:
    """Each focus class's colour, from its place among the classes sorted: the same classes keep their colours."""
    ordered = sorted(int(c) for c in classes)
    palette = FEW_PALETTE if len(ordered) <= len(FEW_PALETTE) else MANY_PALETTE
    return {label: palette[index % len(palette)] for index, label in enumerate(ordered)}


def shade(color: str, age: int, oldest: int) -> str:
    """`color` (hex) for age `age`: itself now, paler with every older virtual set, never white."""
    if age == 0:
        return color
    whiteness = _OLDEST_WHITE * (0.35 + 0.65 * (age - 1) / max(oldest - 1, 1)) if oldest > 1 else _OLDEST_WHITE * 0.35
    red, green, blue = (round(part + (255 - part) * whiteness) for part in hex_to_rgb(color))
    return f"rgb({red}, {green}, {blue})"


def _drift_lines(view: FocusView) -> dict | None:
    """One segment from each stored class weight to its class's live weight (None-separated): its length is the
    stored weight's angle to the live one, at the picture's drift scale."""
    projection = view.projection
    live = {int(label): xy for label, age, xy in
            zip(projection.weight_labels, projection.weight_ages, projection.weight_xy, strict=True) if age == 0}
    xs, ys = [], []
    for label, age, xy in zip(projection.weight_labels, projection.weight_ages, projection.weight_xy, strict=True):
        if age > 0 and int(label) in live:
            target = live[int(label)]
            xs += [xy[0], target[0], None]
            ys += [xy[1], target[1], None]
    if not xs:
        return None
    return scatter(x=xs, y=ys, mode="lines", name="stored weight → live weight", hoverinfo="skip", legendrank=300,
                   line=dict(color=LINE_COLOR, width=1.5))


def _scale_bar(view: FocusView) -> tuple[dict, dict]:
    """(shape, annotation): a bar of SCALE_BAR_DEGREES at the projection's drift scale in the lower left corner, and
    its length in words beside it (the title says what is drawn to it)."""
    projection = view.projection
    (x_low, x_high), (y_low, _) = view.x_range, view.y_range
    x0, y0 = x_low + SCALE_BAR_INSET * (x_high - x_low), y_low + SCALE_BAR_INSET * (x_high - x_low)
    x1 = x0 + SCALE_BAR_DEGREES * projection.drift_scale
    cosine = np.cos(np.radians(SCALE_BAR_DEGREES))
    shape = dict(type="line", xref="x", yref="y", x0=x0, x1=x1, y0=y0, y1=y0, line=dict(color="#222222", width=3))
    annotation = dict(x=x1, y=y0, xref="x", yref="y", xanchor="left", yanchor="middle", xshift=6, showarrow=False,
                      font=dict(size=11, color="#222222"), bgcolor="rgba(255, 255, 255, 0.8)",
                      text=f"{SCALE_BAR_DEGREES}° (cos {cosine:.3f}) between a stored and a live weight")
    return shape, annotation


def _hover_data(labels: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """[n, 4] rows of (class, angle to its class's live weight in degrees, that angle's cosine, row), for the hover
    text and, for the images' dots, the row a click names (demo.train.neighbours)."""
    return np.column_stack([labels, angles, np.cos(np.radians(angles)), np.arange(len(labels))])


def few_class_figure(view: FocusView | None) -> go.Figure:
    """The few-class picture of `view`: embeddings now (dots), class weights now (outlined diamonds), and for each
    virtual set its stored class weights (diamonds, around their live weight to the drift scale of the bar in the
    corner) and stored embeddings (rings), paler with age. Each kind and age is one legend entry, drawn in grey (the
    points themselves wear their class's colour), above one trace of points whose `meta` names it: {"kind":
    "embeddings" | "weights", "age": j}; each point's `customdata` is (class, degrees to its class's live weight,
    their cosine)."""
    if view is None:
        return empty_figure("No few-class snapshot yet — press Start; it appears at the first snapshot.")
    projection = view.projection
    colors = class_colors(projection.classes)
    oldest = int(max(projection.weight_ages.max(initial=0), projection.memory_ages.max(initial=0)))
    margin = projection.margin
    traces = []
    lines = _drift_lines(view)
    if lines is not None:
        traces.append(lines)

    def add(xy, labels, angles, age, kind, symbol, size, outline=None):
        name = age_label(age, margin, "class weights" if kind == "weights" else "embeddings")
        if kind == "embeddings" and age == 0:
            name = "embeddings now (the classes' training images)"
        if kind == "weights" and age == 0:
            distance = ""
        elif kind == "weights":
            distance = ("<br>%{customdata[1]:.1f}° from the class weight now (cos %{customdata[2]:.3f}), "
                        "drawn to the scale bar")
        else:
            distance = "<br>%{customdata[1]:.1f}° from its class weight now (cos %{customdata[2]:.3f})"
        meta = {"kind": kind, "age": age}
        if kind == "embeddings" and age == 0:
            meta["pick"] = "focus"  # the images' dots: a click opens one with its neighbours
            distance += "<br>click: its nearest neighbours"
        marker = dict(symbol=symbol, size=size, line=outline or dict(width=0))
        # the legend lists embeddings, then weights, each from now back (the traces are drawn in another order)
        traces.append(scatter(x=[None], y=[None], mode="markers", name=name, legendgroup=name, hoverinfo="skip",
                              legendrank=(100 if kind == "embeddings" else 200) + age,
                              marker=dict(marker, color=shade(LEGEND_GREY, age, oldest))))
        traces.append(scatter(
            x=xy[:, 0], y=xy[:, 1], name=name, mode="markers", customdata=_hover_data(labels, angles),
            legendgroup=name, showlegend=False, meta=meta,
            marker=dict(marker, color=[shade(colors[int(label)], age, oldest) for label in labels]),
            hovertemplate=f"class %{{customdata[0]:d}}<br>{name}{distance}<extra></extra>"))

    add(projection.embedding_xy, projection.embedding_labels, projection.embedding_angles, 0, "embeddings", "circle",
        6)
    for age in range(1, oldest + 1):
        rows = projection.memory_ages == age
        if rows.any():
            add(projection.memory_xy[rows], projection.memory_labels[rows], projection.memory_angles[rows], age,
                "embeddings", "circle-open", 7, dict(width=1.5))
    live = projection.weight_ages == 0
    add(projection.weight_xy[live], projection.weight_labels[live], projection.weight_angles[live], 0, "weights",
        "diamond", 14, dict(color="#222222", width=1.5))
    # the stored weights on top of the live ones, older first so that the newer lie on top
    for age in range(oldest, 0, -1):
        rows = projection.weight_ages == age
        if rows.any():
            add(projection.weight_xy[rows], projection.weight_labels[rows], projection.weight_angles[rows], age,
                "weights", "diamond", 9)

    method = projection.method.upper()
    axis = "PC" if projection.method == "pca" else method
    bar, bar_words = _scale_bar(view)
    # the legend under the plot: its entries are long words, and a picture with equal units wants the width
    # what is drawn to which scale, on the picture itself: the map's distances are not the bar's
    title = (f"{len(projection.classes)} classes at step {projection.step:,}, {method}<br><sup>stored class weights "
             "drawn around their live weight to the bar's scale; the rest as the map places it</sup>")
    return built(traces, house_layout(
        title, f"{axis} 1", f"{axis} 2", f"few-classes-{projection.method}", height=FEW_CLASS_HEIGHT,
        margin=dict(l=50, r=20, t=62, b=40),
        legend=dict(orientation="h", x=0, xanchor="left", y=-0.14, yanchor="top", font=dict(size=11)),
        xaxis=dict(range=list(view.x_range), zeroline=False),
        yaxis=dict(range=list(view.y_range), zeroline=False, scaleanchor="x", scaleratio=1),
        shapes=[bar], annotations=[bar_words], meta={"step": int(projection.step)}))
