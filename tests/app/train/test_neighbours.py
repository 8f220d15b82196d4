"""Neighbours on a click (demo.train.neighbours): a snapshot's image points, a click on one answered with its image
and its nearest neighbours in the full embedding space (checked against cosines computed here by hand), ringed in the
picture; and every other click refused in words."""

import json

import numpy as np
import pytest
import torch

from demo.runs.live_run import LiveRun
from demo.train import neighbours
from demo.train.figures.embeddings import embedding_figure
from demo.train.poll import PollState
from memvir.analysis.projection import project_snapshot
from memvir.config import TrainConfig
from memvir.events import SnapshotEvent, StatusEvent
from memvir.train.trainer import training_data

CONFIG = TrainConfig(dataset="glyphs-mini", epochs=5)
STEP = 30


class OneRun:
    def __init__(self, run):
        self.run = run

    def get(self, run_id):
        return self.run if run_id == self.run.id else None


def _items_of(split, classes, per_class):
    labels = np.asarray(split.labels)
    return np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in classes])


@pytest.fixture(scope="module")
def splits():
    return training_data(CONFIG)[0]


@pytest.fixture
def snapshot(splits):
    """A snapshot of real images (4 of each of 3 training classes for the few-class view, 4 of each of 3 test
    classes as the probe) whose embeddings are drawn here, so that their neighbours are known."""
    generator = torch.Generator().manual_seed(0)
    focus_items = _items_of(splits.train, (0, 1, 2), 4)
    probe_items = _items_of(splits.test, (0, 1, 2), 4)

    def rows(count):
        return torch.nn.functional.normalize(torch.randn(count, 6, generator=generator), dim=1)

    return SnapshotEvent(
        step=STEP, margin=2, embeddings=rows(9), labels=torch.arange(9) % 3, ages=torch.zeros(9, dtype=torch.long),
        class_weights=rows(3), class_weight_labels=torch.arange(3), class_weight_ages=torch.zeros(3, dtype=torch.long),
        probe_embeddings=rows(12), probe_labels=torch.as_tensor(np.asarray(splits.test.labels)[probe_items]),
        focus_classes=torch.tensor([0, 1, 2]), focus_embeddings=rows(12),
        focus_labels=torch.as_tensor(np.asarray(splits.train.labels)[focus_items]),
        probe_items=torch.as_tensor(probe_items), focus_items=torch.as_tensor(focus_items))


@pytest.fixture
def runs(tmp_path, snapshot):
    run = LiveRun("r1", "alice", tmp_path / "r1", CONFIG)
    run._project = project_snapshot
    run._on_event(StatusEvent("running", 0, "training"))
    run._on_event(snapshot)
    return OneRun(run)


def _by_hand(embeddings: torch.Tensor, row: int, count: int = neighbours.NEIGHBOURS):
    """The rows nearest to `row` by cosine, itself left out, best first (ties by lower row), and their cosines."""
    unit = embeddings.double() / embeddings.double().norm(dim=1, keepdim=True)
    cosines = (unit @ unit[row]).numpy()
    order = [i for i in sorted(range(len(cosines)), key=lambda i: (-cosines[i], i)) if i != row][:count]
    return order, cosines[order]


def _pixels(image):
    return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize(("picture", "name"), [("age", "probe"), ("few", "focus")])
