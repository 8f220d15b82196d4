"""The Retrieve tab's views on the bundled checkpoints (the glyphs test split, 12,252 images), through the page's own
handlers in this process: a plain search, the same with a similarity cut-off, side by side, the hardest queries, the
per-class table, the threshold view and the gallery export. Each view's first answer computes what it reads once per
gallery index (the rankings, the pair cosines, the export's files: the app starts on the rankings of the default pair
and the pair cosines of the default checkpoint, so a visitor rarely waits for them); its later answers read that.

Run: .venv/bin/python bench/bench_retrieve_views.py [--repeats 5]. Prints markdown tables (for docs/benchmarks.md):
each view's first answer, its median later answer, and that median over a plain search's in the same run; and
the pair cosines' computation against the bare matrix products it makes.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

MEMVIR = str(REPO / "checkpoints" / "glyphs-norm-softmax-memvir")
BASELINE = str(REPO / "checkpoints" / "glyphs-norm-softmax-baseline")


def handler(app, api_name: str):
    return next(block_fn.fn for block_fn in app.fns.values() if block_fn.api_name == api_name)


def timed(call, repeats: int) -> tuple[float, float]:
    """(seconds of the first call, median seconds of `repeats` more); a refused call stops the benchmark."""
    times = []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        answer = call()
        times.append(time.perf_counter() - began)
        first = answer[0] if isinstance(answer, tuple) else answer
        if isinstance(first, str) and first.startswith("⚠️"):
            raise SystemExit(f"refused: {first}")
    return times[0], statistics.median(times[1:])


def pair_cosines_against_a_bare_matmul(repeats: int) -> tuple[float, float]:
    """(median seconds of memvir.retrieval.diagnosis.verification.pair_similarities on the MemVir checkpoint's shipped
    gallery, median seconds of the bare float32 products of the same rows it computes twice, each row with itself
    and the later ones)."""
    import json

    import numpy as np
    import torch

    from memvir.retrieval.diagnosis.verification import pair_similarities

    vectors = np.load(Path(MEMVIR) / "gallery" / "vectors.npy")
    labels = json.loads((Path(MEMVIR) / "gallery" / "gallery.json").read_text(encoding="utf-8"))["labels"]
    tensor = torch.from_numpy(vectors)

    def bare():
        for _ in range(2):  # its two passes
            for start in range(0, len(vectors), 684):
                _ = tensor[start:start + 684] @ tensor[start:].T

    measured = {}
    for name, call in (("pairs", lambda: pair_similarities(vectors, labels)), ("bare", bare)):
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        measured[name] = statistics.median(times)
    return measured["pairs"], measured["bare"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="later answers timed per view")
    args = parser.parse_args()

    from demo.common.settings import AppSettings
    from demo.page import build_app
    from memvir.data import load_dataset

    with tempfile.TemporaryDirectory(prefix="bench-retrieve-views-") as tmp:
        tmp = Path(tmp)
        app = build_app(AppSettings(data_dir=tmp / "data", checkpoints_dir=REPO / "checkpoints", umap=False))
        try:
            blocks = app.blocks
            query = tmp / "query.png"
            load_dataset("glyphs").test.image(1234).save(query)
            search = handler(blocks, "search_upload")
            views = {
                "search, k = 8": lambda: search(MEMVIR, "test split", 8, "", str(query)),
                "search with a cut-off": lambda: search(MEMVIR, "test split", 8, "", str(query), None, "0.6"),
                "side by side, query's class named": lambda: handler(blocks, "compare_upload")(
                    MEMVIR, BASELINE, "test split", 8, "O", str(query)),
                "hardest queries": lambda: handler(blocks, "hardest_queries")(MEMVIR, BASELINE, "test split",
                                                                              "map@r", False),
                "per class, two checkpoints": lambda: handler(blocks, "per_class_metrics")(
                    MEMVIR, BASELINE, "test split", True),
                "threshold view (FMR 0.01)": lambda: handler(blocks, "threshold_view")(MEMVIR, "test split", 0.01,
                                                                                       ""),
                "threshold view with a cut-off": lambda: handler(blocks, "threshold_view")(MEMVIR, "test split",
                                                                                           0.001, "0.6"),
                "export (projector zip + .npz)": lambda: handler(blocks, "export_gallery")(MEMVIR, "test split"),
            }
            results = {name: timed(call, args.repeats) for name, call in views.items()}
        finally:
            app.close()
    pairs_s, bare_s = pair_cosines_against_a_bare_matmul(max(3, args.repeats // 2))
    search_s = results["search, k = 8"][1]
    print(f"Command: `{Path(sys.executable).name} bench/bench_retrieve_views.py --repeats {args.repeats}` on "
          f"{os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f} at the end)\n")
    print("| view (bundled checkpoints, 12,252 images) | first answer | later, median | later / a search |")
    print("|---|---|---|---|")
    for name, (first, later) in results.items():
        shown = f"{1000 * later:.0f} ms" if later >= 0.001 else "< 1 ms"
        print(f"| {name} | {first:.2f} s | {shown} | {later / search_s:.2f}x |")
    print("\n| pair cosines of the 12,252-image gallery (75 million pairs) | median | ratio |\n|---|---|---|")
    print(f"| memvir.retrieval.diagnosis.verification.pair_similarities | {pairs_s:.2f} s | {pairs_s / bare_s:.1f}x |")
    print(f"| the bare float32 products it computes (two passes) | {bare_s:.2f} s | 1.0x |")


if __name__ == "__main__":
    main()
