"""The few-class view as the page keeps and draws it: FewClassTrack (PCA at once, UMAP when the UMAP process hands it
back, which snapshot it asks for while training or at rest, axes framed on the points), few_class_figure (what each
trace is, where it is, colours that stay with their class, shades by age, a legend of one entry per kind) and
few_class_drift_figure (a panel per class, each stored weight at its true angle). Expectations written out."""

import dataclasses

import numpy as np
import pytest
import torch

from demo.runs.few_class_track import UMAP_LAG, FewClassTrack, FewClassView
from demo.runs.messages import ClassNames
from demo.train.figures.few_classes import (
    LEGEND_GREY,
    _panel_domains,
    class_colors,
    drift_guide,
    few_class_drift_figure,
    few_class_figure,
    in_view_square,
    shade,
)
from memvir.analysis.projection import FewClassProjection
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


def umap_of(projection: FewClassProjection) -> FewClassProjection:
    return dataclasses.replace(projection, method="umap")


# ---------------------------------------------------------------------------------------------- the track
def test_snapshots_are_kept_in_pca_and_thinned_as_the_run_thins_its_snapshots():
    track = FewClassTrack()
    for step in (10, 20, 30, 40, 50):
        track.add(snapshot(step), history=4)
    # as LiveRun: the fifth overflows 4, every other older one goes, the newest stays
    assert track.steps() == [10, 30, 50]
    view = track.view(None)
    assert (view.projection.method, view.projection.step, view.position, view.count) == ("pca", 50, 3, 3)
    assert [track.view(step).projection.step for step in (5, 10, 29, 30, 99)] == [10, 10, 10, 30, 50]
    assert track.version == 5


def test_a_snapshot_without_a_few_class_view_is_not_kept():
    track = FewClassTrack()
    track.add(dataclasses.replace(snapshot(10), focus_classes=torch.empty(0, dtype=torch.long)), history=60)
    assert track.steps() == [] and track.view(None) is None


def test_while_training_only_the_newest_snapshot_is_laid_out_and_one_at_a_time():
    resting = Resting(False)
    track = FewClassTrack(resting)
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
    track = FewClassTrack(resting)
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
    track = FewClassTrack(resting)
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


def test_each_picture_is_framed_on_its_own_points_with_a_small_margin():
    track = FewClassTrack(lambda: True)
    for step in (10, 20):
        track.add(snapshot(step), 60)
    for step, stretch in ((10, 40.0), (20, 1.0)):  # an early layout far wider than the later one
        projection = track.view(step).projection
        track.set_umap(step, dataclasses.replace(
            projection, method="umap", embedding_xy=stretch * projection.embedding_xy,
            weight_xy=stretch * projection.weight_xy, memory_xy=stretch * projection.memory_xy))
    wide, narrow = track.view(10, umap=True), track.view(20, umap=True)
    assert np.diff(wide.x_range)[0] > 20 * np.diff(narrow.x_range)[0]
    for view in (track.view(10), track.view(20), wide, narrow):
        projection = view.projection
        points = np.concatenate([projection.embedding_xy, projection.weight_xy, projection.memory_xy])
        low, high = points.min(axis=0), points.max(axis=0)
        pad = 0.05 * (high - low).max()  # 5% of the larger span on every side: zoomed to the data
        np.testing.assert_allclose([view.x_range, view.y_range], [(low[0] - pad, high[0] + pad),
                                                                 (low[1] - pad, high[1] + pad)], rtol=1e-9)


# ---------------------------------------------------------------------------------------------- the figures
def test_a_view_s_ranges_become_the_square_from_minus_one_to_one_with_distances_in_proportion():
    projection = dataclasses.replace(hand_view().projection)
    # 4 wide, 1 high: widened to 4 x 4 about (2, 1.5)
    view = FewClassView(projection, (0.0, 4.0), (1.0, 2.0), 1, 1, 120)
    corners = np.array([[0.0, 1.0], [4.0, 2.0], [2.0, 1.5]])
    np.testing.assert_allclose(in_view_square(corners, view), [[-1.0, -0.25], [1.0, 0.25], [0.0, 0.0]])



