"""The cost of `--report-to`: Trainer images/s reporting to none, tensorboard and trackio, in one sitting.

    .venv/bin/python bench/bench_report_to.py [--dataset glyphs-mini --steps 30 --rounds 3 --log-every 10]

The three runs of a round are interleaved and repeated (none, tensorboard, trackio, none, ...), so that a shared
machine's load falls on all of them alike; each run's rate is the images of its steps after the first few over their
time (the tracker is opened before the first step, at the run's start), and the table gives each tracker's median
rate over the rounds and its ratio to none's. trackio writes into a temporary folder (TRACKIO_DIR), TensorBoard into
the run folder; nothing leaves the machine.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACKERS = ("none", "tensorboard", "trackio")
SKIPPED_STEPS = 3  # the first steps of a process are slow for reasons of its own (allocations, first kernels)


def trainer_rate(config, out_dir: Path) -> float:
    from memvir.events import StepEvent
    from memvir.train.trainer import Trainer

    trainer = Trainer(config, out_dir)
    stamps = []
    trainer.add_listener(lambda e: stamps.append(time.perf_counter()) if isinstance(e, StepEvent) else None)
    trainer.run()
    measured = stamps[SKIPPED_STEPS:]
    return (len(measured) - 1) * config.batch_size / (measured[-1] - measured[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="glyphs-mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-every", type=int, default=10, help="the Trainer's default; 1 sends every step")
    args = parser.parse_args(argv)
    print("command: .venv/bin/python bench/bench_report_to.py " + " ".join(sys.argv[1:] if argv is None else argv))

    with tempfile.TemporaryDirectory(prefix="bench-report-to-") as folder:
        # before anything imports trackio, which reads it once: its store in the temporary folder
        os.environ["TRACKIO_DIR"] = str(Path(folder) / "trackio")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        from memvir.config import TrainConfig

        rates = {tracker: [] for tracker in TRACKERS}
        for round_index in range(args.rounds):
            for tracker in TRACKERS:
                config = TrainConfig(dataset=args.dataset, batch_size=args.batch_size, epochs=1000,
                                     max_steps=args.steps, log_every=args.log_every, eval_at_start=False,
                                     eval_every=0, snapshot_every=0, report_to=tracker, report_project="bench")
                out_dir = Path(folder) / f"{tracker}-{round_index}"
                rates[tracker].append(trainer_rate(config, out_dir))
                print(f"round {round_index + 1} {tracker}: {rates[tracker][-1]:.1f} images/s", flush=True)

    baseline = statistics.median(rates["none"])
    print(f"\n{args.dataset}, batch {args.batch_size}, {args.steps} steps a run (first {SKIPPED_STEPS} not timed), "
          f"log every {args.log_every} steps, {args.rounds} rounds, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| report to | images/s (median) | runs | ratio to none |")
    print("|---|---|---|---|")
    for tracker in TRACKERS:
        median = statistics.median(rates[tracker])
        runs = ", ".join(f"{rate:.1f}" for rate in rates[tracker])
        print(f"| {tracker} | {median:.1f} | {runs} | {median / baseline:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
