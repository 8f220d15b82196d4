"""The app's figures built from hand-made records and snapshots; expectations are written out by hand here."""

import numpy as np
import plotly.io as pio
import pytest

from demo.runs.messages import ClassNames
from demo.train.figures.curves import (
    MAX_PLOTTED_POINTS,
    class_count_figure,
    control_lanes,
    curves_figure,
    target_cosine_figure,
)
from demo.train.figures.embeddings import age_label, embedding_figure
from demo.train.figures.style import BASELINE_COLOR, empty_figure, merged
from memvir.analysis.projection import ProjectedSnapshot


def step_record(step, loss=1.0, num_classes=10, k=0, cosine=0.5, warmup=False):
    return {"type": "step", "step": step, "epoch": 0, "loss": loss, "num_classes": num_classes,
            "num_virtual_sets": k, "mean_target_cosine": cosine, "images_per_s": 100.0, "lr": 1e-4,
            "warmup": warmup}


def eval_record(step, recall):
    return {"type": "eval", "step": step, "epoch": 0, "recall@1": recall, "recall@2": recall + 0.1, "map@r": 0.2}


def trace(fig, name):
    matches = [data for data in fig.data if data.name == name]
    assert len(matches) == 1, f"expected one trace named {name!r}, found {[data.name for data in fig.data]}"
    return matches[0]


def annotation_texts(fig):
    return [annotation.text for annotation in fig.layout.annotations]


def assert_house_style(fig, uirevision):
    # plotly_white's look for 2-D charts, set without the template itself, on a transparent background that follows
    # the page's light or dark mode (demo.train.figures.style.HOUSE_LAYOUT says why)
    white = pio.templates["plotly_white"].layout
    assert fig.layout.template == pio.templates["none"]
    assert (fig.layout.paper_bgcolor, fig.layout.plot_bgcolor) == ("rgba(0,0,0,0)", "rgba(0,0,0,0)")
    assert fig.layout.font.color == white.font.color
    for axis, white_axis in ((fig.layout.xaxis, white.xaxis), (fig.layout.yaxis, white.yaxis)):
        assert (axis.gridcolor, axis.linecolor, axis.zerolinecolor) == (
            white_axis.gridcolor, white_axis.linecolor, white_axis.zerolinecolor)
    assert 320 <= fig.layout.height <= 380
    assert fig.layout.uirevision == uirevision
    assert fig.layout.title.text and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


# A small run: warm-up to step 30, then virtual sets arriving (k drops once, after a live change of N).
KS = [0, 0, 0, 0, 1, 1, 2, 2, 4, 3, 3, 4]
RUN = [step_record(10 * (i + 1), loss=2.0 + 0.1 * i, num_classes=10 * (k + 1), k=k, cosine=0.9 - 0.01 * i,
                   warmup=i < 3) for i, k in enumerate(KS)]
RUN += [eval_record(40, 0.31), eval_record(80, 0.42), eval_record(120, 0.47),
        {"type": "control", "step": 95, "message": "N 4 -> 3", "memvir_n": 3},
        {"type": "status", "state": "running", "step": 0, "message": ""}]
BASELINE = [step_record(10 * (i + 1), loss=1.5, num_classes=10) for i in range(12)] + [eval_record(120, 0.4)]


# ------------------------------------------------------------------------------------------------ curves
def test_curves_draw_loss_and_recall_from_the_records():
    fig = curves_figure(RUN)
    loss = trace(fig, "loss")
    np.testing.assert_array_equal(loss.x, [10 * (i + 1) for i in range(12)])
    np.testing.assert_allclose(loss.y, [2.0 + 0.1 * i for i in range(12)])
    recall = trace(fig, "test R@1")
    np.testing.assert_array_equal(recall.x, [40, 80, 120])
    np.testing.assert_allclose(recall.y, [0.31, 0.42, 0.47])
    assert recall.yaxis == "y2" and recall.mode == "lines+markers"
    assert fig.layout.yaxis2.overlaying == "y" and fig.layout.yaxis2.side == "right"
    assert_house_style(fig, "curves")
    assert fig.layout.legend.orientation == "h"


