"""Plotly figures for the app: pure functions from training records or a projected snapshot to a ``go.Figure``.

Records are the dicts of ``metrics.jsonl`` (the Trainer's ``event.record()``): ``{"type": "step", ...}``,
``{"type": "eval", ...}``, ``{"type": "control", ...}``, ``{"type": "status", ...}``. The figures make the paper's
analysis visible while a run trains: loss and test Recall@1 with the warm-up end and each virtual set's arrival
(Fig. 4 / 5b), the class count staircase s(i) (Fig. 3), the mean target cosine (Fig. 5a) and the embedding picture
coloured by age (Fig. 7).

The app redraws every second, so these stay light: columns are pulled out once into numpy arrays, long histories
are thinned to at most ``MAX_PLOTTED_POINTS`` points, traces and layout are plain dicts in plotly's own nested form
(``scatter``; ``title=dict(text=...)``, never plotly's ``title_text`` shorthand), the figure is made of them whole
without plotly's validation (``built``), and nothing here raises on empty input (a figure with a message is returned
instead). tests/app/train/test_figure_validity.py checks every kind of figure against plotly's validators.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import qualitative, sample_colorscale

from demo.common import shims
from demo.train import words
from memvir.analysis.projection import ProjectedSnapshot

MAX_PLOTTED_POINTS = 2000
FIGURE_HEIGHT = 350
EMBEDDING_HEIGHT = 380
MAX_LEGEND_ROW_ENTRIES = 8  # more legend entries than this go in a column at the side instead of rows on top
BASELINE_COLOR = "#a0a0a0"
MAIN_COLOR = "#1f5fa8"
RECALL_COLOR = "#d9480f"
CLASS_PALETTE = qualitative.Dark24
AGE_COLORSCALE = "Viridis"  # dark (current) to light (old)
_AGE_SPAN = 0.85  # the oldest age sits at 85% of the scale: the palest yellow would vanish on white
_AGE_STOPS = go.scatter.Marker(colorscale=AGE_COLORSCALE).colorscale  # the scale's colour stops, as plotly sends them
COLOR_BY = ("age", "class")
# Live-change notes ("N 2 -> 3 at step 429"), 9 px text starting at the note's arrow: each is given the width of its
# characters on a plot area of CONTROL_PLOT_PX (the loss chart's at the narrowest desktop page; wider pages only spread
# them more), and stacked in rows CONTROL_LANE_PX apart so that none overlaps another or is crossed by another's arrow
# (control_lanes). Past CONTROL_LANES rows a note keeps its arrow and gives its words to the hover only.
CONTROL_NOTE_CHARS = 34
CONTROL_CHAR_PX = 5.4
CONTROL_PLOT_PX = 600
CONTROL_LANES = 6
CONTROL_LANE_PX = 14
# The house look: plotly's "plotly_white" for 2-D charts, set directly. Naming the template instead makes plotly copy
# all of it (the defaults of every trace type) into each figure, 6 KB of its JSON; plotly's empty template ("none", as
# it is sent) keeps plotly.js from applying its own.
HOUSE_LAYOUT = dict(template=pio.templates["none"].to_plotly_json(), paper_bgcolor="white", plot_bgcolor="white",
                    font=dict(color="#2a3f5f"), hoverlabel=dict(align="left"))
HOUSE_AXIS = dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="",
                  automargin=True, title=dict(standoff=15))


# ------------------------------------------------------------------------------------------------ shared pieces
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


def step_columns(records: list[dict] | None, *fields: str) -> dict[str, np.ndarray]:
    """Columns of the step records as float arrays (a missing value becomes NaN, a gap in the line)."""
    steps = [record for record in records or () if record.get("type") == "step"]
    columns = {"step": np.array([record["step"] for record in steps], dtype=np.int64)}
    for name in fields:
        columns[name] = np.array([record.get(name, np.nan) for record in steps], dtype=np.float64)
    return columns


def _eval_columns(records: list[dict] | None, metric: str = "recall@1") -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of ``metric`` in the eval records that have it."""
    evals = [record for record in records or () if record.get("type") == "eval" and metric in record]
    return (np.array([record["step"] for record in evals], dtype=np.int64),
            np.array([record[metric] for record in evals], dtype=np.float64))


