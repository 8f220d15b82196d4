"""The few-class pictures of a `FewClassView` (demo.runs.few_class_track): the map (the paper's Fig. 7, for a few
classes) and the drift of each class's stored weights, one small panel per class.

Each class has one colour, the same in every snapshot and in both pictures (its place among the focus classes,
sorted); age shades it towards white, so a virtual set of j(M+1) steps ago is the paler the older it is. Symbols say
what a point is: a dot is an image embedded by the network now, a diamond a class weight (outlined: the live one), a
ring an embedding stored in a virtual set.

The map draws every point where one map (PCA or UMAP of them all, memvir.analysis.projection) put it, the images on
top so that no weight hides them, and is framed on its points. The drift picture draws each class's stored weights in
its class's own frame around the live weight, at their true angles to it (memvir.analysis.drift_frame), to one scale
in every panel: the few degrees a map of the whole view shortens to almost nothing. Every point's angle to its
class's live weight is in its hover text. Pure: no gradio, no run.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, qualitative

from demo.runs.few_class_track import FewClassView
from demo.runs.messages import UNNAMED_CLASSES, ClassNames
from demo.train.figures.embeddings import age_label
from demo.train.figures.style import HOUSE_AXIS, built, empty_figure, house_layout, merged, scatter

FEW_PALETTE = qualitative.T10  # ten clearly different colours: the default view shows 8 classes
MANY_PALETTE = qualitative.Alphabet  # up to 26, for a visitor who asks for more
_OLDEST_WHITE = 0.7  # the oldest virtual set is its class colour mixed this far towards white
LEGEND_GREY = "#5f6b7a"
OUTLINE = "#222222"
FEW_CLASS_HEIGHT = 520
# The legend: one entry per kind of point (the ages are shades of it), in this order
KINDS = (("embeddings", 0, "images now"), ("embeddings", 1, "stored images (virtual)"),
         ("weights", 0, "class weights now"), ("weights", 1, "stored class weights (virtual)"))
# The drift picture: this many panels a row, each this many pixels high, and round angles for its guide circle
DRIFT_COLUMNS = 4
DRIFT_PANEL_HEIGHT = 130
DRIFT_GUIDES = (1, 2, 5, 10, 20, 30, 45, 60, 90)
# A point's hover line for its angle to its class's live weight (customdata: class, degrees, cosine, row)
DISTANCE_WORDS = "<br>%{customdata[1]:.1f}° from its class weight now (cos %{customdata[2]:.3f})"
_DRIFT_GAP_X = 0.04  # between two panels, of the panels' width; a row's gap holds the class's name above each panel
_DRIFT_GAP_Y = 0.14


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


def _hover_data(labels: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """[n, 4] rows of (class, angle to its class's live weight in degrees, that angle's cosine, row), for the hover
    text and, for the images' dots, the row a click names (demo.train.neighbours)."""
    return np.column_stack([labels, angles, np.cos(np.radians(angles)), np.arange(len(labels))])


def _oldest(view: FewClassView) -> int:
    projection = view.projection
    return int(max(projection.weight_ages.max(initial=0), projection.memory_ages.max(initial=0)))


def _ages_words(oldest: int, margin: int) -> str:
    """'paler: older (11, 22, 33 steps ago)', or '' before the first virtual set."""
    if oldest == 0:
        return ""
    steps = ", ".join(f"{age * (margin + 1):,}" for age in range(1, oldest + 1))
    return f"paler: older ({steps} steps ago)"


def _point_name(kind: str, age: int, margin: int) -> str:
    if kind == "embeddings" and age == 0:
        return "image embedded now"
    return age_label(age, margin, "class weight" if kind == "weights" else "image stored")


def _marker(kind: str, age: int) -> dict:
    """The mark of a kind and age: dots over rings over diamonds in size, so that the images show over the weights."""
    if kind == "embeddings":
        return dict(symbol="circle", size=6, line=dict(width=0)) if age == 0 else \
            dict(symbol="circle-open", size=7, line=dict(width=1.5))
    return dict(symbol="diamond", size=12, line=dict(color=OUTLINE, width=1.5)) if age == 0 else \
        dict(symbol="diamond", size=9, line=dict(width=0))