def test_a_balanced_runs_loss_is_drawn_on_the_baselines_scale_and_says_so():
    """The balanced loss sums k+1 set means: drawn as is it jumps k+1-fold as the sets arrive (2.3 to 17-24 on the
    page), beside a baseline at 0.5. Drawn divided by k+1, by hand: record i's loss 2.0 + 0.1 i over KS[i] + 1."""
    fig = curves_figure(RUN, BASELINE, reduction="balanced")
    loss = trace(fig, "loss")
    np.testing.assert_allclose(loss.y, [(2.0 + 0.1 * i) / (k + 1) for i, k in enumerate(KS)])
    assert "loss ÷ (k+1)" in loss.hovertemplate
    arrivals = trace(fig, "virtual set arrives")  # the triangles sit on the curve drawn
    np.testing.assert_allclose(arrivals.y, [(2.0 + 0.1 * i) / (KS[i] + 1) for i in (4, 6, 8, 11)])
    assert fig.layout.yaxis.title.text == "loss ÷ (k+1): mean of the k+1 set means"
    np.testing.assert_allclose(trace(fig, "baseline loss").y, 1.5)  # the baseline's own loss, unchanged
    assert curves_figure(RUN).layout.yaxis.title.text == "loss"  # the official mean needs no division


def test_validation_recall_is_a_dashed_line_only_when_classes_are_held_out():
    assert "validation R@1" not in [data.name for data in curves_figure(RUN).data]
    held_out = [record | {"val_recall@1": value} for record, value in zip(
        [eval_record(40, 0.31), eval_record(80, 0.42), eval_record(120, 0.47)], (0.6, 0.7, 0.75), strict=True)]
    base = BASELINE[:-1] + [BASELINE[-1] | {"val_recall@1": 0.8}]
    fig = curves_figure(RUN[:12] + held_out, baseline=base)
    validation = trace(fig, "validation R@1")
    np.testing.assert_array_equal(validation.x, [40, 80, 120])
    np.testing.assert_allclose(validation.y, [0.6, 0.7, 0.75])
    assert validation.yaxis == "y2" and validation.line.dash == "dash"
    np.testing.assert_allclose(trace(fig, "test R@1").y, [0.31, 0.42, 0.47])  # the test line is unchanged
    base_validation = trace(fig, "baseline validation R@1")
    assert list(base_validation.x) == [120] and list(base_validation.y) == [0.8]
    assert base_validation.line.dash == "dash" and base_validation.yaxis == "y2"


def test_warmup_end_is_a_dashed_line_at_the_first_step_after_warmup():
    fig = curves_figure(RUN)
    lines = [shape for shape in fig.layout.shapes if shape.name == "warm-up end"]
    assert len(lines) == 1
    assert lines[0].x0 == lines[0].x1 == 40 and lines[0].line.dash == "dash"
    assert "warm-up ends" in annotation_texts(fig)


@pytest.mark.parametrize("warmup", [False, True])
def test_no_warmup_line_when_warmup_never_ends_or_never_was(warmup):
    records = [step_record(step, warmup=warmup) for step in (10, 20, 30)]
    assert not [shape for shape in curves_figure(records).layout.shapes if shape.name == "warm-up end"]


def test_one_arrival_marker_per_increase_of_virtual_sets():
    fig = curves_figure(RUN)
    arrivals = trace(fig, "virtual set arrives")
    # KS rises at positions 4 (0->1), 6 (1->2), 8 (2->4) and 11 (3->4): steps 50, 70, 90, 120.
    np.testing.assert_array_equal(arrivals.x, [50, 70, 90, 120])
    np.testing.assert_allclose(arrivals.y, [2.4, 2.6, 2.8, 3.1])
    assert list(arrivals.text) == ["k=1", "k=2", "k=4 (+2)", "k=4"]


def test_no_arrival_trace_without_virtual_sets():
    records = [step_record(step) for step in (10, 20, 30)]
    assert "virtual set arrives" not in [data.name for data in curves_figure(records).data]


def test_control_events_are_small_annotations_at_the_step_they_applied_at():
    fig = curves_figure(RUN)
    notes = [annotation for annotation in fig.layout.annotations if annotation.name == "control"]
    # the record's step, 95, is the last trained before the change: it applies at step 96
    assert [(note.x, note.text) for note in notes] == [(96, "N 4 -> 3 at step 96")]
    long_message = "learning rate 0.0001 -> 0.00005 and margin 10 -> 25 at once: applied at step 21"
    fig = curves_figure(RUN[:3] + [{"type": "control", "step": 20, "message": long_message}])
    note = [annotation for annotation in fig.layout.annotations if annotation.name == "control"][0]
    assert note.text == "learning rate 0.0001 -… at step 21"  # cut to 34 characters, never its step
    assert len(note.text) == 34 and note.hovertext == long_message


