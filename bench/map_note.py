"""What a glyphs run's few-class map shows of its virtual classes: the figures under a glyphs run's map
(demo.train.words.GLYPHS_MAP_NOTE) and in docs/app.md, "The snapshot picture".

    OMP_NUM_THREADS=1 python bench/map_note.py [--seed 0] [--first]

Trains glyphs' preset (`--first`: at the first fair comparison's optimiser, the preset before the widened search)
with the app's Trainer, snapshots at the page's cadence and its 8 classes drawn with the run's seed, and places every
snapshot with the app's own few-class map (demo.runs.few_class_track: PCA, aligned to the snapshot before, framed
by zoomed_extent). For every snapshot with a virtual set in use, for each class shown and each set: the distance in
the map from its stored weight to its live weight, as a percent of the framed square's side, and their true angle.
It prints the range over snapshots of the per-snapshot medians, the widest single distance, and how many images of
the classes shown a virtual set holds on average. About 5 minutes of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

FIRST = {"lr": 0.00133, "class_lr": 0.00801, "adam_eps": 1e-4, "loss_params": {"scale": 21.1}}


def snapshots(seed: int, first: bool) -> list:
    """Every snapshot's few-class points of a glyphs run at the preset."""
    from demo.train.presets import PRESETS
    from demo.train.tab import LIVE_SNAPSHOT_EVERY
    from memvir.analysis.projection import few_class_points
    from memvir.config import TrainConfig
    from memvir.events import SnapshotEvent
    from memvir.train.trainer import Trainer

    settings = {**PRESETS["glyphs"].settings(), **(FIRST if first else {})}
    config = TrainConfig(dataset="glyphs", seed=seed, snapshot_every=LIVE_SNAPSHOT_EVERY, eval_every=0,
                         eval_at_start=False, **settings)
    points = []
    trainer = Trainer(config, None, [lambda event: isinstance(event, SnapshotEvent)
                                     and points.append(few_class_points(event))])
    trainer.run()
    return points


def measure(points: list) -> dict:
    from memvir.analysis.projection import project_few_classes, zoomed_extent

    medians_pct, medians_deg, widest, images = [], [], 0.0, []
    reference = None
    for snapshot in points:
        projection = project_few_classes(snapshot, "pca", reference)  # as the page places it: aligned, never scaled
        reference = projection
        (x_low, x_high), (y_low, y_high) = zoomed_extent(projection)
        side = max(x_high - x_low, y_high - y_low)
        ages, labels = projection.weight_ages, projection.weight_labels
        stored = np.flatnonzero(ages > 0)
        if not len(stored):
            continue
        live = {int(label): projection.weight_xy[np.flatnonzero((labels == label) & (ages == 0))[0]]
                for label in projection.classes}
        pct = [100 * np.linalg.norm(projection.weight_xy[row] - live[int(labels[row])]) / side for row in stored]
        medians_pct.append(np.median(pct))
        medians_deg.append(np.median(projection.weight_angles[stored]))
        widest = max(widest, max(pct))
        images += [int((projection.memory_ages == age).sum()) for age in range(1, int(ages.max()) + 1)]
    return {"snapshots": len(medians_pct),
            "median distance, % of the map's side": [round(min(medians_pct), 1), round(max(medians_pct), 1)],
            "median angle, degrees": [round(min(medians_deg), 1), round(max(medians_deg), 1)],
            "widest distance, %": round(widest, 1),
            "images of the classes shown per virtual set": round(float(np.mean(images)), 2),
            "virtual sets holding none of them": round(float(np.mean(np.array(images) == 0)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", action="store_true", help="the first fair comparison's optimiser")
    args = parser.parse_args()
    print(json.dumps(measure(snapshots(args.seed, args.first)), indent=1))


if __name__ == "__main__":
    main()
