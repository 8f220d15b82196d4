"""Neighbours on a click: a point of the snapshot picture opened as its image, beside its nearest neighbours in the
full embedding space (not the 2-D map, which keeps where classes lie but shortens most distances), the neighbours
ringed in the picture.

The points that are images a visitor can see are the few-class picture's dots (the focus classes' training images,
embedded now) and the all-classes pictures' probe crosses (the fixed test images); a snapshot keeps their embeddings
and which images they are (demo.runs.live_run.ImageSet, from the SnapshotEvent's `focus_items` and `probe_items`).
The page's script sends a click on one of them (demo/static/page.js) as {"step", "set", "row"}: the snapshot, the set
("focus" or "probe") and the point's row in it; the search is memvir's one cosine kNN (memvir.retrieval.knn) over
that set.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass

import gradio as gr
import numpy as np

from demo.common.handlers import reporting
from demo.common.shims import unvalidated_figure
from demo.runs.live_run import ImageSet
from demo.runs.manager import RunManager
from demo.train import live_view
from demo.train.poll import PollState, current_state
from memvir.retrieval.knn import knn_search
from memvir.train.trainer import training_data

NEIGHBOURS = 8
# each set's points in words: one, and many
PICK_SETS = {"focus": ("a training image of the few-class picture", "training images of the few-class picture"),
             "probe": ("a probe image (a test class)", "probe images (test classes)")}
# which picture draws which set's points (live_view.PICTURES)
SET_OF_PICTURE = {"few": "focus", "few-umap": "focus", "age": "probe", "class": "probe"}
MARK_COLOUR = "#111111"
HINT = ("Click a point of the picture that is an image, a dot of the few-class picture or a probe's cross in the "
        "all-classes ones, to see it here beside its nearest neighbours in the full embedding space.")


@dataclass(frozen=True)
class Pick:
    step: int
    set: str
    row: int


def parse_pick(picked) -> Pick:
    """The page's click as a Pick; ValueError in words for anything else (a client may send any text)."""
    try:
        values = json.loads(picked) if isinstance(picked, str) else None
    except json.JSONDecodeError:
        values = None
    if not isinstance(values, dict) or set(values) != {"step", "set", "row"}:
        raise ValueError('a click on the picture is sent as {"step": S, "set": "focus" or "probe", "row": R}: click '
                         "a point of the picture")
    step, name, row = values["step"], values["set"], values["row"]
    if name not in PICK_SETS:
        raise ValueError(f"the point's set must be \"focus\" or \"probe\", not {str(name)[:40]!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (step, row)):
        raise ValueError("the point's step and row must be whole numbers, 0 or more")
    return Pick(step, name, row)


# what training_data reads of a config: the runs that agree on these share their splits
_SPLIT_FIELDS = ("dataset", "data_root", "image_size", "seed", "augment", "val_classes", "val_fold")
_KEPT_SPLITS = 4
_splits_kept: dict[tuple, object] = {}
_splits_lock = threading.Lock()


def _splits(config):
    """The run's splits as its Trainer reads them (a snapshot's item indices are into these), kept for the next
    clicks (the few last runs' datasets)."""
    key = tuple(getattr(config, name) for name in _SPLIT_FIELDS)
    with _splits_lock:
        if key not in _splits_kept:
            if len(_splits_kept) >= _KEPT_SPLITS:
                _splits_kept.pop(next(iter(_splits_kept)))
            _splits_kept[key] = training_data(config)[0]
        return _splits_kept[key]


def nearest(images: ImageSet, row: int, count: int = NEIGHBOURS) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cosines) of the `count` points of `images` nearest to point `row` by cosine, best first, itself left
    out."""
    k = min(count + 1, len(images.items))
    scores, found = knn_search(images.embeddings[row:row + 1], images.embeddings, k)
    keep = found[0] != row
    return found[0][keep][:count], scores[0][keep][:count]


def _class_name(split, label: int) -> str:
    names = getattr(split, "class_names", None)
    return str(names[label]) if names is not None and 0 <= label < len(names) else str(label)


def marked(figure, name: str, row: int, rows: np.ndarray):
    """`figure` with the point `row` of the trace whose meta picks `name`, and its neighbours `rows`, ringed."""
    source = next((trace for trace in figure.data if isinstance(trace.meta, dict) and trace.meta.get("pick") == name),
                  None)
    if source is None:
        return figure
    x, y = np.asarray(source.x, dtype=float), np.asarray(source.y, dtype=float)
    marks = [dict(type="scatter", x=x[rows], y=y[rows], mode="markers", name=f"its {len(rows)} nearest neighbours",
                  hoverinfo="skip", marker=dict(symbol="circle-open", size=16, line=dict(width=2),
                                                color=MARK_COLOUR)),
             dict(type="scatter", x=x[[row]], y=y[[row]], mode="markers", name="the image clicked",
                  hoverinfo="skip", marker=dict(symbol="star-open", size=22, line=dict(width=2.5),
                                                color=MARK_COLOUR))]
    return unvalidated_figure([trace.to_plotly_json() for trace in figure.data] + marks,
                              figure.layout.to_plotly_json())


class NeighbourHandlers:
    """The click's handler, bound to the runs (a `RunManager`): demo.train.views wires the bound method; tests call it
    the same way."""

    def __init__(self, runs: RunManager):
        self.runs = runs

    @reporting(message_slot=2, outputs=6)
    def show_neighbours(self, state: PollState, picked, color_by, request: gr.Request = None):
        """A click on an image's point: (state, the neighbours as a gallery, their caption, the picture with them
        ringed, follow unticked, the scrub slider at the snapshot), so that the picture stays while the visitor
        looks."""
        pick = parse_pick(picked)
        state = current_state(self.runs, state, request)
        run = self.runs.get(state.run_id)
        if run is None:
            raise ValueError("no run is shown here: start one, then click a point of its snapshot")
        with run.lock:
            view = next((kept for kept in run.snapshots if kept.step == pick.step), None)
        if view is None:
            raise ValueError(f"the snapshot of step {pick.step:,} is no longer kept (older ones are thinned out): "
                             "click a point of a newer one")
        images = view.images.get(pick.set)
        if images is None:
            raise ValueError(f"the snapshot of step {pick.step:,} keeps no {PICK_SETS[pick.set][1]} to show")
        if pick.row >= len(images.items):
            raise ValueError(f"the snapshot of step {pick.step:,} has {len(images.items)} {PICK_SETS[pick.set][1]}; "
                             f"row {pick.row} is not one of them")
        rows, cosines = nearest(images, pick.row)
        data = _splits(run.config)
        split = data.train if images.split == "train" else data.test
        label = int(images.labels[pick.row])
        tiles = [(split.image(int(images.items[pick.row])), f"clicked · class {_class_name(split, label)}")]
        same = 0
        for rank, (found, cosine) in enumerate(zip(rows, cosines, strict=True), start=1):
            found_label = int(images.labels[found])
            same += found_label == label
            mark = "✓ same class" if found_label == label else "✗ another class"
            tiles.append((split.image(int(images.items[found])),
                          f"{rank}. class {_class_name(split, found_label)} · cos {cosine:.3f} · {mark}"))
        dimension = images.embeddings.shape[1]
        one, many = PICK_SETS[pick.set]
        caption = (f"**Step {pick.step:,}: {one}, class {_class_name(split, label)}**, and its {len(rows)} nearest "
                   f"among the snapshot's {len(images.items)} {many}, by cosine in "
                   f"the full {dimension}-dimensional embedding space: {same} of {len(rows)} share its class. The "
                   "picture rings them (where the map put them: near in the space is not always near on the map). "
                   "**Follow the latest snapshot** is unticked so that the picture stays; tick it to follow the run.")
        figure, _ = live_view.embedding_view(run, pick.step, color_by)
        if SET_OF_PICTURE.get(color_by) == pick.set:
            figure = marked(figure, pick.set, pick.row, rows)
        return (dataclasses.replace(state, scrubbed_step=pick.step), tiles, caption, figure, False,
                gr.update(value=pick.step))