def test_live_change_notes_in_the_controls_words_stack_instead_of_printing_over_each_other():
    # span 1,000 steps on 600 px: 0.6 px a step. "N 2 -> 3 at step 101" (20 characters) starts at its arrow and is
    # 108 px wide, plus 3 px either side. Placed from the right: a note goes above every arrow its words cover.
    texts = ["N 2 -> 3 at step 101"] * 6
    # at px 540, 252, 240 (covers 252: above it), 120, 90 (covers 120), 60 (covers 90 and 120)
    assert control_lanes([100, 150, 200, 400, 420, 900], texts, 1000) == [2, 1, 0, 1, 0, 0]
    # each covers the arrow on its right: six rows, then an arrow without words (None)
    assert control_lanes([10, 11, 12, 13, 14, 15, 16], texts + texts[:1], 1000) == [None, 5, 4, 3, 2, 1, 0]
    # the notes' own widths decide: at px 60 and 180, a 20-character note ends at 171, a 31-character one at 230
    assert control_lanes([100, 300], ["M 1 -> 2 at step 9", "N 3 at 5"], 1000) == [0, 0]
    assert control_lanes([100, 300], ["N 3 -> 4, M 10 -> 5 at step 261", "N 3 at 5"], 1000) == [1, 0]
    records = RUN[:4] + [{"type": "control", "step": 35, "message": "memvir_n 2 -> 3: applied at step 36"},
                         {"type": "control", "step": 38, "message": "memvir_m 50 -> 10: applied at step 39"}]
    notes = [note for note in curves_figure(records).layout.annotations if note.name == "control"]
    # in the controls' words, not the settings' names; the first note's words would cover the second's arrow
    assert [(note.text, note.x, note.ay) for note in notes] == [("N 2 -> 3 at step 36", 36, -36),
                                                                 ("M 50 -> 10 at step 39", 39, -22)]
    assert notes[1].hovertext == "M 50 -> 10: applied at step 39" and notes[0].xanchor == "left"


def test_baseline_is_overlaid_in_grey_only_when_given():
    names = [data.name for data in curves_figure(RUN).data]
    assert not [name for name in names if "baseline" in name]
    fig = curves_figure(RUN, baseline=BASELINE)
    base_loss, base_recall = trace(fig, "baseline loss"), trace(fig, "baseline R@1")
    assert base_loss.line.color == BASELINE_COLOR and base_recall.line.color == BASELINE_COLOR
    np.testing.assert_allclose(base_loss.y, [1.5] * 12)
    np.testing.assert_array_equal(base_recall.x, [120])
    assert base_recall.yaxis == "y2"


def test_long_histories_are_thinned_keeping_the_last_point_and_every_evaluation():
    records = [step_record(step, loss=1.0 / step) for step in range(1, 10_001)]
    records += [eval_record(step, 0.5) for step in range(777, 10_001, 777)]
    loss = trace(curves_figure(records), "loss")
    steps = np.asarray(loss.x)
    assert len(steps) <= MAX_PLOTTED_POINTS + 20
    assert steps[0] == 1 and steps[-1] == 10_000
    assert set(range(777, 10_001, 777)) <= set(steps.tolist())
    assert np.all(np.diff(steps) > 0)
    np.testing.assert_allclose(loss.y, [1.0 / step for step in steps])  # each kept point is its own record


# ------------------------------------------------------------------------------------------------ class count
def test_class_count_is_an_hv_staircase_of_the_records_num_classes():
    fig = class_count_figure(RUN)
    staircase = trace(fig, "classes s(i)")
    assert staircase.line.shape == "hv"
    # Evaluate the drawn step function at every record's step: the last drawn point at or before it holds.
    xs, ys = np.asarray(staircase.x), np.asarray(staircase.y)
    for record in RUN:
        if record["type"] == "step":
            assert ys[np.searchsorted(xs, record["step"], side="right") - 1] == record["num_classes"]
    assert xs[-1] == 120  # drawn to the end of the run
    assert_house_style(fig, "class-count")


