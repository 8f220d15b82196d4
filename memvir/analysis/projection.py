"""Snapshot -> 2-D points: the embedding picture of paper Fig. 7, made live.

A ``SnapshotEvent`` holds three point sets: the batch and memory rows (age 0 = the live batch, age j = the virtual
set from step t - j(M+1)), the class weights (real and virtual), and a fixed probe set of test-class images. All
three are projected *jointly* so they share axes: rows and probe are L2-normalised embeddings and the weights are
normalised the same way, so every point lives on the unit sphere the cosine losses see.

Two methods:
- PCA, exact and fast (a thin SVD of the centred points), with a deterministic sign per component. Given the
  previous projection as ``reference``, the new points are turned onto it by an orthogonal Procrustes fit on the
  probe points (the same images every snapshot), so the picture does not spin or flip while scrubbing.
- UMAP (``umap-learn``, cosine metric), which takes seconds and compiles with numba on first use, so the app runs
  it in the background (another thread, or another process through ``umap_layout``) and never in its own.

The few-class view (``few_class_points``, ``project_few_classes``) takes only the snapshot's focus classes: the current
embeddings of their clean training images, their live class weights, and each virtual set's stored weights and
embeddings of those classes. A few hundred points: cheap enough for UMAP at every snapshot, and few enough classes
that each virtual set shows beside its live class (the paper's Fig. 7; docs/method.md, "What the app shows"). One map
places them all, so that a virtual class sits where it lies among the others; PCA's axes are fitted on all of them,
and the picture is aligned on the focus embeddings, the same images every snapshot. A stored weight differs from its
live one by a few degrees, mostly in directions a map of the whole view leaves out; each class weight's place in its
class's own frame (memvir.analysis.drift_frame), at its true angle from the live weight, comes with the map for a
picture of that drift. ``zoomed_extent`` frames a map on its points.

This module is library code: no gradio, no plotly; ``umap`` is imported only where UMAP runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from memvir.analysis import drift_frame
from memvir.events import SnapshotEvent

METHODS = ("pca", "umap")


@dataclass(frozen=True)
class ProjectedSnapshot:
    """2-D coordinates of one snapshot's three point sets, on shared axes, with what is needed to draw them."""

    step: int
    margin: int  # M, so that age j can be shown as "-j(M+1) steps"
    method: str  # "pca" | "umap"
    xy: np.ndarray  # [n, 2] batch and memory rows (subsampled to max_points)
    labels: np.ndarray  # [n] real class of each row
    ages: np.ndarray  # [n] 0 = live batch, j = virtual set j
    weight_xy: np.ndarray  # [c, 2] class weights, real (age 0) and virtual (age j)
    weight_labels: np.ndarray  # [c]
    weight_ages: np.ndarray  # [c]
    probe_xy: np.ndarray  # [p, 2] the fixed probe set of test-class images
    probe_labels: np.ndarray  # [p]


def subsample_keeping_ages(ages: np.ndarray, max_points: int, seed: int) -> np.ndarray:
    """Sorted indices of at most ``max_points`` rows (more only if there are more distinct ages than that), chosen
    uniformly at random with a fixed seed, with at least one row of every age so no virtual set vanishes."""
    count = len(ages)
    if count <= max_points:
        return np.arange(count)
    order = np.random.default_rng(seed).permutation(count)
    _, first_of_each_age = np.unique(ages[order], return_index=True)
    is_first = np.zeros(count, dtype=bool)
    is_first[first_of_each_age] = True
    # One row per age goes first, then the rest in the same random order: a seeded uniform sample otherwise.
    priority = np.concatenate([order[is_first], order[~is_first]])
    return np.sort(priority[: max(max_points, len(first_of_each_age))])


def pca_2d(points: torch.Tensor, fit_rows: int | None = None) -> np.ndarray:
    """Exact 2-D PCA of [n, D] points: the axes are those of the first ``fit_rows`` rows (all by default), and every
    row is placed on them. Each component's sign is fixed by making its largest-magnitude loading positive, so nearly
    equal inputs give nearly equal pictures, not mirrored ones."""
    points = points.double()
    fit = points[:fit_rows] if fit_rows is not None else points
    mean = fit.mean(dim=0, keepdim=True)
    centred_fit = fit - mean
    # The principal axes are the top eigenvectors of the D x D scatter matrix. In float64 this is as exact as a
    # thin SVD of the n x D data for two components, and several times faster for thousands of points.
    _, eigenvectors = torch.linalg.eigh(centred_fit.T @ centred_fit)  # ascending eigenvalues
    components = eigenvectors[:, -2:].flip(1).T  # [<=2, D], largest variance first
    largest = components.abs().argmax(dim=1)
    signs = torch.sign(components[torch.arange(len(components)), largest])
    coordinates = (points - mean) @ (components * signs[:, None]).T
    if coordinates.shape[1] < 2:  # 1-D embeddings have a single direction: the second axis is all zeros
        coordinates = torch.nn.functional.pad(coordinates, (0, 2 - coordinates.shape[1]))
    return coordinates.numpy()


