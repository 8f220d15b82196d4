"""What the app's figures cost to draw, as the server draws them while a page watches a run, and to turn into JSON
(gradio does that for each page it sends one to).

Run: .venv/bin/python bench/bench_figures.py [--steps 400] [--repeats 30]; to compare with an earlier version of the
figures, run this same file from a checkout of it (`git worktree add /tmp/before REV`, copy the file into its bench/).
The records are a run's as the Trainer logs
them (a step record every step, the spread measures every 25 steps with one drift pair per virtual set, an evaluation
per 70 steps) with a baseline's beside them; the pictures are projected snapshots of the sizes the glyphs run sends.
Each cost is the median of `--repeats` draws, in this one process and one thread (the server's torch and faiss keep to
one). Prints a markdown table for docs/benchmarks.md.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo.runs.few_class_track import FewClassView  # noqa: E402
from demo.train.figures import curves, embeddings, spread  # noqa: E402 - after the repository is on the path
from demo.train.figures.few_classes import few_class_figure  # noqa: E402
from memvir.analysis.projection import FewClassProjection, ProjectedSnapshot  # noqa: E402

SNAPSHOT_EVERY, EVAL_EVERY, MARGIN, SETS = 25, 70, 10, 5


def run_records(steps: int, memvir: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    records = []
    for step in range(1, steps + 1):
        k = min(step // (MARGIN + 1), SETS) if memvir else 0
        record = {"type": "step", "step": step, "epoch": 0, "loss": float(3 - step / steps + rng.normal(0, 0.05)),
                  "num_classes": 100 * (k + 1), "num_virtual_sets": k, "mean_target_cosine": 0.5, "warmup": False,
                  "images_per_s": 900.0, "lr": 1e-4}
        if step % SNAPSHOT_EVERY == 0:
            record |= {"weight_mean_cos": -0.01, "weight_uniformity": -3.9}
            for age in range(1, k + 1):
                record |= {f"virtual_weight_cos_{age}": 0.99, f"virtual_embedding_cos_{age}": 0.3}
        records.append(record)
        if step % EVAL_EVERY == 0:
            records.append({"type": "eval", "step": step, "epoch": 0, "recall@1": 0.5})
    return records


def projected(rows: int = 2000, classes: int = 100) -> ProjectedSnapshot:
    rng = np.random.default_rng(1)
    return ProjectedSnapshot(
        step=100, margin=MARGIN, method="pca", xy=rng.normal(size=(rows, 2)), labels=rng.integers(0, classes, rows),
        ages=rng.integers(0, SETS + 1, rows), weight_xy=rng.normal(size=(classes * (SETS + 1), 2)),
        weight_labels=np.tile(np.arange(classes), SETS + 1), weight_ages=np.repeat(np.arange(SETS + 1), classes),
        probe_xy=rng.normal(size=(200, 2)), probe_labels=rng.integers(0, 20, 200))


def focus_view(classes: int = 8, images: int = 20) -> FewClassView:
    rng = np.random.default_rng(2)
    labels = np.arange(classes)
    projection = FewClassProjection(
        step=100, margin=MARGIN, method="pca", classes=labels, embedding_xy=rng.normal(size=(classes * images, 2)),
        embedding_labels=np.repeat(labels, images), weight_xy=rng.normal(size=(classes * (SETS + 1), 2)),
        weight_labels=np.tile(labels, SETS + 1), weight_ages=np.repeat(np.arange(SETS + 1), classes),
        memory_xy=rng.normal(size=(classes * 4 * SETS, 2)), memory_labels=np.tile(labels, 4 * SETS),
        memory_ages=np.repeat(np.arange(1, SETS + 1), classes * 4),
        embedding_angles=rng.uniform(30, 70, classes * images), weight_angles=rng.uniform(0, 20, classes * (SETS + 1)),
        memory_angles=rng.uniform(40, 90, classes * 4 * SETS))
    return FewClassView(projection, (-3.0, 3.0), (-3.0, 3.0), 1, 1, 100)


def median_ms(draw, repeats: int) -> float:
    draw()  # the first draw pays plotly's imports and caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        draw()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def main() -> None:
    import torch

    torch.set_num_threads(1)  # as in the server (demo.common.cores.limit_server_threads)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    run, baseline = run_records(args.steps, True), run_records(args.steps, False)
    kinds = {
        "loss and Recall@1 (with the baseline)": lambda: curves.curves_figure(run, baseline),
        "class count s(i)": lambda: curves.class_count_figure(run, baseline),
        "mean target cosine": lambda: curves.target_cosine_figure(run, baseline),
        "drift of the virtual sets": lambda: spread.drift_figure(run, MARGIN),
        "how the real classes spread": lambda: spread.class_spread_figure(run, baseline),
        "few-class picture (8 classes)": lambda: few_class_figure(focus_view()),
        "all classes by age (2,000 rows)": lambda: embeddings.embedding_figure(projected(), "age"),
    }
    print(f"Command: `.venv/bin/python bench/bench_figures.py --steps {args.steps} --repeats {args.repeats}` "
          f"(medians of {args.repeats} draws, one thread)\n")
    print("| figure | drawn | its JSON (to_json, per page sent) |")
    print("|---|---|---|")
    for name, draw in kinds.items():
        print(f"| {name} | {median_ms(draw, args.repeats):.2f} ms | {median_ms(draw().to_json, args.repeats):.2f} ms |")


if __name__ == "__main__":
    main()
