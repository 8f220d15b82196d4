"""bench/map_note.py's figures on a hand-placed map: distances as a percent of the framed square's side, the true
angles, and the images a virtual set holds of the classes shown."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import map_note  # noqa: E402


def test_distances_are_a_percent_of_the_framed_side_and_medians_range_over_snapshots(monkeypatch):
    import memvir.analysis.projection as projection

    # two classes; snapshot 1 has no virtual set (skipped), snapshot 2 one set, snapshot 3 two sets
    maps = [
        SimpleNamespace(classes=np.array([3, 7]), weight_xy=np.array([[0.0, 0.0], [1.0, 1.0]]),
                        weight_ages=np.array([0, 0]), weight_labels=np.array([3, 7]), weight_angles=np.zeros(2),
                        memory_ages=np.array([], dtype=int)),
        SimpleNamespace(classes=np.array([3, 7]),
                        weight_xy=np.array([[0.0, 0.0], [1.0, 1.0], [0.1, 0.0], [1.0, 1.3]]),
                        weight_ages=np.array([0, 0, 1, 1]), weight_labels=np.array([3, 7, 3, 7]),
                        weight_angles=np.array([0.0, 0.0, 2.0, 6.0]), memory_ages=np.array([1, 1, 1])),
        SimpleNamespace(classes=np.array([3, 7]),
                        weight_xy=np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 0.2], [1.0, 1.0], [0.4, 0.0],
                                            [1.0, 0.9]]),
                        weight_ages=np.array([0, 0, 1, 1, 2, 2]), weight_labels=np.array([3, 7, 3, 7, 3, 7]),
                        weight_angles=np.array([0.0, 0.0, 1.0, 3.0, 9.0, 11.0]), memory_ages=np.array([2])),
    ]
    placed = iter(maps)
    monkeypatch.setattr(projection, "project_few_classes", lambda snapshot, method, reference: next(placed))
    monkeypatch.setattr(projection, "zoomed_extent", lambda view: ((-0.5, 1.5), (-1.0, 1.0)))  # a side of 2
    figures = map_note.measure([None] * 3)
    # snapshot 2: 0.1 and 0.3 of 2 -> 5 % and 15 %, median 10 %; snapshot 3: 10, 0, 20, 5 % -> median 7.5 %
    assert figures["snapshots"] == 2
    assert figures["median distance, % of the map's side"] == [7.5, 10.0]
    assert figures["median angle, degrees"] == [4.0, 6.0]  # medians of (2, 6) and (1, 3, 9, 11)
    assert figures["widest distance, %"] == pytest.approx(20.0)
    # sets: snapshot 2's one set holds 3 images; snapshot 3's first none, its second 1
    assert figures["images of the classes shown per virtual set"] == pytest.approx(round(4 / 3, 2))
    assert figures["virtual sets holding none of them"] == pytest.approx(0.33)