def test_class_count_draws_only_the_corners():
    records = [step_record(step, num_classes=count) for step, count in
               zip(range(1, 7), [5, 5, 10, 10, 10, 15], strict=True)]
    staircase = trace(class_count_figure(records), "classes s(i)")
    np.testing.assert_array_equal(staircase.x, [1, 3, 6])
    np.testing.assert_array_equal(staircase.y, [5, 10, 15])


def test_class_count_baseline_and_warmup_line():
    fig = class_count_figure(RUN, baseline=BASELINE)
    assert trace(fig, "baseline s(i)").line.color == BASELINE_COLOR
    assert [shape.x0 for shape in fig.layout.shapes if shape.name == "warm-up end"] == [40]


# ------------------------------------------------------------------------------------------------ target cosine
def test_target_cosine_follows_the_records():
    fig = target_cosine_figure(RUN, baseline=BASELINE)
    cosine = trace(fig, "mean cos(x, W_y)")
    np.testing.assert_allclose(cosine.y, [0.9 - 0.01 * i for i in range(12)])
    np.testing.assert_allclose(trace(fig, "baseline cos").y, [0.5] * 12)
    assert_house_style(fig, "target-cosine")


# ------------------------------------------------------------------------------------------------ empty input
@pytest.mark.parametrize("build", [curves_figure, class_count_figure, target_cosine_figure])
@pytest.mark.parametrize("records", [[], [{"type": "status", "state": "running", "step": 0, "message": ""}]])
def test_no_records_give_a_message_figure(build, records):
    fig = build(records)
    assert not fig.data
    assert any("press Start" in text or "once training starts" in text for text in annotation_texts(fig))


def test_empty_figure_shows_the_message():
    fig = empty_figure("Pick a run to see its curves.")
    assert annotation_texts(fig) == ["Pick a run to see its curves."]
    assert not fig.data and fig.layout.xaxis.visible is False


# ------------------------------------------------------------------------------------------------ embeddings
def projected_snapshot(method="pca"):
    """Rows of ages 0 (5 rows), 1 (3) and 2 (2); three classes of weights per age; four probe points."""
    ages = np.array([0, 1, 0, 2, 0, 1, 0, 2, 1, 0])
    return ProjectedSnapshot(
        step=7, margin=10, method=method,
        xy=np.arange(20, dtype=float).reshape(10, 2), labels=np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0]), ages=ages,
        weight_xy=-np.arange(18, dtype=float).reshape(9, 2), weight_labels=np.array([0, 1, 2] * 3),
        weight_ages=np.array([0, 0, 0, 1, 1, 1, 2, 2, 2]),
        probe_xy=np.ones((4, 2)), probe_labels=np.array([5, 5, 6, 6]),
    )


def luminance(rgb):
    red, green, blue = (float(part) for part in rgb[rgb.index("(") + 1:-1].split(","))
    return 0.299 * red + 0.587 * green + 0.114 * blue


def test_embedding_by_age_has_one_trace_per_age_dark_to_light():
    projected = projected_snapshot()
    fig = embedding_figure(projected)
    names = ["embeddings now", "embeddings from 11 steps ago", "embeddings from 22 steps ago"]
    for age, name in enumerate(names):
        rows = projected.ages == age
        data = trace(fig, name)
        np.testing.assert_array_equal(data.x, projected.xy[rows, 0])
        np.testing.assert_array_equal(data.y, projected.xy[rows, 1])
        np.testing.assert_array_equal(data.customdata, projected.labels[rows])
        # hover names the class; with no names known (a run read back from its folder), by its number
        assert list(data.text) == [str(label) for label in projected.labels[rows]]
        assert "class %{text}" in data.hovertemplate and name in data.hovertemplate
    assert [len(trace(fig, name).x) for name in names] == [5, 3, 2]
    shades = [luminance(trace(fig, name).marker.color) for name in names]
    assert shades[0] < shades[1] < shades[2]
    assert "step 7, PCA" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "PC 1"
    assert_house_style(fig, "embedding-pca")