def hand_view(margin=10):
    """Two classes (3 and 7); images now, live weights, one stored weight per class at ages 1 and 2, stored rows."""
    projection = FewClassProjection(
        step=120, margin=margin, method="pca", classes=np.array([7, 3]),
        embedding_xy=np.array([[0.0, 0.0], [0.1, 0.0], [1.0, 1.0]]), embedding_labels=np.array([3, 3, 7]),
        weight_xy=np.array([[0.0, 0.5], [1.0, 1.5], [0.1, 0.6], [1.1, 1.4], [0.2, 0.7], [1.2, 1.3]]),
        weight_labels=np.array([3, 7, 3, 7, 3, 7]), weight_ages=np.array([0, 0, 1, 1, 2, 2]),
        memory_xy=np.array([[0.3, 0.1], [0.9, 0.8], [0.4, 0.2]]), memory_labels=np.array([3, 7, 3]),
        memory_ages=np.array([1, 1, 2]), embedding_angles=np.array([50.0, 55.0, 60.0]),
        weight_angles=np.array([0.0, 0.0, 7.0, 7.5, 14.0, 15.0]), memory_angles=np.array([70.0, 75.0, 80.0]),
        weight_drift=np.array([[0.0, 0.0], [0.0, 0.0], [7.0, 0.0], [0.0, -7.5], [-14.0, 0.0], [9.0, 12.0]]))
    return FewClassView(projection, (-1.0, 2.0), (-1.0, 2.0), 3, 5, 120)


def data_traces(figure):
    return {(trace.meta["kind"], trace.meta["age"]): trace for trace in figure.data if trace.meta}


def test_the_map_draws_each_kind_and_age_as_one_trace_at_the_map_s_positions():
    figure = few_class_figure(hand_view())
    traces = data_traces(figure)
    assert {key: trace.name for key, trace in traces.items()} == {
        ("embeddings", 0): "image embedded now",
        ("embeddings", 1): "image stored from 11 steps ago", ("embeddings", 2): "image stored from 22 steps ago",
        ("weights", 0): "class weight now", ("weights", 1): "class weight from 11 steps ago",
        ("weights", 2): "class weight from 22 steps ago"}
    # every point where the projection put it, the stored weights too (not around their live weight), in the square
    # from -1 to 1 that the view's ranges (-1 to 2 on both axes: middle 0.5, half-width 1.5) become
    def square(values):
        return (np.array(values) - 0.5) / 1.5

    np.testing.assert_allclose(traces["weights", 0].x, square([0.0, 1.0]))
    np.testing.assert_allclose(traces["weights", 1].x, square([0.1, 1.1]))
    np.testing.assert_allclose(traces["weights", 2].y, square([0.7, 1.3]))
    np.testing.assert_allclose(traces["embeddings", 2].y, square([0.2]))
    np.testing.assert_allclose(traces["embeddings", 0].x, square([0.0, 0.1, 1.0]))
    # each point's class, its angle to its class's live weight, that angle's cosine (the hover text), its row
    np.testing.assert_allclose(traces["embeddings", 0].customdata,
                               [[3, 50, np.cos(np.radians(50)), 0], [3, 55, np.cos(np.radians(55)), 1],
                                [7, 60, np.cos(np.radians(60)), 2]])
    assert traces["embeddings", 0].meta["pick"] == "focus" and "pick" not in traces["embeddings", 1].meta
    np.testing.assert_allclose(traces["weights", 2].customdata[:, 1], [14.0, 15.0])
    assert "%{customdata[1]:.1f}° from its class weight now" in traces["weights", 1].hovertemplate
    assert "from its class weight now" in traces["embeddings", 1].hovertemplate
    assert "°" not in traces["weights", 0].hovertemplate
    assert traces["weights", 0].marker.symbol == "diamond" and traces["weights", 0].marker.line.width > 0
    assert traces["embeddings", 1].marker.symbol == "circle-open"
    # the images are drawn last, over the weights, and their dots are smaller than the diamonds
    assert figure.data[-1] is traces["embeddings", 0]
    assert traces["embeddings", 0].marker.size < traces["weights", 1].marker.size < traces["weights", 0].marker.size
    assert not [trace for trace in figure.data if trace.mode == "lines"]  # no spokes on the map
    # the legend is folded: one grey entry per kind, whatever the number of ages, whose group holds every age
    legend = [trace for trace in figure.data if trace.showlegend is not False and not trace.meta]
    assert [trace.name for trace in sorted(legend, key=lambda trace: trace.legendrank)] == [
        "images now", "stored images (virtual)", "class weights now", "stored class weights (virtual)"]
    assert all(trace.x == (None,) and trace.marker.color == LEGEND_GREY for trace in legend)
    assert {trace.legendgroup for trace in legend} == {trace.legendgroup for trace in traces.values()}
    assert traces["weights", 1].legendgroup == traces["weights", 2].legendgroup != traces["weights", 0].legendgroup
    assert figure.layout.xaxis.range == figure.layout.yaxis.range == (-1, 1)
    assert figure.layout.yaxis.scaleanchor == "x"
    assert "2 classes at step 120, PCA" in figure.layout.title.text
    assert "paler: older (11, 22 steps ago)" in figure.layout.title.text


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


def drift_traces(figure):
    return {(trace.meta["class"], trace.meta["age"]): trace for trace in figure.data if trace.meta}


