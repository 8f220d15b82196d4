"""The few-class view's projection (memvir.analysis.projection.few_class_points, project_few_classes,
layout_few_classes, zoomed_extent) against expectations written out here: which rows a snapshot's few-class view holds,
a numpy PCA of all its points, a view in one plane whose distances the map keeps, each stored weight in its class's
drift frame at its true angle, Procrustes on the focus embeddings, the UMAP layout called with the PCA picture as its
start and its few-class neighbourhood (a stand-in layout: no real UMAP here), and the extent that frames a map."""

import dataclasses

import numpy as np
import pytest
import torch

from memvir.analysis.projection import (
    FEW_CLASS_UMAP_MIN_DIST,
    ZOOM_MARGIN,
    FewClassPoints,
    few_class_points,
    layout_few_classes,
    project_few_classes,
    zoomed_extent,
)
from memvir.events import SnapshotEvent


def focus_snapshot(step=30, margin=10, seed=0):
    """Three classes, two virtual sets. Rows: 6 live (labels 0,1,2,0,1,2), 3 of set 1 (labels 1,2,0), 3 of set 2
    (labels 2,2,1). Focus classes 1 and 2, with 4 images each (labels 1,1,2,2,... in dataset order)."""
    gen = torch.Generator().manual_seed(seed)
    return SnapshotEvent(
        step=step, margin=margin,
        embeddings=torch.randn(12, 5, generator=gen),
        labels=torch.tensor([0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 2, 1]),
        ages=torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2]),
        class_weights=3 * torch.randn(9, 5, generator=gen),
        class_weight_labels=torch.arange(9) % 3, class_weight_ages=torch.arange(9) // 3,
        probe_embeddings=torch.randn(4, 5, generator=gen), probe_labels=torch.tensor([7, 7, 8, 8]),
        focus_classes=torch.tensor([1, 2]), focus_embeddings=torch.randn(8, 5, generator=gen),
        focus_labels=torch.tensor([1, 1, 1, 1, 2, 2, 2, 2]),
    )


