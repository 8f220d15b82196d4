"""The few-class pictures of a real glyphs-mini run (its preset: N = 3, M = 10, warm-up 1 epoch; sets arrive at steps
21, 32 and 43), read from the plotly figures the page draws. The map places every point as a PCA of them all does:
the distances between class weights on it are in proportion to those a numpy PCA of the snapshot's own tensors gives
(alignment turns the picture and the figure scales it as a whole). The drift picture shows each virtual class's drift
as a length: every stored class weight lies at its true angle in degrees from its class's live weight, so the length
grows with 1 - cos. In UMAP (real umap-learn, in the opt-in slow test) each class's images stay apart from one
another. The expectations come from the snapshots' own tensors, computed here."""

import os

import numpy as np
import pytest
import torch

from demo.runs.few_class_track import FewClassTrack
from demo.train.figures.few_classes import few_class_drift_figure, few_class_figure
from demo.train.presets import PRESETS
from memvir.config import TrainConfig
from memvir.events import SnapshotEvent
from memvir.train.trainer import Trainer

pytestmark = pytest.mark.slow  # a real run of 54 steps

KEPT = 60  # snapshots a LiveRun keeps, as the page's FewClassTrack does


@pytest.fixture(scope="module")
def run():
    """(snapshots by step, the FewClassTrack the page would keep of them)."""
    preset = PRESETS["glyphs-mini"]
    trainer = Trainer(TrainConfig(dataset="glyphs-mini", **{**preset.settings(), "epochs": 6}, snapshot_every=3,
                                  eval_every=0, eval_at_start=False))
    snapshots = {}
    track = FewClassTrack(lambda: True)

    def keep(event):
        if isinstance(event, SnapshotEvent):
            snapshots[event.step] = event
            track.add(event, KEPT)

    trainer.add_listener(keep)
    trainer.run()
    return snapshots, track


def true_cosines(snapshot: SnapshotEvent) -> dict[tuple[int, int], float]:
    """(class, age) -> cos between the class's stored weight of that age and its live weight, from the snapshot."""
    weights = torch.nn.functional.normalize(snapshot.class_weights.double(), dim=1)
    labels, ages = snapshot.class_weight_labels.tolist(), snapshot.class_weight_ages.tolist()
    live = {label: weights[row] for row, (label, age) in enumerate(zip(labels, ages, strict=True)) if age == 0}
    return {(label, age): float(weights[row] @ live[label])
            for row, (label, age) in enumerate(zip(labels, ages, strict=True)) if age > 0}


def drawn_weights(figure) -> dict[tuple[int, int], np.ndarray]:
    """(class, age) -> where the figure draws that class weight, read from its traces' points."""
    drawn = {}
    for trace in figure.data:
        if trace.meta and trace.meta["kind"] == "weights":
            for x, y, data in zip(trace.x, trace.y, trace.customdata, strict=True):
                drawn[int(data[0]), trace.meta["age"]] = np.array([x, y])
    return drawn