def _legend_entries() -> list[dict]:
    """One grey entry per kind of point (KINDS), whose legend group holds that kind's traces of every age: a click on
    it hides or shows them all."""
    entries = []
    for rank, (kind, age, words) in enumerate(KINDS):
        entries.append(scatter(x=[None], y=[None], mode="markers", name=words, legendgroup=f"{kind}-{min(age, 1)}",
                               hoverinfo="skip", legendrank=100 + rank,
                               marker=dict(_marker(kind, age), color=LEGEND_GREY)))
    return entries


def in_view_square(xy: np.ndarray, view: FewClassView) -> np.ndarray:
    """Map positions [n, 2] moved and scaled as one (distances keep their ratios) so that `view`'s ranges, widened
    on the shorter side to a square about their middle, become the square from -1 to 1."""
    (x_low, x_high), (y_low, y_high) = view.x_range, view.y_range
    middle = np.array([(x_low + x_high) / 2, (y_low + y_high) / 2])
    half = max(x_high - x_low, y_high - y_low, 1e-12) / 2
    return (np.asarray(xy, dtype=float) - middle) / half


def few_class_figure(view: FewClassView | None, class_names: ClassNames = UNNAMED_CLASSES) -> go.Figure:
    """The few-class map of `view`: embeddings now (dots), class weights now (outlined diamonds), and for each
    virtual set its stored class weights (diamonds) and stored embeddings (rings), paler with age, all where the map
    put them; the images drawn last, on top. The legend holds one grey entry per kind (KINDS); each kind and age is
    one trace of points whose `meta` names it: {"kind": "embeddings" | "weights", "age": j}; each point's
    `customdata` is (class, degrees to its class's live weight, their cosine, row), its `text` the class's name in
    `class_names` (hover says it, as the neighbours of a clicked image do). The picture frames the points (`view`'s
    ranges) with equal units, drawn in the square from -1 to 1 on both axes (`in_view_square`)."""
    if view is None:
        return empty_figure("No few-class snapshot yet — press Start; it appears at the first snapshot.")
    projection = view.projection
    colors = class_colors(projection.classes)
    oldest = _oldest(view)
    margin = projection.margin
    traces = _legend_entries()

    def add(xy, labels, angles, age, kind):
        name = _point_name(kind, age, margin)
        distance = "" if kind == "weights" and age == 0 else DISTANCE_WORDS
        meta = {"kind": kind, "age": age}
        if kind == "embeddings" and age == 0:
            meta["pick"] = "focus"  # the images' dots: a click opens one with its neighbours
            distance += "<br>click: its nearest neighbours"
        square = in_view_square(xy, view)
        traces.append(scatter(
            x=square[:, 0], y=square[:, 1], name=name, mode="markers", customdata=_hover_data(labels, angles),
            text=class_names.words(labels), legendgroup=f"{kind}-{min(age, 1)}", showlegend=False, meta=meta,
            marker=dict(_marker(kind, age), color=[shade(colors[int(label)], age, oldest) for label in labels]),
            hovertemplate=f"class %{{text}}<br>{name}{distance}<extra></extra>"))

    # drawn from the bottom up: stored weights (older first, the newer on top), live weights, stored images, images
    for age in range(oldest, 0, -1):
        rows = projection.weight_ages == age
        if rows.any():
            add(projection.weight_xy[rows], projection.weight_labels[rows], projection.weight_angles[rows], age,
                "weights")
    live = projection.weight_ages == 0
    add(projection.weight_xy[live], projection.weight_labels[live], projection.weight_angles[live], 0, "weights")
    for age in range(oldest, 0, -1):
        rows = projection.memory_ages == age
        if rows.any():
            add(projection.memory_xy[rows], projection.memory_labels[rows], projection.memory_angles[rows], age,
                "embeddings")
    add(projection.embedding_xy, projection.embedding_labels, projection.embedding_angles, 0, "embeddings")

    method = projection.method.upper()
    axis = "PC" if projection.method == "pca" else method
    ages = _ages_words(oldest, margin)
    # short lines, each its own: a phone's picture is under 400 pixels wide
    title = (f"{len(projection.classes)} classes at step {projection.step:,}, {method}<br><sup>every point where the "
             f"map puts it{'<br>' + ages if ages else ''}</sup>")
    return built(traces, house_layout(
        title, f"{axis} 1", f"{axis} 2", f"few-classes-{projection.method}", height=FEW_CLASS_HEIGHT,
        margin=dict(l=50, r=20, t=80, b=40),
        legend=dict(orientation="h", x=0, xanchor="left", y=-0.12, yanchor="top", font=dict(size=11)),
        # Equal units kept by narrowing the plot, not by widening a range, on axes that are the same for every
        # snapshot: plotly.js, given new ranges for axes with equal units, never narrowed the x axis's (Plotly.react
        # kept the wider one it drew before), and widened a range on every resize of the page.
        xaxis=dict(range=[-1, 1], zeroline=False, showgrid=False, showticklabels=False, constrain="domain"),
        yaxis=dict(range=[-1, 1], zeroline=False, showgrid=False, showticklabels=False, scaleanchor="x",
                   scaleratio=1, constrain="domain"),
        meta={"step": int(projection.step)}))


