"""Neighbours on a click (demo.train.neighbours): a click on a snapshot's image point, answered by the page's own
handler in this process, for a glyphs run at the page's settings (its real snapshot: the trainer's probe set and
few-class view, the first snapshot of a run of the glyphs preset). The first click of a run reads its dataset's
splits (glyphs renders its characters, or reads its cache); the later ones reuse them.

Run: .venv/bin/python bench/bench_neighbours.py [--repeats 9]. Prints a markdown table for docs/benchmarks.md: the
first click of each picture's set, the median later click, and that median over a poll's picture alone (the figure
the poll would draw anyway) in the same run.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    from demo.runs.live_run import LiveRun
    from demo.train import live_view, neighbours
    from demo.train.poll import PollState
    from demo.train.presets import PAGE_DEFAULTS
    from memvir.analysis.projection import project_snapshot
    from memvir.config import TrainConfig
    from memvir.events import SnapshotEvent, StatusEvent
    from memvir.train.trainer import Trainer

    config = TrainConfig.from_dict({**TrainConfig().to_dict(), **PAGE_DEFAULTS, "max_steps": 1, "snapshot_every": 1,
                                    "eval_every": 0, "eval_at_start": False})
    taken = []
    trainer = Trainer(config)
    trainer.add_listener(lambda event: taken.append(event) if isinstance(event, SnapshotEvent) else None)
    trainer.run()
    run = LiveRun("bench", "bench", Path(tempfile.mkdtemp()), config)
    run._project = project_snapshot
    run._on_event(StatusEvent("running", 0, "training"))
    run._on_event(taken[-1])
    runs = type("Runs", (), {"get": staticmethod(lambda run_id: run)})()
    step = taken[-1].step
    sets = run.snapshots[-1].images
    print(f"glyphs snapshot at step {step}: {len(sets['focus'].items)} few-class images, "
          f"{len(sets['probe'].items)} probe images, {sets['probe'].embeddings.shape[1]} dimensions\n")
    print("| click | first (s) | median of later (s) | later / the picture alone |")
    print("|---|---:|---:|---:|")
    for picture, name in (("few", "focus"), ("age", "probe")):
        def click(row, name=name, picture=picture):
            return neighbours.show_neighbours(runs, PollState(run_id="bench"), json.dumps(
                {"step": step, "set": name, "row": row}), picture)

        began = time.perf_counter()
        click(0)
        first = time.perf_counter() - began
        later, alone = [], []
        for row in range(1, args.repeats + 1):
            began = time.perf_counter()
            click(row)
            later.append(time.perf_counter() - began)
            began = time.perf_counter()
            live_view.embedding_view(run, step, picture)
            alone.append(time.perf_counter() - began)
        print(f"| a {name} point in the {picture!r} picture | {first:.3f} | {statistics.median(later):.3f} | "
              f"{statistics.median(later) / statistics.median(alone):.1f}x |")


if __name__ == "__main__":
    main()
