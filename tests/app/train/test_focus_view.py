"""The few-class view as the page keeps and draws it: FocusTrack (PCA at once, UMAP when the UMAP process hands it
back, which snapshot it asks for while training or at rest, fixed axes) and few_class_figure (what each trace is,
colours that stay with their class, shades by age, lines from stored to live weights). Expectations written out."""

import dataclasses

import numpy as np
import pytest
import torch

from demo.runs.focus_track import UMAP_LAG, FocusTrack, FocusView
from demo.train.figures.focus import LEGEND_GREY, class_colors, few_class_figure, shade
from memvir.analysis.projection import FocusProjection
from memvir.events import SnapshotEvent


def snapshot(step, classes=(1, 2), seed=None):
    """Three classes, a live batch and one virtual set; the focus classes' four images each."""
    gen = torch.Generator().manual_seed(step if seed is None else seed)
    labels = torch.tensor(sorted(classes * 4))
    return SnapshotEvent(
        step=step, margin=4, embeddings=torch.randn(6, 5, generator=gen), labels=torch.tensor([0, 1, 2, 1, 2, 0]),
        ages=torch.tensor([0, 0, 0, 1, 1, 1]), class_weights=torch.randn(6, 5, generator=gen),
        class_weight_labels=torch.arange(6) % 3, class_weight_ages=torch.arange(6) // 3,
        probe_embeddings=torch.randn(2, 5, generator=gen), probe_labels=torch.tensor([5, 5]),
        focus_classes=torch.tensor(classes), focus_embeddings=torch.randn(len(labels), 5, generator=gen),
        focus_labels=labels)


class Resting:
    def __init__(self, value=False):
        self.value = value

    def __call__(self):
        return self.value


def umap_of(projection: FocusProjection) -> FocusProjection:
    return dataclasses.replace(projection, method="umap")


# ---------------------------------------------------------------------------------------------- the track
def test_snapshots_are_kept_in_pca_and_thinned_as_the_run_thins_its_snapshots():
    track = FocusTrack()
    for step in (10, 20, 30, 40, 50):
        track.add(snapshot(step), history=4)
    # as LiveRun: the fifth overflows 4, every other older one goes, the newest stays
    assert track.steps() == [10, 30, 50]
    view = track.view(None)
    assert (view.projection.method, view.projection.step, view.position, view.count) == ("pca", 50, 3, 3)
    assert [track.view(step).projection.step for step in (5, 10, 29, 30, 99)] == [10, 10, 10, 30, 50]
    assert track.version == 5


def test_a_snapshot_without_a_few_class_view_is_not_kept():
    track = FocusTrack()
    track.add(dataclasses.replace(snapshot(10), focus_classes=torch.empty(0, dtype=torch.long)), history=60)
    assert track.steps() == [] and track.view(None) is None


def test_while_training_only_the_newest_snapshot_is_laid_out_and_one_at_a_time():
    resting = Resting(False)
    track = FocusTrack(resting)
    track.add(snapshot(10), 60)
    step, points, reference = track.next_umap_job()
    assert (step, reference) == (10, None) and points.step == 10
    track.add(snapshot(20), 60)
    assert track.next_umap_job() is None  # step 10 is being laid out
    track.set_umap(10, umap_of(track.view(10).projection))
    track.add(snapshot(30), 60)
    step, _, reference = track.next_umap_job()
    assert step == 30 and reference.step == 10  # 20 is skipped: training comes first
    track.umap_failed(30)
    assert track.next_umap_job() is None  # nothing newer to do while training


def test_at_rest_every_snapshot_is_laid_out_newest_first_each_from_its_nearest_layout():
    resting = Resting(True)
    track = FocusTrack(resting)
    for step in (10, 20, 30):
        track.add(snapshot(step), 60)
    done = []
    while (job := track.next_umap_job()) is not None:
        step, _, reference = job
        done.append((step, None if reference is None else reference.step))
        track.set_umap(step, umap_of(track.view(step).projection))
    assert done == [(30, None), (20, 30), (10, 20)]
    assert [track.view(step, umap=True).projection.method for step in (10, 20, 30)] == ["umap"] * 3
    assert track.view(20).projection.method == "pca"  # the PCA picture stays the PCA picture