def thinned(steps: np.ndarray, keep_steps: np.ndarray | None = None) -> np.ndarray:
    """Indices of at most about MAX_PLOTTED_POINTS evenly spread points, plus the last point and every point at a
    step in ``keep_steps`` (the evaluations), so a long run draws fast and its ends and evaluations stay exact."""
    count = len(steps)
    if count <= MAX_PLOTTED_POINTS:
        return np.arange(count)
    chosen = [np.linspace(0, count - 1, MAX_PLOTTED_POINTS).round().astype(np.int64)]
    if keep_steps is not None and len(keep_steps):
        chosen.append(np.flatnonzero(np.isin(steps, keep_steps)))
    return np.unique(np.concatenate(chosen))


def _change_points(values: np.ndarray) -> np.ndarray:
    """Indices where a step function changes value, plus the first and last point: all a "hv" line needs to draw
    the staircase exactly, however long the run."""
    if len(values) == 0:
        return np.arange(0)
    changed = np.flatnonzero(values[1:] != values[:-1]) + 1
    return np.unique(np.concatenate([[0], changed, [len(values) - 1]]))


def warmup_end_step(records: list[dict] | None) -> int | None:
    """The step of the first step record with ``warmup`` False after at least one with ``warmup`` True (a run
    without warm-up has no end of it to mark), or None."""
    seen_warmup = False
    for record in records or ():
        if record.get("type") != "step":
            continue
        if record.get("warmup"):
            seen_warmup = True
        elif seen_warmup:
            return int(record["step"])
    return None


def warmup_marks(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations) marking the end of warm-up: a dashed line and its label; none without one."""
    step = warmup_end_step(records)
    if step is None:
        return [], []
    line = dict(type="line", name="warm-up end", x0=step, x1=step, xref="x", y0=0, y1=1, yref="paper",
                line=dict(color="#555555", width=1, dash="dash"))
    label = dict(name="warm-up end", text="warm-up ends", x=step, xref="x", y=1, yref="paper", xanchor="left",
                 yanchor="top", showarrow=False, font=dict(size=10, color="#555555"))
    return [line], [label]


def baseline_line(steps: np.ndarray, values: np.ndarray, name: str, **more) -> dict:
    """The baseline's line in grey; `more` on top (`merged`: ``line=dict(dash="dash")`` keeps the colour)."""
    return merged(scatter(x=steps, y=values, name=name, mode="lines", line=dict(color=BASELINE_COLOR, width=1.5),
                          hovertemplate=f"{name}<br>step %{{x}}: %{{y:.4g}}<extra></extra>"), more)


def control_note(record: dict) -> tuple[int, str, str]:
    """(the step it applied at, the note, the hover) of a live change's record in the controls' words
    (demo.train.words.plain_control_message): the Trainer's 'memvir_n 2 -> 3: applied at step 429' becomes the note
    'N 2 -> 3 at step 429', drawn at step 429. The record's own step is the last one trained before the change
    (memvir.events.ControlEvent), so the change applies at the next. A long list of changes is cut, never its step."""
    message = words.plain_control_message(str(record.get("message", "")))
    applied = int(record["step"]) + 1
    changes = message.split(": applied")[0]
    where = f" at step {applied:,}"
    room = CONTROL_NOTE_CHARS - len(where)
    if len(changes) > room:
        changes = changes[:room - 1] + "…"
    return applied, changes + where, message


def control_lanes(steps: list[int], texts: list[str], span: int) -> list[int | None]:
    """The row (0 = lowest) of each live-change note, so that no two notes' words overlap and no note's arrow
    crosses another's words. A note's words start at its arrow and are as wide as its characters
    (CONTROL_CHAR_PX a character on CONTROL_PLOT_PX for the `span` of steps); placed from the right, each goes in the
    lowest row above every arrow its words would cover where it clears the words already there. None past
    CONTROL_LANES rows: an arrow, its words on hover."""
    px_per_step = CONTROL_PLOT_PX / max(span, 1)
    placed: list[tuple[float, float, int, float]] = []  # (left, right, row, arrow), in pixels
    lanes: list[int | None] = [None] * len(steps)
    for index in sorted(range(len(steps)), key=lambda i: steps[i], reverse=True):
        arrow = steps[index] * px_per_step
        left, right = arrow - 3, arrow + len(texts[index]) * CONTROL_CHAR_PX + 3  # 3 px of background either side
        lane = max((row + 1 for _, _, row, other in placed if left <= other <= right), default=0)
        while any(row == lane and other_left < right and left < other_right
                  for other_left, other_right, row, _ in placed):
            lane += 1
        if lane < CONTROL_LANES:
            lanes[index] = lane
            placed.append((left, right, lane, arrow))
    return lanes


