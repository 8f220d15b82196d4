"""The Trainer's step with MemVir against the baseline's, interleaved in one process: the loss's kept pairs
(memvir.losses, "Cache") measured where they matter, a whole training step.

    .venv/bin/python bench/bench_memvir_step.py [--repeats 40 --n 5 --m 10]

Four Trainers on `glyphs` (batch 128, no loader worker, the same pre-loaded batches): the baseline (N=0), MemVir(N, M)
with its memory full as the Trainer runs it (the live step's pairs kept: no stored block computed), the same with
MemVir's `live_pairs` off (the loss keeps the pairs it computes from the stored data: 2k-1 stored blocks a step), and
the same with its loss given a plain (B, C), so that it keeps no pair and computes every stored block at every step.
Their steps are interleaved (the order rotating) and the medians compared, so a
shared machine's load falls on all three alike; the process's CPU time per step beside the wall time (on a core that
others share, the wall time also measures the wait for it: pin the run, `taskset -c 1`).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--m", type=int, default=10)
    args = parser.parse_args()
    print("command: .venv/bin/python bench/bench_memvir_step.py " + " ".join(sys.argv[1:]))

    import torch

    from memvir import TrainConfig
    from memvir.train.trainer import Trainer

    common = dict(dataset="glyphs", batch_size=128, eval_at_start=False, eval_every=0, snapshot_every=0,
                  checkpoint_every=10**6, log_every=10**6, num_workers=0, max_steps=10**6)
    memvir = dict(memvir_n=args.n, memvir_m=args.m, warmup_epochs=0)
    trainers = {"baseline": Trainer(TrainConfig(**common, memvir_n=0)),
                "MemVir (the Trainer's default)": Trainer(TrainConfig(**common, **memvir)),
                "MemVir, live pairs off": Trainer(TrainConfig(**common, **memvir)),
                "MemVir, every stored block every step": Trainer(TrainConfig(**common, **memvir))}
    trainers["MemVir, live pairs off"].memvir.live_pairs = False
    every_block = trainers["MemVir, every stored block every step"].loss_fn
    keeping_forward = every_block.forward

    def forward_without_kept_pairs(*inputs, live=None, **options):
        return keeping_forward(*inputs, live=None if live is None else tuple(live), **options)

    every_block.forward = forward_without_kept_pairs
    loader = iter(trainers["baseline"].batches.epoch(0, 0))
    batches = [next(loader) for _ in range(8)]
    fill = args.n * (args.m + 1) + 1  # the memory full, and every pair of the last M+1 steps seen once
    for trainer in trainers.values():
        for step in range(fill + args.m + 1 if trainer.memvir.num_steps else 5):
            trainer._train_step(*batches[step % len(batches)], 0)
    times = {name: [] for name in trainers}
    cpu_times = {name: [] for name in trainers}
    names = list(trainers)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:
            started, cpu_started = time.perf_counter(), time.process_time()
            trainers[name]._train_step(*batches[repeat % len(batches)], 0)
            times[name].append(time.perf_counter() - started)
            cpu_times[name].append(time.process_time() - cpu_started)
    k = trainers["MemVir (the Trainer's default)"].memvir.num_virtual_sets
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; MemVir(N={args.n}, M={args.m}), k = {k}, "
          f"{args.repeats} interleaved steps each; medians of the wall time and of the process's CPU time\n")
    print("| run | ms/step | images/s | vs baseline | CPU ms/step | CPU images/s | vs baseline (CPU) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    baseline, cpu_baseline = statistics.median(times["baseline"]), statistics.median(cpu_times["baseline"])
    for name in trainers:
        median, cpu_median = statistics.median(times[name]), statistics.median(cpu_times[name])
        print(f"| {name} | {median * 1e3:.0f} | {128 / median:.0f} | {baseline / median:.2f} "
              f"| {cpu_median * 1e3:.0f} | {128 / cpu_median:.0f} | {cpu_baseline / cpu_median:.3f} |")


if __name__ == "__main__":
    main()
