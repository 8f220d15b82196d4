"""Snapshot projection against references written here: a numpy SVD PCA, a hand-made rotation for Procrustes, and
a fake projector for the UMAP worker (real UMAP only in the opt-in slow test)."""

import dataclasses
import os
import threading

import numpy as np
import pytest
import torch

from demo.umap.worker import UmapWorker
from memvir.analysis.projection import ProjectedSnapshot, procrustes_align, project_snapshot
from memvir.events import SnapshotEvent


def make_snapshot(rows_per_age=(6, 5, 4), num_classes=3, dim=8, probe=6, step=7, margin=10, seed=0):
    """A snapshot with unit-free random vectors; row i has label i so a test can tell which rows were kept."""
    gen = torch.Generator().manual_seed(seed)
    count = sum(rows_per_age)
    num_sets = len(rows_per_age)
    return SnapshotEvent(
        step=step, margin=margin,
        embeddings=torch.randn(count, dim, generator=gen), labels=torch.arange(count),
        ages=torch.cat([torch.full((n,), age) for age, n in enumerate(rows_per_age)]),
        class_weights=3 * torch.randn(num_sets * num_classes, dim, generator=gen),
        class_weight_labels=torch.arange(num_sets * num_classes) % num_classes,
        class_weight_ages=torch.arange(num_sets * num_classes) // num_classes,
        probe_embeddings=torch.randn(probe, dim, generator=gen), probe_labels=torch.arange(probe) // 2,
    )


def reference_pca(snapshot):
    """PCA as a textbook writes it: unit rows, centre, numpy SVD, first two right singular vectors, each signed so
    that its largest-magnitude loading is positive."""
    parts = [snapshot.embeddings.double().numpy(), snapshot.class_weights.double().numpy(),
             snapshot.probe_embeddings.double().numpy()]
    points = np.concatenate([part / np.linalg.norm(part, axis=1, keepdims=True) for part in parts])
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    axes = vt[:2]
    for axis in axes:
        if axis[np.argmax(np.abs(axis))] < 0:
            axis *= -1
    return centred @ axes.T


def rotation(degrees, reflect=False):
    angle = np.deg2rad(degrees)
    matrix = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return matrix @ np.diag([1.0, -1.0]) if reflect else matrix


# ------------------------------------------------------------------------------------------------ PCA
def test_pca_matches_a_numpy_svd_reference_for_all_three_point_sets():
    snapshot = make_snapshot()
    projected = project_snapshot(snapshot, "pca")
    expected = reference_pca(snapshot)
    rows, weights = 15, 9
    np.testing.assert_allclose(projected.xy, expected[:rows], atol=1e-9)
    np.testing.assert_allclose(projected.weight_xy, expected[rows:rows + weights], atol=1e-9)
    np.testing.assert_allclose(projected.probe_xy, expected[rows + weights:], atol=1e-9)


def test_pca_is_deterministic_and_a_tiny_change_does_not_flip_the_picture():
    snapshot = make_snapshot()
    first, again = project_snapshot(snapshot), project_snapshot(snapshot)
    np.testing.assert_array_equal(first.xy, again.xy)
    nudged = dataclasses.replace(snapshot, embeddings=snapshot.embeddings + 1e-5 * torch.randn(
        snapshot.embeddings.shape, generator=torch.Generator().manual_seed(1)))
    np.testing.assert_allclose(project_snapshot(nudged).xy, first.xy, atol=1e-3)


def test_pca_of_one_dimensional_embeddings_pads_the_second_axis_with_zeros():
    snapshot = make_snapshot(rows_per_age=(3,), num_classes=2, dim=1, probe=2)
    projected = project_snapshot(snapshot)
    assert projected.xy.shape == (3, 2)
    np.testing.assert_array_equal(projected.xy[:, 1], 0.0)