# ------------------------------------------------------------------------------------------------ curves
def curves_figure(records: list[dict], baseline: list[dict] | None = None) -> go.Figure:
    """Training loss (left axis) and test-class Recall@1 (right axis) against steps (paper Fig. 4 and 5b), with
    the validation classes' Recall@1 dashed when the run holds some out.

    Marks where warm-up ends (dashed line), where each virtual set arrives (a triangle on the loss where
    ``num_virtual_sets`` grows, labelled "k=..."), both at the steps the records say, and live changes (notes at the
    bottom, "N 2 -> 3 at step 429", stacked where they would overlap; the full message on hover).
    ``baseline``, the records of the same configuration with N=0, is drawn in grey behind.
    """
    columns = step_columns(records, "loss", "num_virtual_sets")
    eval_steps, recall = _eval_columns(records)
    if len(columns["step"]) == 0 and len(eval_steps) == 0:
        return empty_figure("No training records yet: press Start to train, or pick a run.")

    traces = []
    if baseline:
        base = step_columns(baseline, "loss")
        base_eval_steps, base_recall = _eval_columns(baseline)
        shown = thinned(base["step"], base_eval_steps)
        traces.append(baseline_line(base["step"][shown], base["loss"][shown], "baseline loss"))
        traces.append(baseline_line(base_eval_steps, base_recall, "baseline R@1", yaxis="y2", mode="lines+markers",
                                    marker=dict(size=5, color=BASELINE_COLOR)))
        base_val_steps, base_val_recall = _eval_columns(baseline, "val_recall@1")
        if len(base_val_steps):
            traces.append(baseline_line(base_val_steps, base_val_recall, "baseline validation R@1", yaxis="y2",
                                        line=dict(dash="dash")))

    steps, loss = columns["step"], columns["loss"]
    shown = thinned(steps, eval_steps)
    traces.append(scatter(x=steps[shown], y=loss[shown], name="loss", mode="lines",
                          line=dict(color=MAIN_COLOR, width=1.5),
                          hovertemplate="step %{x}<br>loss %{y:.4f}<extra></extra>"))
    traces.append(scatter(x=eval_steps, y=recall, name="test R@1", mode="lines+markers", yaxis="y2",
                          line=dict(color=RECALL_COLOR, width=2), marker=dict(size=6, color=RECALL_COLOR),
                          hovertemplate="step %{x}<br>Recall@1 %{y:.2%}<extra></extra>"))
    val_steps, val_recall = _eval_columns(records, "val_recall@1")
    if len(val_steps):  # classes held out of training (--val-classes): the ones to choose settings on
        traces.append(scatter(x=val_steps, y=val_recall, name="validation R@1", mode="lines+markers", yaxis="y2",
                              line=dict(color=RECALL_COLOR, width=2, dash="dash"),
                              marker=dict(size=6, symbol="diamond", color=RECALL_COLOR),
                              hovertemplate="step %{x}<br>validation Recall@1 %{y:.2%}<extra></extra>"))

    # Arrivals are found on the full history: thinning could hide the exact record where k grew.
    virtual_sets = columns["num_virtual_sets"]
    grew = np.flatnonzero(virtual_sets[1:] > virtual_sets[:-1]) + 1
    if len(grew):
        added = (virtual_sets[grew] - virtual_sets[grew - 1]).astype(np.int64)
        now = virtual_sets[grew].astype(np.int64)
        labels = [f"k={k}" + ("" if step_added == 1 else f" (+{step_added})")
                  for k, step_added in zip(now, added, strict=True)]
        traces.append(scatter(x=steps[grew], y=loss[grew], name="virtual set arrives", mode="markers",
                              text=labels, marker=dict(symbol="triangle-up", size=9, color="#2b8a3e"),
                              hovertemplate="step %{x}: %{text}<extra>+ virtual set</extra>"))

    shapes, annotations = warmup_marks(records)
    notes = [control_note(record) for record in records if record.get("type") == "control"]
    span = max([int(record["step"]) for record in records if "step" in record] + [1])
    lanes = control_lanes([step for step, _, _ in notes], [text for _, text, _ in notes], span)
    for (step, text, message), lane in zip(notes, lanes, strict=True):
        annotations.append(dict(name="control", text=text if lane is not None else "", hovertext=message, x=step,
                                xref="x", xanchor="left", y=0, yref="paper", yanchor="bottom", showarrow=True,
                                arrowhead=2, arrowsize=0.8, ax=0,
                                ay=-22 - CONTROL_LANE_PX * (lane if lane is not None else 0),
                                font=dict(size=9, color="#7048e8"), arrowcolor="#7048e8",
                                bgcolor="rgba(255,255,255,0.8)"))

    recall_axis = dict(title=dict(text="Recall@1"), overlaying="y", side="right", range=[0, 1], tickmode="linear",
                       tick0=0, dtick=0.2, tickformat=".0%", showgrid=False)
    return built(traces, house_layout("Training loss and Recall@1", "step", "loss", "curves", yaxis2=recall_axis,
                                      shapes=shapes, annotations=annotations))


