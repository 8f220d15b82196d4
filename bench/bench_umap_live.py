"""UMAP while training: the app's training speed with the few-class UMAP laid out in its own process as the page asks
for it, against the app without UMAP and against the CLI, in one run on this machine.

Run: .venv/bin/python bench/bench_umap_live.py [--epochs 2] [--repeats 2]. Prints a markdown table (for
docs/benchmarks.md). Each arm is a fresh process, the arms interleaved repeat by repeat: the CLI; the app's run
manager with a page polling once a second (its figures drawn) and UMAP off; the same with UMAP on and the page showing
"a few classes, UMAP". Settings are bench/bench_app.py's (glyphs, MemVir N=5, M=10, no warm-up, batch 128), with
the page's snapshot every 10 steps. Images/s is the median of the logged steps in each run's second half.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PYTHON = sys.executable
ARMS = ("cli", "app", "app-umap")


def median_images_per_s(run_dir: Path) -> float:
    """As bench/bench_app.py: the median over the second half, where the memory is full and the step's cost steady."""
    from memvir.checkpoint import RunFolder  # as the other project imports here: after REPO is on the path

    steps = [record for record in RunFolder(run_dir).records() if record.get("type") == "step"]
    last = steps[-1]["step"]
    return statistics.median(r["images_per_s"] for r in steps if r["step"] > last / 2)


def cli_arm(out: Path, epochs: int) -> dict:
    subprocess.run([PYTHON, "-m", "memvir", "train", "--dataset", "glyphs", "--loss", "norm-softmax",
                    "--memvir-n", "5", "--memvir-m", "10", "--warmup-epochs", "0", "--epochs", str(epochs),
                    "--batch-size", "128", "--seed", "0", "--out", str(out)], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"images_per_s": median_images_per_s(out)}


def app_arm(out: Path, epochs: int, umap: bool) -> dict:
    """The run manager and a page's poll, in this process, as app.py serves them (no HTTP: bench_app.py has it)."""
    import numpy as np

    from demo.common.settings import AppSettings
    from demo.runs.manager import RunManager
    from demo.train.live_view import FigureBuilder
    from demo.train.poll import PollState, poll
    from memvir.config import TrainConfig

    runs = RunManager(AppSettings(data_dir=out, checkpoints_dir=out / "none", umap=umap))
    figures = FigureBuilder()
    service = runs.umap_worker  # a page's load starts it, so its child compiles while the visitor reads the page
    try:
        if service is not None:  # the page opened a while before Start: wait for the compile to end
            service.process.layout(np.eye(8, 4), 0)
        config = TrainConfig(dataset="glyphs", epochs=epochs, memvir_n=5, memvir_m=10, warmup_epochs=0,
                             snapshot_every=10, eval_at_start=False, seed=0)
        run = runs.start(config, "bench")
        state = PollState()
        while run.busy:
            state, *_ = poll(runs, figures, state, "few-umap" if umap else "few", True, visitor="bench")
            time.sleep(1.0)
        laid_out = sum(1 for step in run.few_classes.steps()
                       if run.few_classes.view(step, umap=True).projection.method == "umap")
        result = {"images_per_s": median_images_per_s(run.folder), "snapshots": len(run.few_classes.steps())}
        if service is not None:
            result |= {"umap_laid_out": laid_out, "layouts": service.process.layouts - 1,
                       "layout_cpu_s": service.process.layout_cpu_s, "compile_cpu_s": service.process.compile_cpu_s}
        return result
    finally:
        figures.close()
        runs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one arm in this process (internal)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        result = cli_arm(args.out, args.epochs) if args.arm == "cli" else app_arm(args.out, args.epochs,
                                                                                   args.arm == "app-umap")
        print(json.dumps(result))
        return
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    results = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench-umap-") as tmp:
        for repeat in range(args.repeats):
            for arm in ARMS:
                out = Path(tmp) / f"{arm}-{repeat}"
                done = subprocess.run([PYTHON, __file__, "--arm", arm, "--out", str(out), "--epochs", str(args.epochs)],
                                      cwd=REPO, env=env, check=True, capture_output=True, text=True)
                results[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
    speed = {arm: statistics.median(r["images_per_s"] for r in results[arm]) for arm in ARMS}
    umap = results["app-umap"]
    print(f"Command: `{Path(PYTHON).name} bench/bench_umap_live.py --epochs {args.epochs} --repeats {args.repeats}` "
          f"on {os.cpu_count()} CPU cores\n")
    print("| measure | result |\n|---|---|")
    for arm in ARMS:
        each = ", ".join(f"{r['images_per_s']:,.0f}" for r in results[arm])
        print(f"| {arm}: images/s, each repeat | {each} |")
    print(f"| app with UMAP / CLI (medians) | {speed['app-umap'] / speed['cli']:.2f} |")
    print(f"| app without UMAP / CLI | {speed['app'] / speed['cli']:.2f} |")
    print(f"| app with UMAP / app without | {speed['app-umap'] / speed['app']:.2f} |")
    laid_out = ", ".join(f"{r['umap_laid_out']} of {r['snapshots']}" for r in umap)
    print(f"| snapshots laid out in UMAP while training, each repeat | {laid_out} |")
    per_layout = sum(r["layout_cpu_s"] for r in umap) / max(1, sum(r["layouts"] for r in umap))
    print(f"| the child's CPU: compile; per layout (mean) | {umap[0]['compile_cpu_s']:.1f} s; "
          f"{1000 * per_layout:.0f} ms |")


if __name__ == "__main__":
    main()