def test_following_in_umap_shows_the_newest_layout_unless_it_lags_too_far():
    resting = Resting(False)
    track = FocusTrack(resting)
    track.add(snapshot(10), 60)
    track.set_umap(10, umap_of(track.view(10).projection))
    for step in range(20, 20 + 10 * UMAP_LAG, 10):
        track.add(snapshot(step), 60)
    view = track.view(None, umap=True)
    assert (view.projection.method, view.projection.step, view.newest_step) == ("umap", 10, 10 * UMAP_LAG + 10)
    track.add(snapshot(500), 60)  # one more: the layout is now more than UMAP_LAG snapshots behind
    assert track.view(None, umap=True).projection.method == "pca"
    resting.value = True  # at rest the newest is laid out soon: shown in PCA until then
    assert track.view(None, umap=True).projection.step == 500


def test_the_axes_hold_every_kept_picture_of_the_same_classes_and_method():
    track = FocusTrack()
    track.add(snapshot(10), 60)
    track.add(snapshot(20), 60)
    first, second = track.view(10), track.view(20)
    assert first.x_range == second.x_range and first.y_range == second.y_range
    for view in (first, second):
        projection = view.projection
        points = np.concatenate([projection.embedding_xy, projection.weight_xy, projection.memory_xy])
        assert view.x_range[0] < points[:, 0].min() and points[:, 0].max() < view.x_range[1]
        assert view.y_range[0] < points[:, 1].min() and points[:, 1].max() < view.y_range[1]
    # square: the picture keeps equal units
    assert np.isclose(np.diff(first.x_range), np.diff(first.y_range))
    # other classes chosen: their own axes
    track.add(snapshot(30, classes=(0, 1)), 60)
    assert track.view(30).x_range != track.view(20).x_range


def test_a_umap_layout_is_framed_on_its_own():
    track = FocusTrack(lambda: True)
    for step in (10, 20):
        track.add(snapshot(step), 60)
    for step, stretch in ((10, 40.0), (20, 1.0)):  # an early layout far wider than the later one
        projection = track.view(step).projection
        track.set_umap(step, dataclasses.replace(
            projection, method="umap", embedding_xy=stretch * projection.embedding_xy,
            weight_xy=stretch * projection.weight_xy, memory_xy=stretch * projection.memory_xy))
    wide, narrow = track.view(10, umap=True), track.view(20, umap=True)
    assert np.diff(wide.x_range)[0] > 20 * np.diff(narrow.x_range)[0]
    points = np.concatenate([narrow.projection.embedding_xy, narrow.projection.weight_xy])
    assert narrow.x_range[0] < points[:, 0].min() and points[:, 0].max() < narrow.x_range[1]


# ---------------------------------------------------------------------------------------------- the figure
def hand_view(margin=10):
    """Two classes (3 and 7); images now, live weights, one stored weight per class at ages 1 and 2, stored rows."""
    projection = FocusProjection(
        step=120, margin=margin, method="pca", classes=np.array([7, 3]),
        embedding_xy=np.array([[0.0, 0.0], [0.1, 0.0], [1.0, 1.0]]), embedding_labels=np.array([3, 3, 7]),
        weight_xy=np.array([[0.0, 0.5], [1.0, 1.5], [0.1, 0.6], [1.1, 1.4], [0.2, 0.7], [1.2, 1.3]]),
        weight_labels=np.array([3, 7, 3, 7, 3, 7]), weight_ages=np.array([0, 0, 1, 1, 2, 2]),
        memory_xy=np.array([[0.3, 0.1], [0.9, 0.8], [0.4, 0.2]]), memory_labels=np.array([3, 7, 3]),
        memory_ages=np.array([1, 1, 2]), embedding_angles=np.array([50.0, 55.0, 60.0]),
        weight_angles=np.array([0.0, 0.0, 7.0, 7.5, 14.0, 15.0]), memory_angles=np.array([70.0, 75.0, 80.0]),
        drift_scale=0.02)
    return FocusView(projection, (-1.0, 2.0), (-1.0, 2.0), 3, 5, 120)


def data_traces(figure):
    return {(trace.meta["kind"], trace.meta["age"]): trace for trace in figure.data if trace.meta}


