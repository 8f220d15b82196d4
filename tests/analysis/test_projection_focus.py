"""The few-class view's projection (memvir.analysis.projection.focus_points, project_focus, layout_focus) against
expectations written out here: which rows a snapshot's few-class view holds, a numpy PCA whose axes are the focus
embeddings', Procrustes on the focus embeddings, and the UMAP layout called with the PCA picture as its start (a
stand-in layout: no real UMAP here)."""

import dataclasses

import numpy as np
import pytest
import torch

from memvir.analysis.projection import FocusPoints, focus_points, layout_focus, project_focus
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


def test_pca_takes_its_axes_from_the_focus_images_and_places_every_point_on_them():
    points = focus_points(focus_snapshot())
    projection = project_focus(points, "pca")
    expected = reference_focus_pca(points)
    np.testing.assert_allclose(projection.embedding_xy, expected[:8], atol=1e-9)
    np.testing.assert_allclose(projection.weight_xy, expected[8:14], atol=1e-9)
    np.testing.assert_allclose(projection.memory_xy, expected[14:], atol=1e-9)
    np.testing.assert_array_equal(projection.weight_ages, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(projection.memory_labels, [1, 2, 2, 2, 1])
    np.testing.assert_array_equal(projection.memory_ages, [1, 1, 2, 2, 2])
    assert (projection.method, projection.step, projection.margin) == ("pca", 30, 10)


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


def test_umap_starts_from_the_pca_picture_and_is_aligned_like_pca():
    points = focus_points(focus_snapshot())
    calls = []

    def layout(array, seed, init):
        calls.append((array, seed, init))
        return init[:, ::-1] * 2.0  # any layout: the axes swapped and stretched

    projection = project_focus(points, "umap", seed=5, layout=layout)
    (array, seed, init), = calls
    np.testing.assert_array_equal(array, points.points)
    np.testing.assert_allclose(init, reference_focus_pca(points), atol=1e-9)
    assert seed == 5 and projection.method == "umap"
    np.testing.assert_allclose(projection.weight_xy, 2.0 * init[8:14, ::-1])


def test_layouts_of_the_wrong_shape_and_snapshots_without_a_few_class_view_are_refused():
    snapshot = focus_snapshot()
    points = focus_points(snapshot)
    with pytest.raises(ValueError, match=r"one 2-D position per point, shape \(19, 2\); got \(3, 2\)"):
        layout_focus(points, np.zeros((3, 2)), "pca")
    with pytest.raises(ValueError, match="unknown projection method 'tsne'"):
        project_focus(points, "tsne")
    with pytest.raises(ValueError, match="no few-class view"):
        focus_points(dataclasses.replace(snapshot, focus_classes=torch.empty(0, dtype=torch.long)))
    with pytest.raises(ValueError, match="focus_labels has 3 entries but snapshot.focus_embeddings has 8 rows"):
        focus_points(dataclasses.replace(snapshot, focus_labels=torch.tensor([1, 1, 2])))