def test_embedding_class_weights_real_outlined_virtual_fading_and_probe_crosses():
    fig = embedding_figure(projected_snapshot())
    real, virtual = trace(fig, "class weights (real)"), trace(fig, "class weights (virtual)")
    assert real.marker.symbol == virtual.marker.symbol == "diamond"
    assert len(real.x) == 3 and real.marker.line.width > 0
    assert len(virtual.x) == 6 and virtual.marker.size < real.marker.size
    np.testing.assert_array_equal(virtual.customdata[:, 1], ["class weight from 11 steps ago"] * 3
                                  + ["class weight from 22 steps ago"] * 3)
    opacity = np.asarray(virtual.marker.opacity)
    assert opacity[0] == opacity[2] > opacity[3] == opacity[5]
    probe = trace(fig, "probe (test classes)")
    assert probe.marker.symbol == "x" and len(probe.x) == 4
    # each cross's class, then its row: what a click on it sends (demo.train.neighbours)
    np.testing.assert_array_equal(probe.customdata, [[5, 0], [5, 1], [6, 2], [6, 3]])
    assert probe.meta == {"pick": "probe"}

    # hover names each class as the neighbours do: a training class's name for weights, a test class's for probes
    names = ClassNames(train=("Ж U+0416", "Ն U+0546", "ア U+30A2"), test=tuple(f"folder {c}" for c in range(7)))
    named = embedding_figure(projected_snapshot(), class_names=names)
    for name in ("class weights (real)", "class weights (virtual)"):
        labels = np.asarray(trace(named, name).customdata).reshape(len(trace(named, name).x), -1)[:, 0]
        assert list(trace(named, name).text) == [names.train[int(label)] for label in labels]
        assert trace(named, name).hovertemplate.startswith("class %{text}<br>")
    assert list(trace(named, "probe (test classes)").text) == ["folder 5", "folder 5", "folder 6", "folder 6"]
    assert trace(named, "probe (test classes)").hovertemplate.startswith("probe, test class %{text}<br>")


def test_embedding_by_class_colours_rows_by_label_and_hovers_class_and_age():
    projected = projected_snapshot(method="umap")
    fig = embedding_figure(projected, color_by="class")
    rows = trace(fig, "batch + memory rows")
    np.testing.assert_array_equal(rows.marker.color, projected.labels)
    np.testing.assert_array_equal(rows.customdata[:, 0], projected.labels)
    assert list(rows.customdata[:, 1]) == [age_label(age, 10) for age in projected.ages]
    assert "step 7, UMAP" in fig.layout.title.text and fig.layout.uirevision == "embedding-umap"


def test_many_ages_move_the_legend_to_the_side():
    ages = np.arange(20)
    projected = ProjectedSnapshot(step=1, margin=0, method="pca", xy=np.zeros((20, 2)), labels=ages, ages=ages,
                                  weight_xy=np.zeros((0, 2)), weight_labels=ages[:0], weight_ages=ages[:0],
                                  probe_xy=np.zeros((0, 2)), probe_labels=ages[:0])
    fig = embedding_figure(projected)
    assert len(fig.data) == 20 and fig.layout.legend.orientation == "v"
    assert embedding_figure(projected_snapshot()).layout.legend.orientation == "h"


def test_age_labels_say_how_many_steps_ago_in_plain_words():
    assert age_label(0, 10) == "embeddings now"
    assert age_label(1, 10) == "embeddings from 11 steps ago"  # virtual set j holds step t - j(M+1)
    assert age_label(3, 100) == "embeddings from 303 steps ago"
    assert age_label(2, 1000, "class weights") == "class weights from 2,002 steps ago"


def test_no_snapshot_gives_a_friendly_message():
    fig = embedding_figure(None)
    assert not fig.data
    assert annotation_texts(fig) == ["No snapshot yet — press Start; the embeddings appear at the first snapshot."]


def test_unknown_colouring_is_refused():
    with pytest.raises(ValueError, match="color_by must be one of age, class; got 'step'"):
        embedding_figure(projected_snapshot(), color_by="step")


def test_layouts_merge_nested_settings_key_by_key_as_plotly_does():
    base = {"height": 350, "margin": {"l": 60, "r": 60, "t": 80}, "legend": {"orientation": "h", "x": 0}}
    more = {"margin": {"r": 20}, "legend": {"orientation": "v"}, "shapes": [{"type": "line"}]}
    assert merged(base, more) == {"height": 350, "margin": {"l": 60, "r": 20, "t": 80},
                                  "legend": {"orientation": "v", "x": 0}, "shapes": [{"type": "line"}]}
    assert base["margin"] == {"l": 60, "r": 60, "t": 80}  # the base is left as it was
