"""First impressions: how soon a run's process is ready, started as the app starts it (forked from the forkserver
that imported torch and the Trainer once, demo.runs.process) against a fresh interpreter (spawn, how it started
before), in alternating rounds of one run; and, through the app itself, as a visitor sees them: the starting page
(demo.common.starting_page) and the app's own page after `python app.py`, and the first loss point after Start (the
page polled once a second over HTTP).

Run: .venv/bin/python bench/bench_first_point.py [--rounds 5] [--starts 3]. Prints a markdown table (for
docs/benchmarks.md).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_app import PagePolls, start_app  # noqa: E402 - after the repository is on the path

# The app's glyphs preset at its defaults but for what the page needs to start a run at once.
START = {"dataset": "glyphs", "batch_size": 128, "epochs": 12}


def process_ready_s(folder: Path, method: str) -> float:
    """Seconds from a run process's start to its Trainer's Ready, the process started by `method`."""
    import torch.multiprocessing

    from demo.runs import process as run_process
    from demo.runs.messages import LaunchSpec
    from memvir.config import TrainConfig

    if method == "spawn":
        context = torch.multiprocessing.get_context("spawn")
    else:
        context = run_process._start_context()
    original = run_process._start_context
    run_process._start_context = lambda: context
    try:
        config = TrainConfig(dataset="glyphs", batch_size=128, eval_at_start=False).to_dict()
        started = time.perf_counter()
        process = run_process.RunProcess(LaunchSpec(str(folder), config, 2), lambda event: None)
        process.wait_ready()
        ready_s = time.perf_counter() - started
        process.stop()
        process.join(60)
    finally:
        run_process._start_context = original
    return ready_s


def first_point(data_dir: Path) -> tuple[float, float, float]:
    """(seconds until a fresh `python app.py` answers with its starting page, until it serves the app's page, and
    from Start to the page's first loss point)."""
    from gradio_client import Client

    server, url, starting_s, page_s = start_app(data_dir)
    try:
        time.sleep(3)  # a visitor reads the page before pressing Start
        client = Client(url, verbose=False, httpx_kwargs={"timeout": 120})
        page = PagePolls(url, client.session_hash)
        clicked = time.perf_counter()
        client.predict(**START, api_name="/start_run")
        while "step 0 of" in (status := page.poll()) or "Training" not in status:
            time.sleep(0.02)
        first_s = time.perf_counter() - clicked
        client.predict(api_name="/stop_run")
        # the run's process saves its checkpoint as it stops: wait for it, or the data folder is removed under it
        while not page.poll().startswith(("**Stopped**", "**Finished**")):
            time.sleep(0.1)
    finally:
        server.terminate()
        server.wait(30)
    return starting_s, page_s, first_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="process starts of each kind, alternating")
    parser.add_argument("--starts", type=int, default=3, help="fresh app starts, each with one Start (0: none)")
    args = parser.parse_args()
    ready = {"spawn": [], "forkserver": []}
    with tempfile.TemporaryDirectory() as tmp:
        process_ready_s(Path(tmp) / "warm", "forkserver")  # the forkserver's own start, as the app's start does it
        for number in range(args.rounds):
            order = ("spawn", "forkserver") if number % 2 == 0 else ("forkserver", "spawn")
            for method in order:
                ready[method].append(process_ready_s(Path(tmp) / f"{method}-{number}", method))
        starts = [first_point(Path(tmp) / f"app-{number}") for number in range(args.starts)]
    spawn, fork = statistics.median(ready["spawn"]), statistics.median(ready["forkserver"])
    print("| measure | median (each) |")
    print("|---|---|")
    print(f"| run process ready, spawn (a fresh interpreter) | {spawn:.2f} s "
          f"({', '.join(f'{s:.2f}' for s in ready['spawn'])}) |")
    print(f"| run process ready, forked from the forkserver | {fork:.2f} s "
          f"({', '.join(f'{s:.2f}' for s in ready['forkserver'])}); {spawn / fork:.1f}x sooner |")
    measures = ("`python app.py` -> its starting page answers", "`python app.py` -> the app's page served",
                "Start -> first loss point on the page")
    for column, measure in enumerate(measures if starts else ()):
        print(f"| {measure} | {statistics.median(s[column] for s in starts):.2f} s "
              f"({', '.join(f'{s[column]:.2f}' for s in starts)}) |")


if __name__ == "__main__":
    main()