def test_labels_ages_step_and_margin_are_carried_through():
    snapshot = make_snapshot(step=42, margin=5)
    projected = project_snapshot(snapshot)
    assert (projected.step, projected.margin, projected.method) == (42, 5, "pca")
    np.testing.assert_array_equal(projected.labels, np.arange(15))
    np.testing.assert_array_equal(projected.ages, [0] * 6 + [1] * 5 + [2] * 4)
    np.testing.assert_array_equal(projected.weight_labels, [0, 1, 2] * 3)
    np.testing.assert_array_equal(projected.weight_ages, [0, 0, 0, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(projected.probe_labels, [0, 0, 1, 1, 2, 2])


# ------------------------------------------------------------------------------------------------ subsampling
def test_subsampling_keeps_every_age_is_seeded_and_keeps_rows_intact():
    snapshot = make_snapshot(rows_per_age=(200, 3, 1, 2), num_classes=2, probe=4)
    projected = project_snapshot(snapshot, max_points=20, seed=3)
    assert len(projected.xy) == 20
    assert set(projected.ages.tolist()) == {0, 1, 2, 3}
    # Row i carries label i, so the kept rows can be checked against the snapshot one by one.
    kept = projected.labels
    assert len(set(kept.tolist())) == 20
    np.testing.assert_array_equal(projected.ages, snapshot.ages.numpy()[kept])
    again = project_snapshot(snapshot, max_points=20, seed=3)
    np.testing.assert_array_equal(again.labels, kept)
    other_seed = project_snapshot(snapshot, max_points=20, seed=4)
    assert set(other_seed.labels.tolist()) != set(kept.tolist())
    # The PCA of the kept rows is the reference PCA of a snapshot holding only those rows.
    only_kept = dataclasses.replace(snapshot, embeddings=snapshot.embeddings[kept], labels=snapshot.labels[kept],
                                    ages=snapshot.ages[kept])
    np.testing.assert_allclose(projected.xy, reference_pca(only_kept)[:20], atol=1e-9)


def test_more_ages_than_max_points_still_keeps_one_row_of_each_age():
    snapshot = make_snapshot(rows_per_age=(4, 4, 4, 4, 4), num_classes=2)
    projected = project_snapshot(snapshot, max_points=3)
    assert sorted(projected.ages.tolist()) == [0, 1, 2, 3, 4]


def test_class_weights_are_subsampled_only_beyond_max_points_and_the_probe_never():
    snapshot = make_snapshot(rows_per_age=(5, 5), num_classes=30, probe=40)
    whole = project_snapshot(snapshot, max_points=60)
    assert len(whole.weight_xy) == 60 and len(whole.probe_xy) == 40
    thinned = project_snapshot(snapshot, max_points=25)
    assert len(thinned.weight_xy) == 25 and len(thinned.probe_xy) == 40
    assert set(thinned.weight_ages.tolist()) == {0, 1}


# ------------------------------------------------------------------------------------------------ Procrustes
@pytest.mark.parametrize("degrees, reflect", [(30.0, False), (-115.0, False), (0.0, True), (70.0, True)])
def test_alignment_recovers_a_known_rotation_or_reflection_of_the_probe_points(degrees, reflect):
    snapshot = make_snapshot()
    plain = project_snapshot(snapshot)
    turn, shift = rotation(degrees, reflect), np.array([0.4, -1.3])
    reference = dataclasses.replace(plain, probe_xy=plain.probe_xy @ turn + shift)
    aligned = project_snapshot(snapshot, reference=reference)
    np.testing.assert_allclose(aligned.probe_xy, reference.probe_xy, atol=1e-9)
    np.testing.assert_allclose(aligned.xy, plain.xy @ turn + shift, atol=1e-9)
    np.testing.assert_allclose(aligned.weight_xy, plain.weight_xy @ turn + shift, atol=1e-9)


def test_procrustes_align_is_a_least_squares_fit_without_scaling():
    gen = np.random.default_rng(0)
    source = gen.normal(size=(12, 2))
    turn = rotation(40.0)
    noisy_target = source @ turn + 2.0 + 0.01 * gen.normal(size=(12, 2))
    moved = procrustes_align(source, source, noisy_target)
    np.testing.assert_allclose(moved, source @ turn + 2.0, atol=0.03)
    # Distances are kept: an orthogonal map with a shift, never a stretch.
    np.testing.assert_allclose(np.linalg.norm(moved[0] - moved[1]), np.linalg.norm(source[0] - source[1]))


def test_a_reference_with_other_probes_or_another_method_is_ignored():
    snapshot = make_snapshot()
    plain = project_snapshot(snapshot)
    turned = dataclasses.replace(plain, probe_xy=plain.probe_xy @ rotation(90.0))
    other_probes = dataclasses.replace(turned, probe_labels=turned.probe_labels + 1)
    np.testing.assert_array_equal(project_snapshot(snapshot, reference=other_probes).xy, plain.xy)
    other_method = dataclasses.replace(turned, method="umap")
    np.testing.assert_array_equal(project_snapshot(snapshot, reference=other_method).xy, plain.xy)


# ------------------------------------------------------------------------------------------------ errors
def test_errors_say_what_was_wrong():
    snapshot = make_snapshot()
    with pytest.raises(ValueError, match="unknown projection method 'tsne'; use one of pca, umap"):
        project_snapshot(snapshot, "tsne")
    empty = dataclasses.replace(snapshot, embeddings=torch.zeros(0, 8), labels=torch.zeros(0, dtype=torch.long),
                                ages=torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="no embeddings to project"):
        project_snapshot(empty)
    with pytest.raises(ValueError, match="max_points must be at least 1; got 0"):
        project_snapshot(snapshot, max_points=0)
    with pytest.raises(ValueError, match="snapshot.ages has 3 entries but snapshot.embeddings has 15 rows"):
        project_snapshot(dataclasses.replace(snapshot, ages=snapshot.ages[:3]))
    with pytest.raises(ValueError, match="must share one dimension; got 8, 8 and 5"):
        project_snapshot(dataclasses.replace(snapshot, probe_embeddings=torch.randn(6, 5)))


# ------------------------------------------------------------------------------------------------ UMAP worker
class FakeProjector:
    """Stands in for UMAP: records each call and its reference, can block until released, fails on request."""

    def __init__(self, fail_steps=()):
        self.calls, self.references = [], []
        self.started, self.release = threading.Event(), threading.Event()
        self.release.set()
        self.fail_steps = set(fail_steps)

    def __call__(self, snapshot, reference):
        self.calls.append(snapshot.step)
        self.references.append(reference)
        self.started.set()
        self.release.wait(timeout=10)
        if snapshot.step in self.fail_steps:
            raise ValueError(f"cannot lay out step {snapshot.step}")
        return project_snapshot(snapshot)


@pytest.fixture
def worker_and_fake():
    fake = FakeProjector(fail_steps={13})
    worker = UmapWorker(project=fake)
    yield worker, fake
    fake.release.set()
    worker.close()


def test_worker_latest_wins_and_results_are_keyed(worker_and_fake):
    worker, fake = worker_and_fake
    fake.release.clear()
    worker.submit("a", make_snapshot(step=1))
    assert fake.started.wait(timeout=10)  # "a" is running and blocked
    worker.submit("b", make_snapshot(step=2))
    worker.submit("c", make_snapshot(step=3))  # replaces the still-queued "b"
    assert worker.pending("a") and worker.pending("c") and not worker.pending("b")
    assert worker.result("a") is None
    fake.release.set()
    assert worker.wait("c", timeout=10)
    assert fake.calls == [1, 3]
    assert worker.result("a").step == 1 and worker.result("c").step == 3
    assert worker.result("b") is None and worker.error("b") is None and not worker.pending("b")


def test_worker_aligns_each_result_to_the_previous_one_and_does_not_repeat_work(worker_and_fake):
    worker, fake = worker_and_fake
    worker.submit("first", make_snapshot(step=1))
    worker.wait("first", timeout=10)
    worker.submit("second", make_snapshot(step=2))
    worker.wait("second", timeout=10)
    assert fake.references[0] is None and fake.references[1] is worker.result("first")
    worker.submit("first", make_snapshot(step=1))  # finished already: nothing is queued
    assert not worker.pending("first")
    assert fake.calls == [1, 2]


def test_worker_keeps_an_error_as_a_message_and_carries_on(worker_and_fake):
    worker, _ = worker_and_fake
    worker.submit("bad", make_snapshot(step=13))
    worker.wait("bad", timeout=10)
    assert worker.result("bad") is None
    assert worker.error("bad") == "ValueError: cannot lay out step 13"
    worker.submit("good", make_snapshot(step=14))
    assert worker.wait("good", timeout=10)
    assert worker.result("good").step == 14 and worker.error("good") is None


def test_worker_keeps_only_the_latest_results():
    worker = UmapWorker(project=FakeProjector(), max_results=2)
    for step in (1, 2, 3):
        worker.submit(step, make_snapshot(step=step))
        worker.wait(step, timeout=10)
    assert worker.result(1) is None and worker.result(2).step == 2 and worker.result(3).step == 3
    worker.close()


def test_a_closed_worker_refuses_new_jobs():
    worker = UmapWorker(project=FakeProjector())
    worker.close()
    with pytest.raises(RuntimeError, match="this UmapWorker is closed; create a new one"):
        worker.submit("late", make_snapshot())


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MEMVIR_SLOW") != "1", reason="real UMAP takes ~20 s; set MEMVIR_SLOW=1")
def test_real_umap_in_the_worker():
    worker = UmapWorker(max_points=100, seed=0)
    worker.submit("real", make_snapshot(rows_per_age=(30, 30), num_classes=5, dim=16, probe=10))
    assert worker.wait("real", timeout=300)
    assert worker.error("real") is None
    projected = worker.result("real")
    assert isinstance(projected, ProjectedSnapshot) and projected.method == "umap"
    assert projected.xy.shape == (60, 2) and projected.weight_xy.shape == projected.probe_xy.shape == (10, 2)
    assert np.isfinite(projected.xy).all()
    worker.close()