def test_each_kind_and_age_is_one_trace_in_plain_words():
    figure = few_class_figure(hand_view())
    traces = data_traces(figure)
    assert {key: trace.name for key, trace in traces.items()} == {
        ("embeddings", 0): "embeddings now (the classes' training images)",
        ("embeddings", 1): "embeddings from 11 steps ago", ("embeddings", 2): "embeddings from 22 steps ago",
        ("weights", 0): "class weights now", ("weights", 1): "class weights from 11 steps ago",
        ("weights", 2): "class weights from 22 steps ago"}
    np.testing.assert_array_equal(traces["weights", 1].x, [0.1, 1.1])
    np.testing.assert_array_equal(traces["embeddings", 2].y, [0.2])
    # each point's class, its angle to its class's live weight, that angle's cosine (the hover text), its row
    np.testing.assert_allclose(traces["embeddings", 0].customdata,
                               [[3, 50, np.cos(np.radians(50)), 0], [3, 55, np.cos(np.radians(55)), 1],
                                [7, 60, np.cos(np.radians(60)), 2]])
    assert traces["embeddings", 0].meta["pick"] == "focus" and "pick" not in traces["embeddings", 1].meta
    np.testing.assert_allclose(traces["weights", 2].customdata[:, 1], [14.0, 15.0])
    assert "%{customdata[1]:.1f}° from the class weight now" in traces["weights", 1].hovertemplate
    assert "from its class weight now" in traces["embeddings", 1].hovertemplate
    assert "°" not in traces["weights", 0].hovertemplate
    assert traces["weights", 0].marker.symbol == "diamond" and traces["weights", 0].marker.line.width > 0
    assert traces["embeddings", 1].marker.symbol == "circle-open"
    # the legend shows each kind once, in grey; the points wear their classes' colours
    legend = [trace for trace in figure.data if trace.showlegend is not False and not trace.meta
              and trace.mode == "markers"]
    assert len(legend) == 6 and all(trace.x == (None,) for trace in legend)
    assert legend[0].marker.color == LEGEND_GREY
    # listed embeddings first, then weights, each from now back, whatever order they are drawn in
    assert [trace.name for trace in sorted(legend, key=lambda trace: trace.legendrank)] == [
        "embeddings now (the classes' training images)", "embeddings from 11 steps ago",
        "embeddings from 22 steps ago", "class weights now", "class weights from 11 steps ago",
        "class weights from 22 steps ago"]
    assert figure.layout.xaxis.range == (-1.0, 2.0) and figure.layout.yaxis.scaleanchor == "x"
    assert "2 classes at step 120, PCA" in figure.layout.title.text


def test_a_class_keeps_its_colour_and_age_pales_it():
    colors = class_colors([7, 3])
    assert colors == class_colors([3, 7]) and colors[3] != colors[7]  # by the sorted classes, whatever the order
    traces = data_traces(few_class_figure(hand_view()))
    now, older, oldest = (traces["weights", age].marker.color for age in (0, 1, 2))
    assert list(now) == [colors[3], colors[7]]
    assert older[0] == shade(colors[3], 1, 2) and oldest[0] == shade(colors[3], 2, 2)

    def lightness(color):
        values = color[color.index("(") + 1:-1].split(",") if color.startswith("rgb") else None
        rgb = [int(v) for v in values] if values else [int(color[i:i + 2], 16) for i in (1, 3, 5)]
        return sum(rgb)

    assert lightness(colors[3]) < lightness(older[0]) < lightness(oldest[0]) < 3 * 255


def test_a_line_joins_each_stored_weight_to_its_class_s_live_weight():
    lines = [trace for trace in few_class_figure(hand_view()).data if trace.mode == "lines"]
    assert len(lines) == 1
    xs, ys = list(lines[0].x), list(lines[0].y)
    segments = [((xs[i], ys[i]), (xs[i + 1], ys[i + 1])) for i in range(0, len(xs), 3)]
    assert segments == [((0.1, 0.6), (0.0, 0.5)), ((1.1, 1.4), (1.0, 1.5)), ((0.2, 0.7), (0.0, 0.5)),
                        ((1.2, 1.3), (1.0, 1.5))]
    assert xs[2::3] == [None] * 4


def test_a_bar_in_the_corner_states_the_drift_scale():
    figure = few_class_figure(hand_view())
    bar, = figure.layout.shapes
    # 10 degrees at 0.02 map units a degree, 5% of the 3-unit span in from the lower left corner
    assert (bar.type, bar.xref, bar.yref) == ("line", "x", "y")
    assert (bar.x0, bar.x1, bar.y0, bar.y1) == pytest.approx((-0.85, -0.65, -0.85, -0.85))
    words, = figure.layout.annotations
    assert (words.x, words.y, words.xanchor) == (pytest.approx(-0.65), pytest.approx(-0.85), "left")
    assert words.text == "10° (cos 0.985) between a stored and a live weight"
    assert ("stored class weights drawn around their live weight to the bar's scale; the rest as the map places it"
            in figure.layout.title.text)


def test_no_view_gives_a_message():
    figure = few_class_figure(None)
    assert not figure.data and "No few-class snapshot yet" in figure.layout.annotations[0].text


@pytest.mark.parametrize("count", [10, 11])
def test_ten_classes_read_from_ten_colours_more_from_a_longer_palette(count):
    colors = class_colors(range(count))
    assert len(set(colors.values())) == count
