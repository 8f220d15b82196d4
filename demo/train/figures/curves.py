"""The curves over steps (pure functions of training records to a ``go.Figure``): loss and test Recall@1 with the
warm-up end, each virtual set's arrival and the live changes (the paper's Fig. 4 / 5b), the class count staircase
s(i) (Fig. 3) and the mean target cosine (Fig. 5a), each with its baseline in grey.

Records are the dicts of ``metrics.jsonl`` (the Trainer's ``event.record()``): ``{"type": "step", ...}``,
``{"type": "eval", ...}``, ``{"type": "control", ...}``, ``{"type": "status", ...}``. Columns are pulled out once into
numpy arrays, long histories are thinned to at most ``MAX_PLOTTED_POINTS`` points, and nothing here raises on empty
input (a figure with a message is returned instead).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from demo.runs import live_changes
from demo.train.figures.style import BASELINE_COLOR, MAIN_COLOR, built, empty_figure, house_layout, merged, scatter

MAX_PLOTTED_POINTS = 2000
RECALL_COLOR = "#d9480f"
# Live-change notes ("N 2 -> 3 at step 429"), 9 px text starting at the note's arrow: each is given the width of its
# characters on a plot area of CONTROL_PLOT_PX (the loss chart's at the narrowest desktop page; wider pages only spread
# them more), and stacked in rows CONTROL_LANE_PX apart so that none overlaps another or is crossed by another's arrow
# (control_lanes). Past CONTROL_LANES rows a note keeps its arrow and gives its words to the hover only.
CONTROL_NOTE_CHARS = 34
CONTROL_CHAR_PX = 5.4
CONTROL_PLOT_PX = 600
CONTROL_LANES = 6
CONTROL_LANE_PX = 14


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
    (demo.runs.live_changes, from the record's fields): 'N 2 -> 3 at step 429', drawn at step 429. The record's own
    step is the last one trained before the change (memvir.events.ControlEvent), so the change applies at the next.
    A long list of changes is cut, never its step."""
    applied, changes, sentence = live_changes.control_words(record)
    where = f" at step {applied:,}"
    room = CONTROL_NOTE_CHARS - len(where)
    if len(changes) > room:
        changes = changes[:room - 1] + "…"
    return applied, changes + where, sentence


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
def curves_figure(records: list[dict], baseline: list[dict] | None = None, reduction: str = "official") -> go.Figure:
    """Training loss (left axis) and test-class Recall@1 (right axis) against steps (paper Fig. 4 and 5b), with
    the validation classes' Recall@1 dashed when the run holds some out.

    The loss is drawn on the baseline's scale: the official reduction's is a mean over all rows, as the baseline's;
    the balanced reduction's is the sum of k+1 set means (docs/method.md, "Reduction"), drawn divided by k+1 (the
    mean of its sets' means), or it would jump k+1-fold as the sets arrive and read as training gone wrong. The chart
    says which in its axis title.

    Marks where warm-up ends (dashed line), where each virtual set arrives (a triangle on the loss where
    ``num_virtual_sets`` grows, labelled "k=..."), both at the steps the records say, and live changes (notes at the
    bottom, "N 2 -> 3 at step 429", stacked where they would overlap; the full message on hover).
    ``baseline``, the records of the same configuration with N=0, is drawn in grey behind.
    """
    columns = step_columns(records, "loss", "num_virtual_sets")
    eval_steps, recall = _eval_columns(records)
    if len(columns["step"]) == 0 and len(eval_steps) == 0:
        return empty_figure("No training records yet: press Start to train, or pick a run in 'Runs on this server'.")

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
    per_set = reduction == "balanced"
    if per_set:
        loss = loss / (columns["num_virtual_sets"] + 1)
    shown = thinned(steps, eval_steps)
    shown_as = "loss ÷ (k+1)" if per_set else "loss"
    traces.append(scatter(x=steps[shown], y=loss[shown], name="loss", mode="lines",
                          line=dict(color=MAIN_COLOR, width=1.5),
                          hovertemplate=f"step %{{x}}<br>{shown_as} %{{y:.4f}}<extra></extra>"))
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
    loss_title = "loss ÷ (k+1): mean of the k+1 set means" if per_set else "loss"
    return built(traces, house_layout("Training loss and Recall@1", "step", loss_title, "curves", yaxis2=recall_axis,
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