def umap_layout(points: np.ndarray, seed: int, init: np.ndarray | None = None, n_neighbors: int = 15,
                min_dist: float = 0.1) -> np.ndarray:
    """UMAP of [n, D] points (numpy) to 2-D with the cosine metric, from ``init`` ([n, 2] starting positions, e.g.
    the previous snapshot's) when given; ``n_neighbors`` (at most n - 1 are used) and ``min_dist`` as umap-learn's,
    whose defaults they are. Seconds of work for thousands of points (plus a numba compile the first time in a
    process): call it in the background, as the app's UMAP process does."""
    import umap  # imported here: 2-15 s, and only the background worker needs it

    count = points.shape[0]
    if count < 4:
        raise ValueError(f"UMAP needs at least 4 points to lay out; this snapshot has {count}. Use method='pca'.")
    if init is not None and init.shape != (count, 2):
        raise ValueError(f"init must hold one 2-D position per point, shape ({count}, 2); got {init.shape}")
    # A seed makes UMAP single-threaded anyway; saying n_jobs=1 keeps it from warning about it on every fit.
    reducer = umap.UMAP(n_components=2, random_state=seed, metric="cosine", n_neighbors=min(n_neighbors, count - 1),
                        min_dist=min_dist, n_jobs=1, init="spectral" if init is None else init)
    return np.asarray(reducer.fit_transform(np.asarray(points, dtype=np.float64)), dtype=np.float64)