def unit(rows):
    rows = np.asarray(rows, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_few_class_view_holds_the_focus_images_their_weights_of_every_age_and_their_stored_rows():
    snapshot = focus_snapshot()
    points = few_class_points(snapshot)
    # weights of classes 1 and 2 at ages 0, 1, 2 are rows 1, 2, 4, 5, 7, 8; stored rows (age >= 1) of classes 1, 2 are
    # rows 6, 7 (set 1) and 9, 10, 11 (set 2); the live batch (age 0) is left out
    expected = np.concatenate([unit(snapshot.focus_embeddings), unit(snapshot.class_weights[[1, 2, 4, 5, 7, 8]]),
                               unit(snapshot.embeddings[[6, 7, 9, 10, 11]])])
    np.testing.assert_allclose(points.points, expected, atol=1e-12)
    assert (points.embedding_count, points.weight_count) == (8, 6)
    np.testing.assert_array_equal(points.labels, [1, 1, 1, 1, 2, 2, 2, 2] + [1, 2, 1, 2, 1, 2] + [1, 2, 2, 2, 1])
    np.testing.assert_array_equal(points.ages, [0] * 8 + [0, 0, 1, 1, 2, 2] + [1, 1, 2, 2, 2])
    np.testing.assert_array_equal(points.classes, [1, 2])
    assert (points.step, points.margin) == (30, 10)


def reference_focus_pca(points: FewClassPoints) -> np.ndarray:
    """The axes of all the view's points (numpy SVD, centred on their mean, each axis signed so that its
    largest-magnitude loading is positive); every point placed on them."""
    mean = points.points.mean(axis=0)
    _, _, vt = np.linalg.svd(points.points - mean, full_matrices=False)
    axes = vt[:2]
    for axis in axes:
        if axis[np.argmax(np.abs(axis))] < 0:
            axis *= -1
    return (points.points - mean) @ axes.T


def degrees_between(a, b):
    return np.degrees(np.arccos(np.clip(a @ b, -1, 1)))


def test_pca_places_every_point_of_the_view_on_the_axes_of_them_all():
    points = few_class_points(focus_snapshot())
    projection = project_few_classes(points, "pca")
    expected = reference_focus_pca(points)
    np.testing.assert_allclose(projection.embedding_xy, expected[:8], atol=1e-9)
    np.testing.assert_allclose(projection.weight_xy, expected[8:14], atol=1e-9)  # live and stored weights alike
    np.testing.assert_allclose(projection.memory_xy, expected[14:], atol=1e-9)
    np.testing.assert_array_equal(projection.weight_ages, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(projection.memory_labels, [1, 2, 2, 2, 1])
    np.testing.assert_array_equal(projection.memory_ages, [1, 1, 2, 2, 2])
    assert (projection.method, projection.step, projection.margin) == ("pca", 30, 10)


def on_circle(degrees, dim=5):
    """Unit vectors at these angles in the plane of the first two axes of a `dim`-D space."""
    angles = np.radians(np.asarray(degrees, dtype=float))
    rows = np.zeros((len(angles), dim))
    rows[:, 0], rows[:, 1] = np.cos(angles), np.sin(angles)
    return rows


def test_a_view_that_lies_in_one_plane_keeps_every_distance_in_the_pca_map():
    # Two classes. Class 1: images at 0, 10, 20 degrees, live weight at 10, stored weights at 30 (set 1) and 50 (set 2),
    # a stored image at 40. Class 2: images at 180, 190, live weight at 185, stored weight at 205 (set 1). All in one
    # plane through the origin, so the map is that plane itself: every distance on it is the chord 2 sin(angle / 2).
    degrees = [0, 10, 20, 180, 190, 10, 185, 30, 205, 50, 40]
    points = FewClassPoints(step=5, margin=10, classes=np.array([1, 2]), points=on_circle(degrees),
                         labels=np.array([1, 1, 1, 2, 2, 1, 2, 1, 2, 1, 1]),
                         ages=np.array([0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 1]), embedding_count=5, weight_count=5)
    projection = project_few_classes(points, "pca")
    xy = np.concatenate([projection.embedding_xy, projection.weight_xy, projection.memory_xy])
    chords = 2 * np.sin(np.radians(np.abs(np.subtract.outer(degrees, degrees))) / 2)
    np.testing.assert_allclose(np.linalg.norm(xy[:, None] - xy[None], axis=2), chords, atol=1e-9)
    # so class 1's stored weight of set 2 lies 2 sin(20 degrees) from its live weight, in the map as on the sphere
    stored_to_live = np.linalg.norm(projection.weight_xy[4] - projection.weight_xy[0])
    assert stored_to_live == pytest.approx(2 * np.sin(np.radians(20)))
    np.testing.assert_allclose(projection.weight_angles, [0, 0, 20, 20, 40], atol=1e-9)
    np.testing.assert_allclose(projection.memory_angles, [30], atol=1e-9)
    # in its class's drift frame each stored weight lies at its angle from the live one (at the frame's centre), and
    # class 1's two stored weights, on one side of the live weight, point the same way
    np.testing.assert_allclose(np.linalg.norm(projection.weight_drift, axis=1), [0, 0, 20, 20, 40], atol=1e-9)
    np.testing.assert_allclose(projection.weight_drift[4], 2 * projection.weight_drift[2], atol=1e-9)


def test_each_class_weight_lies_in_its_class_drift_frame_at_its_true_angle_from_the_live_one():
    points = few_class_points(focus_snapshot())
    projection = project_few_classes(points, "pca")
    rows = points.points
    live = {1: rows[8], 2: rows[9]}
    np.testing.assert_array_equal(projection.weight_drift[:2], np.zeros((2, 2)))  # the live weights: the centres
    for label, first, second in ((1, 10, 12), (2, 11, 13)):  # each class's stored weights of ages 1 and 2
        offsets = projection.weight_drift[[first - 8, second - 8]]
        angles = [degrees_between(rows[row], live[label]) for row in (first, second)]
        np.testing.assert_allclose(np.linalg.norm(offsets, axis=1), angles, rtol=1e-9)
        np.testing.assert_allclose(projection.weight_angles[[first - 8, second - 8]], angles, rtol=1e-9)
        # two stored weights: the plane holds both, so the angle between them seen from the live weight is the one
        # between their directions away from it on the sphere
        tangents = [rows[row] - (rows[row] @ live[label]) * live[label] for row in (first, second)]
        on_sphere = np.degrees(np.arccos(tangents[0] @ tangents[1] / np.prod(np.linalg.norm(tangents, axis=1))))
        on_screen = np.degrees(np.arccos(offsets[0] @ offsets[1] / np.prod(np.linalg.norm(offsets, axis=1))))
        assert on_screen == pytest.approx(on_sphere, abs=1e-6)
    assert list(projection.weight_angles[:2]) == [0.0, 0.0]
    for row, label in enumerate(points.labels[:8]):
        assert projection.embedding_angles[row] == pytest.approx(degrees_between(rows[row], live[int(label)]))
    for index, row in enumerate(range(14, 19)):
        expected = degrees_between(rows[row], live[int(points.labels[row])])
        assert projection.memory_angles[index] == pytest.approx(expected)


def rotation(degrees):
    angle = np.deg2rad(degrees)
    return np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])