def drift_guide(largest: float) -> int:
    """The round angle (DRIFT_GUIDES) of the drift picture's guide circle: the largest within `largest` degrees, so
    that the circle lies inside every panel; the smallest when all angles are smaller."""
    within = [guide for guide in DRIFT_GUIDES if guide <= largest]
    return within[-1] if within else DRIFT_GUIDES[0]


def _panel_domains(count: int) -> list[tuple[list[float], list[float]]]:
    """(x domain, y domain) of each of `count` panels, DRIFT_COLUMNS a row, filled from the top left."""
    rows = math.ceil(count / DRIFT_COLUMNS)
    width = (1 - _DRIFT_GAP_X * (DRIFT_COLUMNS - 1)) / DRIFT_COLUMNS
    height = (1 - _DRIFT_GAP_Y * (rows - 1)) / rows
    domains = []
    for index in range(count):
        row, column = divmod(index, DRIFT_COLUMNS)
        x0 = column * (width + _DRIFT_GAP_X)
        y1 = 1 - row * (height + _DRIFT_GAP_Y)
        # rounded into [0, 1], where plotly wants a domain: the sums' float error would leave it by 1e-16
        domains.append(([round(x0, 6), min(round(x0 + width, 6), 1.0)],
                        [max(round(y1 - height, 6), 0.0), round(y1, 6)]))
    return domains


def _panel_title(named: str, longest: int = 12) -> str:
    """A drift panel's title: the class's name alone ("Ͻ U+03FD", or a folder's name cut to `longest` characters, the
    hover has it whole), "class 420" where only its number is known; short enough for a panel of a phone's width."""
    if named.isdigit():
        return f"class {named}"
    return named if len(named) <= longest else named[:longest - 1] + "…"