def test_a_click_shows_the_image_and_its_nearest_neighbours_in_the_full_space_ringed_in_the_picture(
        runs, snapshot, splits, picture, name):
    row = 5
    embeddings = snapshot.probe_embeddings if name == "probe" else snapshot.focus_embeddings
    items, labels = ((snapshot.probe_items, snapshot.probe_labels) if name == "probe"
                     else (snapshot.focus_items, snapshot.focus_labels))
    split = splits.test if name == "probe" else splits.train
    expected_rows, expected_cosines = _by_hand(embeddings, row)

    clicks = neighbours.NeighbourHandlers(runs)
    state, tiles, caption, figure, follow, slider = clicks.show_neighbours(
        PollState(run_id="r1"), json.dumps({"step": STEP, "set": name, "row": row}), picture)

    assert (state.scrubbed_step, follow, slider["value"]) == (STEP, False, STEP)  # the picture stays
    assert len(tiles) == 1 + neighbours.NEIGHBOURS
    clicked, *found = tiles
    np.testing.assert_array_equal(_pixels(clicked[0]), _pixels(split.image(int(items[row]))))
    same = 0
    for rank, ((image, words), expected, cosine) in enumerate(zip(found, expected_rows, expected_cosines,
                                                                  strict=True), start=1):
        np.testing.assert_array_equal(_pixels(image), _pixels(split.image(int(items[expected]))))
        is_same = int(labels[expected]) == int(labels[row])
        same += is_same
        assert words.startswith(f"{rank}. class {split.class_names[int(labels[expected])]} · cos {cosine:.3f} · ")
        assert words.endswith("✓ same class" if is_same else "✗ another class")
    assert f"{same} of {neighbours.NEIGHBOURS} share its class" in caption and "full 6-dimensional" in caption

    by_name = {trace.name: trace for trace in figure.data}
    source = next(trace for trace in figure.data if isinstance(trace.meta, dict) and trace.meta.get("pick") == name)
    np.testing.assert_allclose(by_name["the image clicked"].x, [source.x[row]])
    np.testing.assert_allclose(by_name["the image clicked"].y, [source.y[row]])
    np.testing.assert_allclose(by_name[f"its {neighbours.NEIGHBOURS} nearest neighbours"].x,
                               np.asarray(source.x)[expected_rows])


def test_a_click_in_the_other_picture_shows_the_neighbours_without_rings(runs):
    """The picture changed between the click and its answer: the neighbours come, the picture shown is left as is."""
    _, tiles, _, figure, _, _ = neighbours.NeighbourHandlers(runs).show_neighbours(
        PollState(run_id="r1"), json.dumps({"step": STEP, "set": "focus", "row": 0}), "class")
    assert len(tiles) == 9 and "the image clicked" not in {trace.name for trace in figure.data}


def test_the_pictures_name_the_rows_a_click_sends(runs):
    """The probe's crosses and the few-class picture's dots carry their set (meta "pick") and their row (last in
    customdata), and the figure its step (layout meta): what page.js sends."""
    view = runs.run.snapshots[-1]
    figure = embedding_figure(view.projected, "age")
    probe = next(trace for trace in figure.data if trace.name == "probe (test classes)")
    assert probe.meta == {"pick": "probe"} and figure.layout.meta == {"step": STEP}
    assert [row[-1] for row in probe.customdata] == list(range(12))
    few, _ = neighbours.live_view.embedding_view(runs.run, None, "few")
    dots = [trace for trace in few.data if isinstance(trace.meta, dict) and trace.meta.get("pick")]
    assert len(dots) == 1 and dots[0].meta["kind"] == "embeddings" and dots[0].meta["age"] == 0
    assert [row[-1] for row in dots[0].customdata] == list(range(12)) and few.layout.meta == {"step": STEP}
    # the pick's images: the rows of the points drawn, in order
    assert view.images["probe"].items.tolist() == runs.run.snapshots[-1].images["probe"].items.tolist()


@pytest.mark.parametrize(("picked", "message"), [
    ("not json", 'a click on the picture is sent as {"step": S, "set": "focus" or "probe", "row": R}'),
    (json.dumps({"step": STEP, "set": "probe"}), "a click on the picture is sent as"),
    (json.dumps({"step": STEP, "set": "weights", "row": 0}), "the point's set must be \"focus\" or \"probe\""),
    (json.dumps({"step": STEP, "set": "probe", "row": -1}), "the point's step and row must be whole numbers"),
    (json.dumps({"step": STEP, "set": "probe", "row": True}), "the point's step and row must be whole numbers"),
    (json.dumps({"step": STEP, "set": "probe", "row": 12}), "has 12 probe images (test classes); row 12 is not one"),
    (json.dumps({"step": 20, "set": "probe", "row": 0}), "the snapshot of step 20 is no longer kept"),
])
def test_a_click_that_names_no_image_of_a_kept_snapshot_is_refused_in_words(runs, picked, message):
    with pytest.warns(UserWarning):
        answer = neighbours.NeighbourHandlers(runs).show_neighbours(PollState(run_id="r1"), picked, "age")
    assert answer[2].startswith("⚠️ ") and message in answer[2]


def test_a_click_without_a_run_says_what_to_do(runs):
    with pytest.warns(UserWarning):
        answer = neighbours.NeighbourHandlers(runs).show_neighbours(PollState(run_id="gone"), json.dumps(
            {"step": STEP, "set": "probe", "row": 0}), "age")
    assert "no run is shown here: start one" in answer[2]