# ------------------------------------------------------------------------------------------------ class count
def class_count_figure(records: list[dict], baseline: list[dict] | None = None) -> go.Figure:
    """The number of classes the loss sees, s(i) (paper Fig. 3): C during warm-up, then a staircase that climbs by
    C every M+1 steps until N virtual sets are in use."""
    columns = step_columns(records, "num_classes")
    if len(columns["step"]) == 0:
        return empty_figure("No step records yet: the class count s(i) appears once training starts.")

    traces = []
    if baseline:
        base = step_columns(baseline, "num_classes")
        shown = _change_points(base["num_classes"])
        traces.append(baseline_line(base["step"][shown], base["num_classes"][shown], "baseline s(i)",
                                     line=dict(shape="hv")))
    shown = _change_points(columns["num_classes"])
    traces.append(scatter(x=columns["step"][shown], y=columns["num_classes"][shown], name="classes s(i)",
                          mode="lines", line=dict(shape="hv", color=MAIN_COLOR, width=2),
                          hovertemplate="from step %{x}<br>%{y:d} classes<extra></extra>"))
    shapes, annotations = warmup_marks(records)
    return built(traces, house_layout("Classes in the loss, s(i)", "step", "real + virtual classes", "class-count",
                                      shapes=shapes, annotations=annotations))


# ------------------------------------------------------------------------------------------------ target cosine
def target_cosine_figure(records: list[dict], baseline: list[dict] | None = None) -> go.Figure:
    """The mean cos(x, W_y) between live embeddings and their own class weight (paper Fig. 5a, where it dips a little
    once MemVir starts, the seen classes fitting less tightly)."""
    columns = step_columns(records, "mean_target_cosine")
    if len(columns["step"]) == 0:
        return empty_figure("No step records yet: the mean target cosine appears once training starts.")

    traces = []
    if baseline:
        base = step_columns(baseline, "mean_target_cosine")
        shown = thinned(base["step"])
        traces.append(baseline_line(base["step"][shown], base["mean_target_cosine"][shown], "baseline cos"))
    shown = thinned(columns["step"])
    traces.append(scatter(x=columns["step"][shown], y=columns["mean_target_cosine"][shown],
                          name="mean cos(x, W_y)", mode="lines", line=dict(color=MAIN_COLOR, width=1.5),
                          hovertemplate="step %{x}<br>cos %{y:.4f}<extra></extra>"))
    shapes, annotations = warmup_marks(records)
    return built(traces, house_layout("Mean cos(x, W_y) of seen classes", "step", "mean cos(x, W_y)", "target-cosine",
                                      shapes=shapes, annotations=annotations))