def few_class_drift_figure(view: FewClassView | None, class_names: ClassNames = UNNAMED_CLASSES) -> go.Figure:
    """The drift of `view`'s stored class weights: one panel per class (sorted), the live weight (outlined diamond)
    in its middle and each stored weight (diamonds, paler with age) at its true angle from it in degrees, joined to it
    by a spoke, in the class's drift frame (memvir.analysis.drift_frame); every panel to one scale, with a dashed
    guide circle at a round angle (`drift_guide`), the class's name in `class_names` over its panel. Traces as the
    map's: `meta` {"kind": "weights", "age": j, "class": c}, `customdata` (class, degrees, cosine, row), `text` the
    class's name."""
    if view is None:
        return empty_figure("No few-class snapshot yet — press Start; it appears at the first snapshot.")
    projection = view.projection
    if projection.weight_drift is None or not (projection.weight_ages > 0).any():
        return empty_figure(f"Step {projection.step:,}: no virtual set yet, so no stored class weight to drift. "
                            "They arrive after the warm-up.")
    colors = class_colors(projection.classes)
    oldest, margin = _oldest(view), projection.margin
    reach = max(float(projection.weight_angles.max()), 0.5) * 1.15  # every stored weight inside its panel
    guide = drift_guide(reach / 1.15)
    classes = sorted(int(label) for label in projection.classes)
    traces, shapes, annotations, layout = [], [], [], {}
    for panel, (label, (x_domain, y_domain)) in enumerate(zip(classes, _panel_domains(len(classes)), strict=True)):
        suffix = "" if panel == 0 else str(panel + 1)
        x_name, y_name = f"x{suffix}", f"y{suffix}"
        axis = merged(HOUSE_AXIS, dict(range=[-reach, reach], showticklabels=False, zeroline=False, showgrid=False,
                                       showline=False, fixedrange=True))
        layout[f"xaxis{suffix}"] = merged(axis, dict(domain=x_domain, anchor=y_name, constrain="domain"))
        layout[f"yaxis{suffix}"] = merged(axis, dict(domain=y_domain, anchor=x_name, constrain="domain",
                                                     scaleanchor=x_name, scaleratio=1))
        shapes.append(dict(type="circle", xref=x_name, yref=y_name, x0=-guide, x1=guide, y0=-guide, y1=guide,
                           line=dict(color="#9aa5b1", width=1, dash="dot")))
        (named,) = class_names.words([label])
        annotations.append(dict(text=_panel_title(named), xref=f"{x_name} domain", yref=f"{y_name} domain", x=0, y=1,
                                xanchor="left", yanchor="bottom", showarrow=False, font=dict(size=11)))
        rows = np.flatnonzero(projection.weight_labels == label)
        stored = rows[projection.weight_ages[rows] > 0]
        spokes_x = [value for row in stored for value in (0.0, projection.weight_drift[row, 0], None)]
        spokes_y = [value for row in stored for value in (0.0, projection.weight_drift[row, 1], None)]
        traces.append(scatter(x=spokes_x, y=spokes_y, mode="lines", xaxis=x_name, yaxis=y_name, showlegend=False,
                              hoverinfo="skip", line=dict(color="rgba(60, 60, 60, 0.45)", width=1)))
        for age in range(oldest, -1, -1):  # the live weight last, on top
            chosen = rows[projection.weight_ages[rows] == age]
            if not len(chosen):
                continue
            name = _point_name("weights", age, margin)
            distance = "" if age == 0 else DISTANCE_WORDS
            traces.append(scatter(
                x=projection.weight_drift[chosen, 0], y=projection.weight_drift[chosen, 1], mode="markers",
                xaxis=x_name, yaxis=y_name, name=name, showlegend=False,
                meta={"kind": "weights", "age": age, "class": label},
                customdata=_hover_data(projection.weight_labels[chosen], projection.weight_angles[chosen]),
                text=[named] * len(chosen),
                marker=dict(_marker("weights", age), color=shade(colors[label], age, oldest)),
                hovertemplate=f"class %{{text}}<br>{name}{distance}<extra></extra>"))
    rows_of_panels = math.ceil(len(classes) / DRIFT_COLUMNS)
    ages = _ages_words(oldest, margin)
    cosine = math.cos(math.radians(guide))
    title = (f"Stored weights' drift, step {projection.step:,}<br><sup>true angles; dotted circle {guide}° "
             f"(cos {cosine:.3f}){'<br>' + ages if ages else ''}</sup>")
    return built(traces, dict(
        house_layout(title, "", "", "few-classes-drift", height=110 + DRIFT_PANEL_HEIGHT * rows_of_panels,
                     margin=dict(l=12, r=12, t=90, b=12), showlegend=False),
        **layout, shapes=shapes, annotations=annotations, meta={"step": int(projection.step)}))
