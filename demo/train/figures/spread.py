"""The spread curves: how far the virtual classes have drifted from the live ones, and how the real classes spread
over the sphere, as numbers over steps (memvir.analysis.spread defines them; the Trainer logs them with its step records
at the snapshot cadence). Pure functions of the records, like demo.train.figures.curves.

- `drift_figure`: for each virtual set j in use, the mean cosine between a class's stored weight and its live weight
  (above; 1 means the virtual class is a copy of the real one), and between a stored embedding and its class's live
  weight (below, dotted), beside the live embeddings' own figure.
- `class_spread_figure`: the mean cosine between two real class weights, and their uniformity; the baseline (N = 0)
  in grey, so a visitor sees whether MemVir changes how the real classes use the space.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from demo.train.figures.curves import baseline_line, step_columns, warmup_marks
from demo.train.figures.embeddings import age_color
from demo.train.figures.style import MAIN_COLOR, built, empty_figure, house_layout, merged, scatter

_VIRTUAL_WEIGHT = re.compile(r"virtual_weight_cos_(\d+)$")
LIVE_COLOR = "#222222"
DRIFT_HEIGHT = 470


def virtual_ages(records: list[dict] | None) -> list[int]:
    """The virtual sets j that some step record measured, in order."""
    ages = {int(match.group(1)) for record in records or () if record.get("type") == "step"
            for key in record if (match := _VIRTUAL_WEIGHT.match(key))}
    return sorted(ages)


def _spread_columns(records: list[dict] | None, *fields: str) -> dict[str, np.ndarray]:
    """The step records that carry the spread measures (the snapshot cadence), as columns."""
    return step_columns([record for record in records or () if "weight_mean_cos" in record], *fields)


@functools.cache
def _two_panels() -> dict:
    """The drift figure's two panels, one above the other on a shared step axis, with their titles: plotly's own
    subplot layout, taken once (laying it out costs as much as the rest of the figure)."""
    grid = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                         subplot_titles=("stored class weights · the live ones", "embeddings · their class weight now"))
    grid.update_annotations(font_size=11)  # the panels' titles
    layout = grid.layout.to_plotly_json()
    return {key: layout[key] for key in ("xaxis", "xaxis2", "yaxis", "yaxis2", "annotations")}


def margins_at(records: list[dict] | None, steps: np.ndarray, margin: int) -> np.ndarray:
    """The M each of `steps` was trained with: the run's starting `margin`, then each live change of M from the step
    it applied at (a control record's step is the last trained before it: memvir.events.ControlEvent)."""
    margins = np.full(len(steps), margin, dtype=np.int64)
    for record in records or ():
        if record.get("type") == "control" and "memvir_m" in record:
            margins[steps > int(record["step"])] = int(record["memvir_m"])
    return margins


def drift_figure(records: list[dict], margin: int) -> go.Figure:
    """Cosines of the virtual sets to the live class weights, per set j, over steps, in two panels with their own
    scales: the stored class weights (near 1: copies) above, the stored embeddings with the live ones below.
    `margin` is the M the run started with; set j is named by its age, j(M+1) steps, with the M each point was
    trained with: after a live change of M a set's curve goes on under its new age, and its earlier points keep
    theirs (with M named in the legend, as the same set j is then of two ages)."""
    ages = virtual_ages(records)
    if not ages:
        return empty_figure("No virtual set yet: the first arrives M+1 steps<br>after the warm-up, and its drift "
                            "from the<br>live classes is drawn here.")
    fields = [f"virtual_{kind}_cos_{age}" for age in ages for kind in ("weight", "embedding")]
    columns = _spread_columns(records, "mean_target_cosine", *fields)
    steps = columns["step"]
    margins = margins_at(records, steps, margin)
    # one stretch per run of the same M, in step order: its points, and M
    changed = np.flatnonzero(margins[1:] != margins[:-1]) + 1
    stretches = [(rows, int(margins[rows[0]])) for rows in np.split(np.arange(len(steps)), changed) if len(rows)]
    name_margin = len({m for _, m in stretches}) > 1
    traces = []
    oldest = ages[-1]
    for age in ages:
        color = age_color(age, oldest)
        for rows, stretch_margin in stretches:
            weight = columns[f"virtual_weight_cos_{age}"][rows]
            embedding = columns[f"virtual_embedding_cos_{age}"][rows]
            if np.isnan(weight).all() and np.isnan(embedding).all():
                continue  # set j not in use while this M trained
            ago = f"{age * (stretch_margin + 1):,} steps ago"
            name = f"from {ago}" + (f" (M = {stretch_margin})" if name_margin else "")
            group = f"set{age}-m{stretch_margin}"
            traces.append(scatter(x=steps[rows], y=weight, name=name, mode="lines+markers", marker=dict(size=4),
                                  line=dict(color=color, width=2), legendgroup=group, xaxis="x", yaxis="y",
                                  hovertemplate=f"step %{{x}}<br>class weights from {ago} · the live ones: "
                                                "cos %{y:.4f}<extra></extra>"))
            traces.append(scatter(x=steps[rows], y=embedding, name=name, mode="lines+markers", marker=dict(size=4),
                                  line=dict(color=color, width=2, dash="dot"), legendgroup=group, showlegend=False,
                                  xaxis="x2", yaxis="y2",
                                  hovertemplate=f"step %{{x}}<br>embeddings from {ago} · their class weight now: "
                                                "cos %{y:.3f}<extra></extra>"))
    traces.append(scatter(x=steps, y=columns["mean_target_cosine"], name="now (the live batch)", mode="lines",
                          xaxis="x2", yaxis="y2", line=dict(color=LIVE_COLOR, width=1.5),
                          hovertemplate="step %{x}<br>embeddings now · their class weight now: cos %{y:.3f}"
                                        "<extra></extra>"))
    shapes, annotations = warmup_marks(records)
    panels = _two_panels()
    layout = house_layout("Virtual classes against the live ones (mean cosine)", "", "", "drift", **panels,
                          height=DRIFT_HEIGHT, margin=dict(t=60, b=110),
                          legend=dict(orientation="h", x=0, xanchor="left", y=-0.2, yanchor="top", font=dict(size=10)))
    return built(traces, merged(layout, dict(xaxis2=dict(title=dict(text="step")), shapes=shapes,
                                             annotations=panels["annotations"] + annotations)))


def class_spread_figure(records: list[dict], baseline: list[dict] | None = None) -> go.Figure:
    """The real class weights' mean pairwise cosine (left axis) and uniformity (right axis, dashed) over steps, with
    the baseline's in grey when given."""
    columns = _spread_columns(records, "weight_mean_cos", "weight_uniformity")
    if len(columns["step"]) == 0:
        return empty_figure("No spread measure yet:<br>it is taken at every snapshot step.")
    traces = []
    if baseline:
        base = _spread_columns(baseline, "weight_mean_cos", "weight_uniformity")
        traces.append(baseline_line(base["step"], base["weight_mean_cos"], "baseline mean cos"))
        traces.append(baseline_line(base["step"], base["weight_uniformity"], "baseline uniformity", yaxis="y2",
                                    line=dict(dash="dash")))
    traces.append(scatter(x=columns["step"], y=columns["weight_mean_cos"], name="mean cos between two classes",
                          mode="lines", line=dict(color=MAIN_COLOR, width=2),
                          hovertemplate="step %{x}<br>mean cos between two class weights %{y:.4f}<extra></extra>"))
    traces.append(scatter(x=columns["step"], y=columns["weight_uniformity"], name="uniformity (lower: more even)",
                          mode="lines", yaxis="y2", line=dict(color=MAIN_COLOR, width=1.5, dash="dash"),
                          hovertemplate="step %{x}<br>uniformity %{y:.3f}<extra></extra>"))
    shapes, annotations = warmup_marks(records)
    # the legend under the plot, as in the drift figure beside it: four long entries would cover the title
    return built(traces, house_layout(
        "How the real classes spread", "step", "mean cos between two classes", "class-spread",
        yaxis2=dict(title=dict(text="uniformity"), overlaying="y", side="right", showgrid=False), height=DRIFT_HEIGHT,
        margin=dict(t=50, b=110), legend=dict(orientation="h", x=0, xanchor="left", y=-0.2, yanchor="top",
                                              font=dict(size=10)), shapes=shapes, annotations=annotations))
