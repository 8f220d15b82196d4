"""The cost of `--report-to`: Trainer images/s reporting to none, tensorboard and trackio, in one sitting.

    .venv/bin/python bench/bench_report_to.py [--dataset glyphs-mini --steps 30 --rounds 3 --log-every 10]

The runs are interleaved and repeated (none, tensorboard, trackio, none, ...), so that a shared machine's load falls
on all of them alike. Each run is timed over its steps after the first few (the tracker opens at the run's start,
before the first step) three ways:
- images/s by the wall clock, what a user sees, and on a shared machine mostly the other processes' load;
- images per second of this process's CPU time (all its threads: torch's, and trackio's sender), which the other
  processes' load barely moves;
- the share of the wall time spent inside the reporting listener (its calls, timed around them), and the share of
  the process's CPU time taken by the threads the tracker starts (trackio's sender, TensorBoard's event writer):
  together the listener's whole cost, as ratios that the other processes' load moves little.
The listener is the one the Trainer adds for `report_to` (memvir.train.reporting.reporter_for), added here with a
timer around it. trackio writes into a temporary folder (TRACKIO_DIR), TensorBoard into the run folder; nothing
leaves the machine.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACKERS = ("none", "tensorboard", "trackio")
SKIPPED_STEPS = 3  # the first steps of a process are slow for reasons of their own (allocations, first kernels)


def background_cpu() -> float:
    """CPU seconds used so far by this process's Python threads other than the main one (the tracker's: training
    runs in the main thread and its loader in it too, with num_workers 0)."""
    total = 0.0
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and thread.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, ProcessLookupError):  # ended since enumerate
                pass
    return total


def timed_run(config, out_dir: Path) -> dict:
    """Train `config` (its report_to served by the Trainer's listener, timed); images/s by wall and CPU clock, and
    the listener's share of the wall time, over the steps after the first SKIPPED_STEPS."""
    from memvir.events import StepEvent
    from memvir.train.distributed import World
    from memvir.train.reporting import reporter_for
    from memvir.train.trainer import Trainer

    trainer = Trainer(dataclasses.replace(config, report_to="none"), out_dir)
    stamps = []  # (wall, process CPU, listener seconds so far, other threads' CPU) at each step's event
    spent = [0.0]
    trainer.add_listener(lambda e: stamps.append((time.perf_counter(), time.process_time(), spent[0],
                                                  background_cpu())) if isinstance(e, StepEvent) else None)
    reporter = reporter_for(config, out_dir, World())
    if reporter is not None:
        def timed(event):
            started = time.perf_counter()
            reporter(event)
            spent[0] += time.perf_counter() - started

        trainer.add_listener(timed)
    trainer.run()
    (wall0, cpu0, spent0, other0), (wall1, cpu1, spent1, other1) = stamps[SKIPPED_STEPS], stamps[-1]
    images = (len(stamps) - 1 - SKIPPED_STEPS) * config.batch_size
    wall = wall1 - wall0
    return {"wall": images / wall, "cpu": images / (cpu1 - cpu0), "share": (spent1 - spent0) / wall,
            "threads": (other1 - other0) / (cpu1 - cpu0)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="glyphs-mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-every", type=int, default=10, help="the Trainer's default; 1 sends every step")
    parser.add_argument("--trackers", nargs="+", default=list(TRACKERS), choices=TRACKERS,
                        help="which to run (none first: the ratios are to it)")
    args = parser.parse_args(argv)
    print("command: .venv/bin/python bench/bench_report_to.py " + " ".join(sys.argv[1:] if argv is None else argv))

    with tempfile.TemporaryDirectory(prefix="bench-report-to-") as folder:
        # before anything imports trackio, which reads it once: its store in the temporary folder
        os.environ["TRACKIO_DIR"] = str(Path(folder) / "trackio")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        from memvir.config import TrainConfig

        trackers = ["none", *(tracker for tracker in args.trackers if tracker != "none")]
        results = {tracker: [] for tracker in trackers}
        for round_index in range(args.rounds):
            for tracker in trackers:
                config = TrainConfig(dataset=args.dataset, batch_size=args.batch_size, epochs=1000,
                                     max_steps=args.steps, log_every=args.log_every, eval_at_start=False,
                                     eval_every=0, snapshot_every=0, report_to=tracker, report_project="bench")
                result = timed_run(config, Path(folder) / f"{tracker}-{round_index}")
                results[tracker].append(result)
                print(f"round {round_index + 1} {tracker}: {result['wall']:.1f} images/s, {result['cpu']:.1f} "
                      f"images per CPU second, listener {100 * result['share']:.2f}% of the time, its threads "
                      f"{100 * result['threads']:.2f}% of the CPU", flush=True)

    def median(tracker, key):
        return statistics.median(result[key] for result in results[tracker])

    print(f"\n{args.dataset}, batch {args.batch_size}, {args.steps} steps a run (first {SKIPPED_STEPS} not timed), "
          f"log every {args.log_every} steps, {args.rounds} rounds, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; medians over the rounds")
    print("| report to | images/s (wall) | ratio to none | images per CPU second | ratio to none "
          "| time in the listener | CPU in its threads |")
    print("|---|---|---|---|---|---|---|")
    for tracker in trackers:
        wall, cpu = median(tracker, "wall"), median(tracker, "cpu")
        print(f"| {tracker} | {wall:.1f} | {wall / median('none', 'wall'):.3f} | {cpu:.1f} | "
              f"{cpu / median('none', 'cpu'):.3f} | {100 * median(tracker, 'share'):.2f}% | "
              f"{100 * median(tracker, 'threads'):.2f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