def procrustes_align(xy: np.ndarray, source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Move ``xy`` by the rotation/reflection and translation that best map ``source`` onto ``target`` (orthogonal
    Procrustes: least squares over orthogonal 2x2 matrices; no scaling, so distances in the picture stay true)."""
    source_mean, target_mean = source.mean(axis=0), target.mean(axis=0)
    u, _, vt = np.linalg.svd((source - source_mean).T @ (target - target_mean))
    rotation = u @ vt
    return (xy - source_mean) @ rotation + target_mean


def _check_snapshot(snapshot: SnapshotEvent) -> None:
    rows = snapshot.embeddings.shape[0]
    if rows == 0:
        raise ValueError("the snapshot has no embeddings to project (0 batch or memory rows); "
                         "take a snapshot after at least one training step")
    pairs = (("labels", snapshot.labels, "embeddings", rows), ("ages", snapshot.ages, "embeddings", rows),
             ("class_weight_labels", snapshot.class_weight_labels, "class_weights", snapshot.class_weights.shape[0]),
             ("class_weight_ages", snapshot.class_weight_ages, "class_weights", snapshot.class_weights.shape[0]),
             ("probe_labels", snapshot.probe_labels, "probe_embeddings", snapshot.probe_embeddings.shape[0]))
    for name, values, owner, expected in pairs:
        if values.shape[0] != expected:
            raise ValueError(f"snapshot.{name} has {values.shape[0]} entries but snapshot.{owner} has {expected} "
                             "rows; they must match one to one")
    dims = {snapshot.embeddings.shape[1], snapshot.class_weights.shape[1], snapshot.probe_embeddings.shape[1]}
    if len(dims) != 1:
        raise ValueError(f"snapshot embeddings, class weights and probe embeddings must share one dimension; "
                         f"got {snapshot.embeddings.shape[1]}, {snapshot.class_weights.shape[1]} and "
                         f"{snapshot.probe_embeddings.shape[1]}")


def _probes_correspond(reference: ProjectedSnapshot, probe_labels: np.ndarray) -> bool:
    """Procrustes needs the same probe images in the same order; equal labels in order is the check we can make."""
    return len(reference.probe_labels) == len(probe_labels) >= 2 and np.array_equal(reference.probe_labels,
                                                                                    probe_labels)


def project_snapshot(snapshot: SnapshotEvent, method: str = "pca", max_points: int = 3000, seed: int = 0,
                     reference: ProjectedSnapshot | None = None,
                     layout: Callable[[np.ndarray, int, np.ndarray | None], np.ndarray] | None = None,
                     ) -> ProjectedSnapshot:
    """Project a snapshot's rows, class weights and probe set jointly to 2-D.

    Rows are subsampled (seeded, every age kept) to ``max_points``; class weights too when there are more than
    ``max_points``; the probe set is kept whole. With ``reference`` (the previous projection, same method) the
    result is aligned to it on the probe points; a reference whose probe set differs (another run) is ignored.
    ``layout(points, seed, init)`` replaces ``umap_layout`` for method "umap" (the app runs it in another process).
    """
    if method not in METHODS:
        raise ValueError(f"unknown projection method {method!r}; use one of {', '.join(METHODS)}")
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1; got {max_points}")
    _check_snapshot(snapshot)

    ages = snapshot.ages.numpy()
    rows = subsample_keeping_ages(ages, max_points, seed)
    weight_ages = snapshot.class_weight_ages.numpy()
    weight_rows = subsample_keeping_ages(weight_ages, max_points, seed)
    probe_labels = snapshot.probe_labels.numpy()

    normalize = torch.nn.functional.normalize
    parts = [snapshot.embeddings[torch.from_numpy(rows)], snapshot.class_weights[torch.from_numpy(weight_rows)],
             snapshot.probe_embeddings]
    points = torch.cat([normalize(part.double(), dim=1) for part in parts])
    xy = pca_2d(points) if method == "pca" else (layout or umap_layout)(points.numpy(), seed, None)

    row_end, weight_end = len(rows), len(rows) + len(weight_rows)
    if reference is not None and reference.method == method and _probes_correspond(reference, probe_labels):
        xy = procrustes_align(xy, xy[weight_end:], reference.probe_xy)
    return ProjectedSnapshot(
        step=snapshot.step, margin=snapshot.margin, method=method,
        xy=xy[:row_end], labels=snapshot.labels.numpy()[rows], ages=ages[rows],
        weight_xy=xy[row_end:weight_end], weight_labels=snapshot.class_weight_labels.numpy()[weight_rows],
        weight_ages=weight_ages[weight_rows],
        probe_xy=xy[weight_end:], probe_labels=probe_labels,
    )


# ------------------------------------------------------------------------------------------------ the few-class view
@dataclass(frozen=True)
class FewClassPoints:
    """The few-class view's points of one snapshot as unit rows of one array, in three runs: the current embeddings of
    the focus classes' clean training images (``embedding_count`` rows), their class weights (``weight_count`` rows:
    age 0 the live weight, age j the weight stored j(M+1) steps ago), then the stored embeddings of those classes in
    the virtual sets (age j >= 1). Numpy only, so that another process can lay them out."""

    step: int
    margin: int
    classes: np.ndarray  # [f] the focus classes, in the snapshot's order
    points: np.ndarray  # [n, D] float64, unit rows
    labels: np.ndarray  # [n] class of each point
    ages: np.ndarray  # [n] 0 = now, j = virtual set j
    embedding_count: int
    weight_count: int


# UMAP of the few-class view: a few hundred points of a few classes. With umap-learn's 15 neighbours, each point's
# neighbourhood holds only its own class, every class is a component of its own, and UMAP packs each into a speck far
# from the others (one mark per class in the picture). With half the points as neighbours, neighbourhoods reach other
# classes, so the layout keeps where the classes lie beside one another; the largest min_dist below umap-learn's
# spread (1) keeps a class's own points from piling onto one another.
FEW_CLASS_UMAP_MIN_DIST = 0.99
# The view of a map: the points' extent and this share of it on each side, so that the marks at the edge stay whole.
ZOOM_MARGIN = 0.05


def few_class_umap_neighbours(count: int) -> int:
    """The few-class UMAP's neighbourhood size for ``count`` points: half of them, at least umap-learn's 15."""
    return max(15, count // 2)


@dataclass(frozen=True)
class FewClassProjection:
    """2-D coordinates of a snapshot's few-class view: every point where one map (PCA or UMAP of all of them together)
    put it, so that a virtual class lies where the map places its stored weight and embeddings. Beside them, each
    point's angle to its class's live weight, and each class weight in its class's drift frame
    (memvir.analysis.drift_frame), where a stored weight lies at its true angle from the live one: a map of the whole
    view shortens those few degrees to almost nothing."""

    step: int
    margin: int  # M, so that age j can be shown as "j(M+1) steps ago"
    method: str  # "pca" | "umap"
    classes: np.ndarray  # [f]
    embedding_xy: np.ndarray  # [q, 2] current embeddings of the focus classes' training images (same images each time)
    embedding_labels: np.ndarray  # [q]
    weight_xy: np.ndarray  # [w, 2] their class weights: live (age 0) and virtual (age j)
    weight_labels: np.ndarray  # [w]
    weight_ages: np.ndarray  # [w]
    memory_xy: np.ndarray  # [m, 2] their embeddings stored in the virtual sets (age j >= 1)
    memory_labels: np.ndarray  # [m]
    memory_ages: np.ndarray  # [m]
    # degrees on the sphere between each point and its class's live weight (0 for the live weights themselves)
    embedding_angles: np.ndarray  # [q]
    weight_angles: np.ndarray  # [w]
    memory_angles: np.ndarray  # [m]
    # [w, 2] degrees: each class weight in its class's drift frame, centred on the live weight (whose row is 0, 0)
    weight_drift: np.ndarray | None = None


def few_class_points(snapshot: SnapshotEvent) -> FewClassPoints:
    """The few-class view's points of ``snapshot``: its focus embeddings, and the rows of its class weights and of its
    stored embeddings (age >= 1; the live batch is left out, the focus embeddings show the classes now) whose label is
    a focus class. ValueError when the snapshot has no focus classes or no focus embeddings."""
    _check_snapshot(snapshot)
    classes = snapshot.focus_classes.numpy()
    if len(classes) == 0 or snapshot.focus_embeddings.shape[0] == 0:
        raise ValueError("the snapshot has no few-class view (no focus classes, or none of their images)")
    if snapshot.focus_labels.shape[0] != snapshot.focus_embeddings.shape[0]:
        raise ValueError(f"snapshot.focus_labels has {snapshot.focus_labels.shape[0]} entries but "
                         f"snapshot.focus_embeddings has {snapshot.focus_embeddings.shape[0]} rows; they must match")
    if snapshot.focus_embeddings.shape[1] != snapshot.class_weights.shape[1]:
        raise ValueError(f"snapshot focus embeddings have dimension {snapshot.focus_embeddings.shape[1]}, the class "
                         f"weights {snapshot.class_weights.shape[1]}; they must share one")
    weight_rows = np.flatnonzero(np.isin(snapshot.class_weight_labels.numpy(), classes))
    memory_rows = np.flatnonzero(np.isin(snapshot.labels.numpy(), classes) & (snapshot.ages.numpy() >= 1))
    normalize = torch.nn.functional.normalize
    parts = [snapshot.focus_embeddings, snapshot.class_weights[torch.from_numpy(weight_rows)],
             snapshot.embeddings[torch.from_numpy(memory_rows)]]
    points = torch.cat([normalize(part.double(), dim=1) for part in parts]).numpy()
    focus_labels = snapshot.focus_labels.numpy()
    return FewClassPoints(
        step=snapshot.step, margin=snapshot.margin, classes=classes, points=points,
        labels=np.concatenate([focus_labels, snapshot.class_weight_labels.numpy()[weight_rows],
                               snapshot.labels.numpy()[memory_rows]]),
        ages=np.concatenate([np.zeros(len(focus_labels), dtype=np.int64),
                             snapshot.class_weight_ages.numpy()[weight_rows], snapshot.ages.numpy()[memory_rows]]),
        embedding_count=len(focus_labels), weight_count=len(weight_rows),
    )


def _embeddings_correspond(reference: FewClassProjection, points: FewClassPoints) -> bool:
    """Alignment needs the same images in the same order: the same focus classes give them (the trainer embeds a
    class's training images in dataset order), and equal labels in order is the check we can make."""
    labels = points.labels[:points.embedding_count]
    return len(reference.embedding_labels) == len(labels) >= 2 and np.array_equal(reference.embedding_labels, labels)


def layout_few_classes(points: FewClassPoints, xy: np.ndarray, method: str,
                 reference: FewClassProjection | None = None) -> FewClassProjection:
    """The projection of ``points`` that a map laid out at ``xy`` ([n, 2], one position per point), turned onto
    ``reference`` (the previous projection, same method) by an orthogonal Procrustes fit on the focus embeddings when
    they are the same images; with each point's angle to its class's live weight and each class weight's place in
    its class's drift frame (memvir.analysis.drift_frame). ValueError for a focus class without its live weight."""
    if method not in METHODS:
        raise ValueError(f"unknown projection method {method!r}; use one of {', '.join(METHODS)}")
    if xy.shape != (len(points.points), 2):
        raise ValueError(f"the layout must hold one 2-D position per point of the few-class view, shape "
                         f"({len(points.points)}, 2); got {xy.shape}")
    end_embeddings = points.embedding_count
    end_weights = end_embeddings + points.weight_count
    if reference is not None and reference.method == method and _embeddings_correspond(reference, points):
        xy = procrustes_align(xy, xy[:end_embeddings], reference.embedding_xy)

    labels, ages = points.labels, points.ages
    live_rows = {int(labels[row]): row for row in range(end_embeddings, end_weights) if ages[row] == 0}
    missing = [int(label) for label in points.classes if int(label) not in live_rows]
    if missing:
        raise ValueError(f"the few-class view needs each class's live weight; classes {missing} have none")
    live_of_each = np.array([live_rows[int(label)] for label in labels])
    angles = drift_frame.angles_degrees(points.points, points.points[live_of_each])
    drift = np.zeros((points.weight_count, 2))
    weight_labels, weight_ages = labels[end_embeddings:end_weights], ages[end_embeddings:end_weights]
    for label, live in live_rows.items():
        stored = np.flatnonzero((weight_labels == label) & (weight_ages > 0))
        drift[stored] = drift_frame.drift_offsets(points.points[live], points.points[end_embeddings + stored])
    return FewClassProjection(
        step=points.step, margin=points.margin, method=method, classes=points.classes,
        embedding_xy=xy[:end_embeddings], embedding_labels=labels[:end_embeddings],
        weight_xy=xy[end_embeddings:end_weights], weight_labels=weight_labels, weight_ages=weight_ages,
        memory_xy=xy[end_weights:], memory_labels=labels[end_weights:], memory_ages=ages[end_weights:],
        embedding_angles=angles[:end_embeddings], weight_angles=angles[end_embeddings:end_weights],
        memory_angles=angles[end_weights:], weight_drift=drift,
    )


def project_few_classes(points: FewClassPoints, method: str = "pca", reference: FewClassProjection | None = None,
                  seed: int = 0, layout: Callable[..., np.ndarray] | None = None) -> FewClassProjection:
    """The few-class view in 2-D: every point (images, live and stored weights, stored embeddings) on one map, by PCA
    fitted on all of them (milliseconds) or by UMAP started from that PCA picture and scaled to its size
    (``layout_few_classes``); aligned to ``reference`` either way. From UMAP's own start (a spectral layout) the
    weights, which sit apart from the images, took the picture and packed every class's images into one corner; from
    the PCA picture each class starts where its images spread, as in the PCA view. ``layout(points, seed, init,
    n_neighbors=, min_dist=)`` replaces ``umap_layout`` (the app runs it in another process)."""
    if method not in METHODS:
        raise ValueError(f"unknown projection method {method!r}; use one of {', '.join(METHODS)}")
    pca = pca_2d(torch.from_numpy(points.points))
    if method == "pca":
        return layout_few_classes(points, pca, method, reference)
    xy = (layout or umap_layout)(points.points, seed, pca, n_neighbors=few_class_umap_neighbours(len(points.points)),
                                 min_dist=FEW_CLASS_UMAP_MIN_DIST)
    # UMAP's units mean nothing: scaled so that the images span what they span in the PCA picture
    images = slice(0, points.embedding_count)
    span = float(np.ptp(xy[images], axis=0).max())
    if span > 0:
        xy = xy * (float(np.ptp(pca[images], axis=0).max()) / span)
    return layout_few_classes(points, xy, method, reference)


def zoomed_extent(projection: FewClassProjection, margin: float = ZOOM_MARGIN,
                  ) -> tuple[tuple[float, float], tuple[float, float]]:
    """((x low, x high), (y low, y high)): the extent of every point of ``projection``, widened by ``margin`` of its
    larger span on each side of both axes (equal widening, for a picture with equal units on its axes)."""
    blocks = [block for block in (projection.embedding_xy, projection.weight_xy, projection.memory_xy) if len(block)]
    points = np.concatenate(blocks)
    low, high = points.min(axis=0), points.max(axis=0)
    pad = margin * max(float((high - low).max()), 1e-6)
    return (float(low[0] - pad), float(high[0] + pad)), (float(low[1] - pad), float(high[1] + pad))
