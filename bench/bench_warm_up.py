"""RetrievalService.warm_up() on the bundled checkpoints, as the app runs it at start: with the views' figures their
folders ship (memvir.retrieval.shipped_gallery: rankings and pair cosines read) and without them (computed, as
before they were shipped). Each try is a new service over fresh copies of the two checkpoint folders, in this one
process, the two kinds alternating after one untimed try (which loads the dataset and torch).

Run: .venv/bin/python bench/bench_warm_up.py [--repeats 3]. Prints a markdown table for docs/benchmarks.md: the
median seconds of each kind and their ratio.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

BUNDLED = ("glyphs-norm-softmax-baseline", "glyphs-norm-softmax-memvir")


def warm_up_seconds(root: Path, saved_figures: bool) -> float:
    from demo.common.settings import AppSettings
    from demo.retrieve.service import RetrievalService
    from memvir.retrieval import shipped_gallery

    shutil.rmtree(root, ignore_errors=True)
    for name in BUNDLED:
        folder = shutil.copytree(REPO / "checkpoints" / name, root / "checkpoints" / name)
        if not saved_figures:
            (folder / shipped_gallery.GALLERY_DIR / shipped_gallery.VIEWS_FILE).unlink()
    service = RetrievalService(AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False))
    began = time.perf_counter()
    service.warm_up().join()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed warm-ups of each kind")
    args = parser.parse_args()
    times = {True: [], False: []}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "app"
        warm_up_seconds(root, True)
        for _ in range(args.repeats):
            for saved in (False, True):
                times[saved].append(warm_up_seconds(root, saved))
    computed, read = statistics.median(times[False]), statistics.median(times[True])
    print("| warm-up of the bundled pair | median s |")
    print("|---|---|")
    print(f"| figures computed (no saved views' figures) | {computed:.2f} |")
    print(f"| figures read (as shipped) | {read:.2f} |")
    print(f"| ratio computed / read | {computed / read:.1f} |")


if __name__ == "__main__":
    main()