def test_the_drift_picture_has_one_panel_per_class_with_each_stored_weight_at_its_true_angle():
    figure = few_class_drift_figure(hand_view())
    traces = drift_traces(figure)
    assert set(traces) == {(3, 0), (3, 1), (3, 2), (7, 0), (7, 1), (7, 2)}
    # classes sorted: 3 in the first panel (axes x, y), 7 in the second (x2, y2)
    assert {(trace.xaxis, trace.yaxis) for (label, _), trace in traces.items() if label == 3} == {("x", "y")}
    assert {(trace.xaxis, trace.yaxis) for (label, _), trace in traces.items() if label == 7} == {("x2", "y2")}
    # the live weight in the middle, each stored weight at its drift-frame position: its angle in degrees from it
    assert (traces[3, 0].x, traces[3, 0].y) == ((0.0,), (0.0,))
    assert (traces[3, 1].x, traces[3, 1].y) == ((7.0,), (0.0,))
    assert (traces[7, 2].x, traces[7, 2].y) == ((9.0,), (12.0,))  # 15 degrees: 9, 12
    np.testing.assert_allclose(traces[7, 2].customdata[0, :3], [7, 15, np.cos(np.radians(15))])
    # one scale in every panel, a little beyond the farthest (15 degrees), equal units on both axes
    for suffix in ("", "2"):
        xaxis, yaxis = figure.layout[f"xaxis{suffix}"], figure.layout[f"yaxis{suffix}"]
        assert xaxis.range == yaxis.range == pytest.approx((-15 * 1.15, 15 * 1.15))
        assert yaxis.scaleanchor == f"x{suffix}"
    # spokes from the live weight to each stored one, one trace per panel
    spokes = [trace for trace in figure.data if trace.mode == "lines"]
    assert [(trace.xaxis, list(trace.x), list(trace.y)) for trace in spokes] == [
        ("x", [0.0, 7.0, None, 0.0, -14.0, None], [0.0, 0.0, None, 0.0, 0.0, None]),
        ("x2", [0.0, 0.0, None, 0.0, 9.0, None], [0.0, -7.5, None, 0.0, 12.0, None])]
    # a dotted guide circle of 10 degrees (the round angle within 15) in each panel, the classes named above them
    circles = figure.layout.shapes
    assert [(c.type, c.xref, c.x0, c.x1, c.y0, c.y1) for c in circles] == [
        ("circle", "x", -10, 10, -10, 10), ("circle", "x2", -10, 10, -10, 10)]
    assert [note.text for note in figure.layout.annotations] == ["class 3", "class 7"]
    assert "dotted circle 10° (cos 0.985)" in figure.layout.title.text
    # named classes are titled by their name alone, a long one cut (a phone's panel is about 85 px wide); the hover
    # keeps it whole
    names = ClassNames(train=("a", "b", "c", "Ͻ U+03FD", "d", "e", "f", "Black_footed_Albatross"))
    named = few_class_drift_figure(hand_view(), names)
    assert [note.text for note in named.layout.annotations] == ["Ͻ U+03FD", "Black_foote…"]
    assert {tuple(trace.text) for trace in named.data if trace.mode == "markers"} >= {("Black_footed_Albatross",)}


def test_the_drift_panels_fill_rows_of_four_from_the_top_left():
    domains = _panel_domains(6)
    assert len(domains) == 6
    xs = [x for x, _ in domains]
    ys = [y for _, y in domains]
    assert xs[0][0] == 0 and xs[3][1] == 1 and xs[4] == xs[0]  # the fifth starts the second row
    assert ys[0] == ys[3] and ys[0][1] == 1 and ys[4][0] == 0 and ys[4][1] < ys[0][0]
    assert [drift_guide(angle) for angle in (0.3, 1, 4.9, 15, 200)] == [1, 1, 2, 10, 90]


def test_the_drift_picture_before_the_first_virtual_set_says_so():
    view = hand_view()
    projection = view.projection
    live = slice(0, 2)
    young = dataclasses.replace(
        projection, weight_xy=projection.weight_xy[live], weight_labels=projection.weight_labels[live],
        weight_ages=projection.weight_ages[live], weight_angles=projection.weight_angles[live],
        weight_drift=projection.weight_drift[live])
    figure = few_class_drift_figure(dataclasses.replace(view, projection=young))
    assert not figure.data and "no virtual set yet" in figure.layout.annotations[0].text
    assert "No few-class snapshot yet" in few_class_drift_figure(None).layout.annotations[0].text


def test_no_view_gives_a_message():
    figure = few_class_figure(None)
    assert not figure.data and "No few-class snapshot yet" in figure.layout.annotations[0].text


@pytest.mark.parametrize("count", [10, 11])
def test_ten_classes_read_from_ten_colours_more_from_a_longer_palette(count):
    colors = class_colors(range(count))
    assert len(set(colors.values())) == count