def test_the_next_snapshot_is_turned_onto_the_previous_one_on_the_focus_images():
    points = few_class_points(focus_snapshot())
    plain = project_few_classes(points, "pca")
    turn, shift = rotation(50.0), np.array([1.0, -2.0])
    reference = dataclasses.replace(plain, embedding_xy=plain.embedding_xy @ turn + shift)
    aligned = project_few_classes(points, "pca", reference)
    np.testing.assert_allclose(aligned.embedding_xy, reference.embedding_xy, atol=1e-9)
    np.testing.assert_allclose(aligned.weight_xy, plain.weight_xy @ turn + shift, atol=1e-9)
    np.testing.assert_allclose(aligned.memory_xy, plain.memory_xy @ turn + shift, atol=1e-9)
    # the drift frames are the weights' own, whatever the map's orientation
    np.testing.assert_array_equal(aligned.weight_drift, plain.weight_drift)
    # other images (the visitor chose other classes) or another method: no alignment
    other_images = dataclasses.replace(reference, embedding_labels=reference.embedding_labels[::-1])
    np.testing.assert_array_equal(project_few_classes(points, "pca", other_images).embedding_xy, plain.embedding_xy)
    other_method = dataclasses.replace(reference, method="umap")
    np.testing.assert_array_equal(project_few_classes(points, "pca", other_method).embedding_xy, plain.embedding_xy)


def test_umap_lays_out_every_point_from_the_pca_picture_with_a_wide_neighbourhood_scaled_to_the_pca_picture():
    points = few_class_points(focus_snapshot())
    calls = []

    def layout(array, seed, init, **options):
        calls.append((array, seed, init, options))
        return init[:, ::-1] * 2.0  # any layout: the axes swapped and stretched

    projection = project_few_classes(points, "umap", seed=5, layout=layout)
    (array, seed, init, options), = calls
    np.testing.assert_array_equal(array, points.points)
    pca = reference_focus_pca(points)
    np.testing.assert_allclose(init, pca, atol=1e-9)
    # 19 points: umap-learn's own 15 neighbours; the few-class view's min_dist
    assert options == {"n_neighbors": 15, "min_dist": FEW_CLASS_UMAP_MIN_DIST}
    assert seed == 5 and projection.method == "umap"
    # the stretch undone: the images span what they span in the PCA picture
    np.testing.assert_allclose(projection.embedding_xy, pca[:8, ::-1], atol=1e-9)
    np.testing.assert_allclose(projection.weight_xy, pca[8:14, ::-1], atol=1e-9)
    np.testing.assert_allclose(projection.memory_xy, pca[14:, ::-1], atol=1e-9)
    np.testing.assert_array_equal(projection.weight_drift, project_few_classes(points, "pca").weight_drift)


def test_the_zoomed_extent_holds_every_point_with_the_margin_and_no_more():
    projection = project_few_classes(few_class_points(focus_snapshot()), "pca")
    # a known layout: x from -1 to 3 (the larger span, 4), y from 0 to 2
    projection = dataclasses.replace(projection, embedding_xy=np.array([[-1.0, 0.0]] * 8),
                                     weight_xy=np.array([[3.0, 2.0]] * 6), memory_xy=np.array([[0.5, 1.0]] * 5))
    (x_low, x_high), (y_low, y_high) = zoomed_extent(projection)
    pad = ZOOM_MARGIN * 4  # of the larger span, on every side
    assert (x_low, x_high, y_low, y_high) == pytest.approx((-1 - pad, 3 + pad, 0 - pad, 2 + pad))
    np.testing.assert_allclose(zoomed_extent(projection, margin=0.0), [(-1, 3), (0, 2)])
    # no stored images: the others alone
    bare = dataclasses.replace(projection, memory_xy=np.zeros((0, 2)))
    np.testing.assert_allclose(zoomed_extent(bare, margin=0.25), [(-2, 4), (-1, 3)])


def test_a_larger_view_takes_half_its_points_as_neighbours():
    from memvir.analysis.projection import few_class_umap_neighbours

    assert [few_class_umap_neighbours(count) for count in (15, 30, 31, 120, 301)] == [15, 15, 15, 60, 150]


def test_layouts_of_the_wrong_shape_and_snapshots_without_a_few_class_view_are_refused():
    snapshot = focus_snapshot()
    points = few_class_points(snapshot)
    with pytest.raises(ValueError, match=r"one 2-D position per point .*, shape \(19, 2\); got \(3, 2\)"):
        layout_few_classes(points, np.zeros((3, 2)), "pca")
    with pytest.raises(ValueError, match="unknown projection method 'tsne'"):
        project_few_classes(points, "tsne")
    with pytest.raises(ValueError, match="no few-class view"):
        few_class_points(dataclasses.replace(snapshot, focus_classes=torch.empty(0, dtype=torch.long)))
    with pytest.raises(ValueError, match="focus_labels has 3 entries but snapshot.focus_embeddings has 8 rows"):
        few_class_points(dataclasses.replace(snapshot, focus_labels=torch.tensor([1, 1, 2])))
    # class 2's live weight (row 9) made a stored one: nothing to draw its stored weights around
    without_live = dataclasses.replace(points, ages=np.where(np.arange(19) == 9, 1, points.ages))
    with pytest.raises(ValueError, match=r"needs each class's live weight; classes \[2\] have none"):
        project_few_classes(without_live, "pca")