# ------------------------------------------------------------------------------------------------ embeddings
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


def embedding_figure(projected: ProjectedSnapshot | None, color_by: str = "age") -> go.Figure:
    """The embedding picture (paper Fig. 7): batch and memory rows as dots coloured by age (one legend entry per
    age, dark = current) or by class; class weights as diamonds (real ones outlined, virtual ones fading with age);
    the fixed probe set of test-class images as small crosses. Hover shows class and age."""
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by must be one of {', '.join(COLOR_BY)}; got {color_by!r}")
    if projected is None or len(projected.xy) == 0:
        return empty_figure("No snapshot yet — press Start; the embeddings appear at the first snapshot.")

    margin = projected.margin
    ages, labels = np.asarray(projected.ages), np.asarray(projected.labels)
    weight_ages, weight_labels = np.asarray(projected.weight_ages), np.asarray(projected.weight_labels)
    oldest = int(max(ages.max(), weight_ages.max(initial=0)))
    traces = []

    if color_by == "age":
        for age in np.unique(ages):
            rows = ages == age
            name = age_label(int(age), margin)
            traces.append(scatter(x=projected.xy[rows, 0], y=projected.xy[rows, 1], name=name, mode="markers",
                                  customdata=labels[rows], legendgroup=f"age{age}",
                                  marker=dict(size=5, color=age_color(int(age), oldest), opacity=0.75),
                                  hovertemplate=f"class %{{customdata}}<br>{name}<extra></extra>"))
    else:
        row_names = np.array([age_label(int(age), margin) for age in ages], dtype=object)
        traces.append(scatter(x=projected.xy[:, 0], y=projected.xy[:, 1], name="batch + memory rows",
                              mode="markers", customdata=np.stack([labels.astype(object), row_names], axis=1),
                              marker=dict(size=5, opacity=1.0 - 0.6 * ages / max(oldest, 1),
                                          **_class_marker(labels)),
                              hovertemplate="class %{customdata[0]}<br>%{customdata[1]}<extra></extra>"))

    def weight_colors(rows):
        return _age_marker(weight_ages[rows], oldest) if color_by == "age" else _class_marker(weight_labels[rows])

    real = weight_ages == 0
    if real.any():
        traces.append(scatter(x=projected.weight_xy[real, 0], y=projected.weight_xy[real, 1],
                              name="class weights (real)", mode="markers", customdata=weight_labels[real],
                              marker=dict(symbol="diamond", size=11, line=dict(color="#222222", width=1.5),
                                          **weight_colors(real)),
                              hovertemplate="class %{customdata}<br>class weight now<extra></extra>"))
    if (~real).any():
        virtual_ages = weight_ages[~real]
        names = np.array([age_label(int(age), margin, "class weight") for age in virtual_ages], dtype=object)
        traces.append(scatter(x=projected.weight_xy[~real, 0], y=projected.weight_xy[~real, 1],
                              name="class weights (virtual)", mode="markers",
                              customdata=np.stack([weight_labels[~real].astype(object), names], axis=1),
                              marker=dict(symbol="diamond", size=9, line=dict(width=0),
                                          opacity=0.8 - 0.55 * (virtual_ages - 1) / max(oldest - 1, 1),
                                          **weight_colors(~real)),
                              hovertemplate="class %{customdata[0]}<br>%{customdata[1]}<extra></extra>"))

    if len(projected.probe_xy):
        probe_labels = np.asarray(projected.probe_labels)
        probe_colors = dict(color="#888888") if color_by == "age" else _class_marker(probe_labels)
        # meta "pick" and the row last in customdata: a click opens the image's neighbours (demo.train.neighbours)
        traces.append(scatter(x=projected.probe_xy[:, 0], y=projected.probe_xy[:, 1], name="probe (test classes)",
                              mode="markers", customdata=np.column_stack([probe_labels, np.arange(len(probe_labels))]),
                              meta={"pick": "probe"},
                              marker=dict(symbol="x", size=6, line=dict(width=0), **probe_colors),
                              hovertemplate="probe, test class %{customdata[0]}<br>click: its nearest neighbours"
                                            "<extra></extra>"))

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
