"""The embedding picture of all classes (the paper's Fig. 7) from a projected snapshot: rows coloured by age (the
step they came from) or by class, class weights as diamonds, the probe set of test images as crosses.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative, sample_colorscale

from demo.runs.messages import UNNAMED_CLASSES, ClassNames
from demo.train.figures.style import built, empty_figure, house_layout, merged, scatter
from memvir.analysis.projection import ProjectedSnapshot

EMBEDDING_HEIGHT = 380
MAX_LEGEND_ROW_ENTRIES = 8  # more legend entries than this go in a column at the side instead of rows on top
CLASS_PALETTE = qualitative.Dark24
AGE_COLORSCALE = "Viridis"  # dark (current) to light (old)
_AGE_SPAN = 0.85  # the oldest age sits at 85% of the scale: the palest yellow would vanish on white
_AGE_STOPS = go.scatter.Marker(colorscale=AGE_COLORSCALE).colorscale  # the scale's colour stops, as plotly sends them
COLOR_BY = ("age", "class")


def age_label(age: int, margin: int, what: str = "embeddings") -> str:
    """Plain words for the step a row came from: "embeddings now", or "embeddings from 51 steps ago" for virtual set
    j, which holds step t - j(M+1) (docs/method.md, "Algorithm")."""
    if age == 0:
        return f"{what} now"
    return f"{what} from {age * (margin + 1):,} steps ago"


def age_color(age: int, oldest: int) -> str:
    """The colour of one age: dark for the current step, lighter the older the virtual set."""
    return sample_colorscale(AGE_COLORSCALE, [_AGE_SPAN * age / max(oldest, 1)])[0]


def _age_marker(ages: np.ndarray, oldest: int) -> dict:
    """Per-point colours by age as numbers on the age colour scale: one small number a point in the JSON sent to each
    page, where a colour string per point would be several times its size."""
    return dict(color=ages, colorscale=_AGE_STOPS, cmin=0, cmax=max(oldest, 1) / _AGE_SPAN, showscale=False)


def _class_marker(labels: np.ndarray) -> dict:
    """Per-point colours by class, cycling through a qualitative palette (again as numbers on a scale)."""
    last = len(CLASS_PALETTE) - 1
    scale = [[index / last, color] for index, color in enumerate(CLASS_PALETTE)]
    return dict(color=np.asarray(labels) % len(CLASS_PALETTE), colorscale=scale, cmin=0, cmax=last, showscale=False)


def _probe_trace(projected: ProjectedSnapshot, color_by: str, class_names: ClassNames) -> dict:
    """The probe set's test-class images as small crosses, grey by age or coloured by class."""
    probe_labels = np.asarray(projected.probe_labels)
    probe_colors = dict(color="#888888") if color_by == "age" else _class_marker(probe_labels)
    # meta "pick" and the row last in customdata: a click opens the image's neighbours (demo.train.neighbours)
    return scatter(x=projected.probe_xy[:, 0], y=projected.probe_xy[:, 1], name="probe (test classes)",
                   mode="markers", customdata=np.column_stack([probe_labels, np.arange(len(probe_labels))]),
                   text=class_names.words(probe_labels, "test"), meta={"pick": "probe"},
                   marker=dict(symbol="x", size=6, line=dict(width=0), **probe_colors),
                   hovertemplate="probe, test class %{text}<br>click: its nearest neighbours<extra></extra>")


