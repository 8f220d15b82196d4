"""The few-class view's projection (memvir.analysis.projection.focus_points, project_focus, layout_focus) against
expectations written out here: which rows a snapshot's few-class view holds, a numpy PCA whose axes are the focus
embeddings', the stored weights around their live weight at their true angle to the stated scale, Procrustes on the
focus embeddings, and the UMAP layout called with the PCA picture as its start and its few-class neighbourhood (a
stand-in layout: no real UMAP here)."""

import dataclasses

import numpy as np
import pytest
import torch

from memvir.analysis.projection import (
    DRIFT_SCALE,
    FOCUS_UMAP_MIN_DIST,
    FocusPoints,
    focus_points,
    layout_focus,
    project_focus,
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
    points = focus_points(snapshot)
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


def reference_focus_pca(points: FocusPoints) -> np.ndarray:
    """The axes of the focus embeddings alone (numpy SVD, centred on their mean, each axis signed so that its
    largest-magnitude loading is positive); every point placed on them."""
    images = points.points[:points.embedding_count]
    mean = images.mean(axis=0)
    _, _, vt = np.linalg.svd(images - mean, full_matrices=False)
    axes = vt[:2]
    for axis in axes:
        if axis[np.argmax(np.abs(axis))] < 0:
            axis *= -1
    return (points.points - mean) @ axes.T


# The rows of focus_snapshot's few-class view that a map lays out: the 8 images, the live weights of classes 1 and 2
# (rows 8 and 9), the 5 stored embeddings (rows 14 to 18); the stored weights (rows 10 to 13) are drawn around them.
MAP_ROWS = [*range(8), 8, 9, *range(14, 19)]


def degrees_between(a, b):
    return np.degrees(np.arccos(np.clip(a @ b, -1, 1)))


def test_pca_takes_its_axes_from_the_focus_images_and_places_the_embeddings_and_live_weights_on_them():
    points = focus_points(focus_snapshot())
    projection = project_focus(points, "pca")
    expected = reference_focus_pca(points)
    np.testing.assert_allclose(projection.embedding_xy, expected[:8], atol=1e-9)
    np.testing.assert_allclose(projection.weight_xy[:2], expected[8:10], atol=1e-9)  # the live weights
    np.testing.assert_allclose(projection.memory_xy, expected[14:], atol=1e-9)
    np.testing.assert_array_equal(projection.weight_ages, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(projection.memory_labels, [1, 2, 2, 2, 1])
    np.testing.assert_array_equal(projection.memory_ages, [1, 1, 2, 2, 2])
    assert (projection.method, projection.step, projection.margin) == ("pca", 30, 10)


def test_each_stored_weight_lies_around_its_live_weight_at_its_true_angle_to_the_stated_scale():
    points = focus_points(focus_snapshot())
    projection = project_focus(points, "pca")
    rows = points.points
    live = {1: rows[8], 2: rows[9]}
    assert projection.drift_scale == DRIFT_SCALE
    for label, first, second in ((1, 10, 12), (2, 11, 13)):  # each class's stored weights of ages 1 and 2
        centre = projection.weight_xy[label - 1]
        offsets = projection.weight_xy[[first - 8, second - 8]] - centre
        angles = [degrees_between(rows[row], live[label]) for row in (first, second)]
        np.testing.assert_allclose(np.linalg.norm(offsets, axis=1), DRIFT_SCALE * np.array(angles), rtol=1e-9)
        np.testing.assert_allclose(projection.weight_angles[[first - 8, second - 8]], angles, rtol=1e-9)
        # two stored weights: the plane holds both, so the angle between them seen from the live weight is the one
        # between their directions away from it on the sphere
        tangents = [rows[row] - (rows[row] @ live[label]) * live[label] for row in (first, second)]
        on_sphere = np.degrees(np.arccos(tangents[0] @ tangents[1] / np.prod(np.linalg.norm(tangents, axis=1))))
        on_screen = np.degrees(np.arccos(offsets[0] @ offsets[1] / np.prod(np.linalg.norm(offsets, axis=1))))
        assert on_screen == pytest.approx(on_sphere, abs=1e-6)
        # turned to point away from the middle of the images
        outward = centre - projection.embedding_xy.mean(axis=0)
        total = offsets.sum(axis=0)
        assert total @ outward / (np.linalg.norm(total) * np.linalg.norm(outward)) == pytest.approx(1.0)
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
    points = focus_points(focus_snapshot())
    plain = project_focus(points, "pca")
    turn, shift = rotation(50.0), np.array([1.0, -2.0])
    reference = dataclasses.replace(plain, embedding_xy=plain.embedding_xy @ turn + shift)
    aligned = project_focus(points, "pca", reference)
    np.testing.assert_allclose(aligned.embedding_xy, reference.embedding_xy, atol=1e-9)
    np.testing.assert_allclose(aligned.weight_xy, plain.weight_xy @ turn + shift, atol=1e-9)
    np.testing.assert_allclose(aligned.memory_xy, plain.memory_xy @ turn + shift, atol=1e-9)
    # other images (the visitor chose other classes) or another method: no alignment
    other_images = dataclasses.replace(reference, embedding_labels=reference.embedding_labels[::-1])
    np.testing.assert_array_equal(project_focus(points, "pca", other_images).embedding_xy, plain.embedding_xy)
    other_method = dataclasses.replace(reference, method="umap")
    np.testing.assert_array_equal(project_focus(points, "pca", other_method).embedding_xy, plain.embedding_xy)


def test_umap_lays_out_the_map_from_the_pca_picture_with_a_wide_neighbourhood_scaled_to_the_pca_picture():
    points = focus_points(focus_snapshot())
    calls = []

    def layout(array, seed, init, **options):
        calls.append((array, seed, init, options))
        return init[:, ::-1] * 2.0  # any layout: the axes swapped and stretched

    projection = project_focus(points, "umap", seed=5, layout=layout)
    (array, seed, init, options), = calls
    np.testing.assert_array_equal(array, points.points[MAP_ROWS])
    pca = reference_focus_pca(points)[MAP_ROWS]
    np.testing.assert_allclose(init, pca, atol=1e-9)
    # 15 points: umap-learn's own 15 neighbours (all 14 others); the few-class view's min_dist
    assert options == {"n_neighbors": 15, "min_dist": FOCUS_UMAP_MIN_DIST}
    assert seed == 5 and projection.method == "umap"
    # the stretch undone: the images span what they span in the PCA picture
    np.testing.assert_allclose(projection.embedding_xy, pca[:8, ::-1], atol=1e-9)
    np.testing.assert_allclose(projection.weight_xy[:2], pca[8:10, ::-1], atol=1e-9)
    np.testing.assert_allclose(projection.memory_xy, pca[10:, ::-1], atol=1e-9)
    # the stored weights at the same distances from their live weight as in the PCA picture
    plain = project_focus(points, "pca")
    distances = [np.linalg.norm(picture.weight_xy[2:] - picture.weight_xy[[0, 1, 0, 1]], axis=1)
                 for picture in (projection, plain)]
    np.testing.assert_allclose(distances[0], distances[1], rtol=1e-9)


def test_a_larger_view_takes_half_its_points_as_neighbours():
    from memvir.analysis.projection import focus_umap_neighbours

    assert [focus_umap_neighbours(count) for count in (15, 30, 31, 120, 301)] == [15, 15, 15, 60, 150]


def test_layouts_of_the_wrong_shape_and_snapshots_without_a_few_class_view_are_refused():
    snapshot = focus_snapshot()
    points = focus_points(snapshot)
    with pytest.raises(ValueError, match=r"one 2-D position per map point .*, shape \(15, 2\); got \(3, 2\)"):
        layout_focus(points, np.zeros((3, 2)), "pca")
    with pytest.raises(ValueError, match="unknown projection method 'tsne'"):
        project_focus(points, "tsne")
    with pytest.raises(ValueError, match="no few-class view"):
        focus_points(dataclasses.replace(snapshot, focus_classes=torch.empty(0, dtype=torch.long)))
    with pytest.raises(ValueError, match="focus_labels has 3 entries but snapshot.focus_embeddings has 8 rows"):
        focus_points(dataclasses.replace(snapshot, focus_labels=torch.tensor([1, 1, 2])))
    # class 2's live weight (row 9) made a stored one: nothing to draw its stored weights around
    without_live = dataclasses.replace(points, ages=np.where(np.arange(19) == 9, 1, points.ages))
    with pytest.raises(ValueError, match=r"needs each class's live weight; classes \[2\] have none"):
        project_focus(without_live, "pca")