def rank_correlation(a, b) -> float:
    """Spearman's rank correlation of two samples without ties."""
    ranks = [np.argsort(np.argsort(values)) for values in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def check_drift_is_drawn_true(figures: dict, snapshots: dict, least_pairs: int) -> dict:
    """The drift figures' (step -> figure) stored weights, at least `least_pairs` of them, against the snapshots'
    cosines; what was measured, for the messages."""
    one_minus_cos, distances, ratios, closest = [], [], [], []
    for step, figure in figures.items():
        drawn = drawn_weights(figure)
        span = figure.layout.xaxis.range[1] - figure.layout.xaxis.range[0]
        for (label, age), cosine in true_cosines(snapshots[step]).items():
            if (label, age) not in drawn:  # not a focus class
                continue
            distance = np.linalg.norm(drawn[label, age] - drawn[label, 0])
            one_minus_cos.append(1 - cosine)
            distances.append(distance)
            ratios.append(distance / np.degrees(np.arccos(min(cosine, 1.0))))
        for label in {label for label, _ in drawn}:
            points = np.array([xy for (other, _), xy in drawn.items() if other == label])
            gaps = np.linalg.norm(points[:, None] - points[None], axis=2)[~np.eye(len(points), dtype=bool)]
            closest.append(gaps.min() / span if len(gaps) else np.inf)
    measured = {"pairs": len(distances), "rank correlation": rank_correlation(distances, one_minus_cos),
                "closest ages / panel span": min(closest), "distance / angle": (min(ratios), max(ratios))}
    assert measured["pairs"] >= least_pairs, measured
    assert measured["rank correlation"] > 0.9, measured
    # lengths true: the distance from the live weight, in the panel's degrees, is the angle
    np.testing.assert_allclose(ratios, 1.0, rtol=1e-6, err_msg=str(measured))
    # no two of a class's weights (its live one and each stored one) on one point: at least 0.5% of a panel apart
    assert measured["closest ages / panel span"] > 0.005, measured
    return measured


def weight_distances_of_a_pca_of_all(snapshot: SnapshotEvent) -> dict[tuple[int, int, int, int], float]:
    """(class, age, class, age) -> the distance between those two class weights in a numpy PCA of every point of
    the snapshot's few-class view (its focus images, their classes' weights, their stored rows), written out here."""
    focus = set(snapshot.focus_classes.tolist())
    normalize = torch.nn.functional.normalize
    weight_rows = [row for row, label in enumerate(snapshot.class_weight_labels.tolist()) if label in focus]
    stored_rows = [row for row, (label, age) in enumerate(zip(snapshot.labels.tolist(), snapshot.ages.tolist(),
                                                              strict=True)) if label in focus and age >= 1]
    points = torch.cat([normalize(snapshot.focus_embeddings.double(), dim=1),
                        normalize(snapshot.class_weights[weight_rows].double(), dim=1),
                        normalize(snapshot.embeddings[stored_rows].double(), dim=1)]).numpy()
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    xy = centred @ vt[:2].T
    weights = xy[len(snapshot.focus_labels):len(snapshot.focus_labels) + len(weight_rows)]
    keys = [(snapshot.class_weight_labels[row].item(), snapshot.class_weight_ages[row].item()) for row in weight_rows]
    return {(*a, *b): float(np.linalg.norm(weights[i] - weights[j])) for i, a in enumerate(keys)
            for j, b in enumerate(keys) if i < j}


def test_the_map_places_every_class_weight_where_a_pca_of_all_the_points_does(run):
    snapshots, track = run
    compared = 0
    for step in [step for step in track.steps() if step in snapshots][-4:]:
        drawn = drawn_weights(few_class_figure(track.view(step)))
        assert {age for _, age in drawn} == {0, 1, 2, 3}
        # the picture scales the map as a whole (into its square): one ratio for every pair
        ratios = [np.linalg.norm(drawn[label, age] - drawn[other, other_age]) / expected for
                  (label, age, other, other_age), expected in weight_distances_of_a_pca_of_all(snapshots[step]).items()]
        np.testing.assert_allclose(ratios, np.median(ratios), rtol=1e-6)
        compared += len(ratios)
    assert compared >= 4 * 496  # 32 weights a snapshot (8 classes, 4 ages): 496 pairs


def test_in_the_drift_picture_each_stored_weight_lies_at_its_true_angle_from_its_live_weight(run):
    snapshots, track = run
    figures = {step: few_class_drift_figure(track.view(step)) for step in track.steps()
               if step in snapshots and snapshots[step].class_weight_ages.max() > 0}
    assert len(figures) >= 10  # from step 21 on, a snapshot every 3 steps
    assert {trace.meta["age"] for trace in figures[max(figures)].data if trace.meta} == {0, 1, 2, 3}
    # 8 classes in 12 snapshots with 1 to 3 stored weights each
    print("drift:", check_drift_is_drawn_true(figures, snapshots, least_pairs=150))


@pytest.mark.skipif(os.environ.get("MEMVIR_SLOW") != "1", reason="real UMAP (numba compiles ~15 s); set MEMVIR_SLOW=1")
def test_in_umap_no_class_collapses_onto_one_point(run):
    from memvir.analysis.projection import few_class_points, project_few_classes

    snapshots, track = run
    steps = [step for step in track.steps() if step >= 24][::3]  # some snapshots with each number of sets
    figures, reference = {}, None
    for step in steps:
        projection = project_few_classes(few_class_points(snapshots[step]), "umap", reference)
        track.set_umap(step, projection)
        reference = projection
        figures[step] = few_class_figure(track.view(step, umap=True))
    assert all(", UMAP<br>" in figure.layout.title.text for figure in figures.values())
    # each class's images spread over the picture, not onto one mark (with umap-learn's 15 neighbours and every point
    # laid out, the smallest class spanned 1.2 to 2.5% of the picture in such a run)
    for step, figure in figures.items():
        span = figure.layout.xaxis.range[1] - figure.layout.xaxis.range[0]
        images, = [trace for trace in figure.data if trace.meta == {"kind": "embeddings", "age": 0, "pick": "focus"}]
        xy, labels = np.column_stack([images.x, images.y]), images.customdata[:, 0]
        extents = [np.ptp(xy[labels == label], axis=0).max() / span for label in np.unique(labels)]
        print(f"UMAP step {step}: smallest class extent / axis span {min(extents):.3f}")
        assert min(extents) > 0.04, (step, extents)