def embedding_figure(projected: ProjectedSnapshot | None, color_by: str = "age",
                     class_names: ClassNames = UNNAMED_CLASSES) -> go.Figure:
    """The embedding picture (paper Fig. 7): batch and memory rows as dots coloured by age (one legend entry per
    age, dark = current) or by class; class weights as diamonds (real ones outlined, virtual ones fading with age);
    the fixed probe set of test-class images as small crosses. Hover shows class and age, the class by its name in
    `class_names` (each point's `text`), as the neighbours of a clicked image name it."""
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by must be one of {', '.join(COLOR_BY)}; got {color_by!r}")
    if projected is None or len(projected.xy) == 0:
        return empty_figure("No snapshot yet — press Start; the embeddings appear at the first snapshot.")

    margin = projected.margin
    ages, labels = np.asarray(projected.ages), np.asarray(projected.labels)
    weight_ages, weight_labels = np.asarray(projected.weight_ages), np.asarray(projected.weight_labels)
    oldest = int(max(ages.max(), weight_ages.max(initial=0)))
    row_classes = np.array(class_names.words(labels), dtype=object)
    weight_classes = np.array(class_names.words(weight_labels), dtype=object)
    traces = []

    if color_by == "age":
        for age in np.unique(ages):
            rows = ages == age
            name = age_label(int(age), margin)
            traces.append(scatter(x=projected.xy[rows, 0], y=projected.xy[rows, 1], name=name, mode="markers",
                                  customdata=labels[rows], text=row_classes[rows], legendgroup=f"age{age}",
                                  marker=dict(size=5, color=age_color(int(age), oldest), opacity=0.75),
                                  hovertemplate=f"class %{{text}}<br>{name}<extra></extra>"))
    else:
        row_names = np.array([age_label(int(age), margin) for age in ages], dtype=object)
        traces.append(scatter(x=projected.xy[:, 0], y=projected.xy[:, 1], name="batch + memory rows",
                              mode="markers", customdata=np.stack([labels.astype(object), row_names], axis=1),
                              text=row_classes, marker=dict(size=5, opacity=1.0 - 0.6 * ages / max(oldest, 1),
                                                            **_class_marker(labels)),
                              hovertemplate="class %{text}<br>%{customdata[1]}<extra></extra>"))

    def weight_colors(rows):
        return _age_marker(weight_ages[rows], oldest) if color_by == "age" else _class_marker(weight_labels[rows])

    real = weight_ages == 0
    if real.any():
        traces.append(scatter(x=projected.weight_xy[real, 0], y=projected.weight_xy[real, 1],
                              name="class weights (real)", mode="markers", customdata=weight_labels[real],
                              text=weight_classes[real],
                              marker=dict(symbol="diamond", size=11, line=dict(color="#222222", width=1.5),
                                          **weight_colors(real)),
                              hovertemplate="class %{text}<br>class weight now<extra></extra>"))
    if (~real).any():
        virtual_ages = weight_ages[~real]
        names = np.array([age_label(int(age), margin, "class weight") for age in virtual_ages], dtype=object)
        traces.append(scatter(x=projected.weight_xy[~real, 0], y=projected.weight_xy[~real, 1],
                              name="class weights (virtual)", mode="markers",
                              customdata=np.stack([weight_labels[~real].astype(object), names], axis=1),
                              text=weight_classes[~real],
                              marker=dict(symbol="diamond", size=9, line=dict(width=0),
                                          opacity=0.8 - 0.55 * (virtual_ages - 1) / max(oldest - 1, 1),
                                          **weight_colors(~real)),
                              hovertemplate="class %{text}<br>%{customdata[1]}<extra></extra>"))

    if len(projected.probe_xy):
        traces.append(_probe_trace(projected, color_by, class_names))

    method = projected.method.upper()
    axis = "PC" if projected.method == "pca" else method
    # equal units (scaleanchor): distances on screen mean the same both ways
    layout = house_layout(f"Embeddings at step {projected.step}, {method}", f"{axis} 1", f"{axis} 2",
                          f"embedding-{projected.method}", height=EMBEDDING_HEIGHT,
                          yaxis=dict(scaleanchor="x", scaleratio=1), meta={"step": int(projected.step)})
    if len(traces) > MAX_LEGEND_ROW_ENTRIES:
        # Dozens of ages (N up to 45) would stack legend rows over the whole plot: list them, scrolling, at the side.
        layout = merged(layout, dict(legend=dict(orientation="v", x=1.02, xanchor="left", y=1.0, yanchor="top"),
                                     margin=dict(r=20)))
    else:
        # Its rows under the plot, as the few-class picture's: above it, two or three rows of them covered the title
        # (the top margin the rows took above holds them below; the plot keeps its height)
        layout = merged(layout, dict(legend=dict(y=-0.2, yanchor="top"), margin=dict(t=45, b=100)))
    return built(traces, layout)
