"""Each rank's share of the loss (memvir.losses, "Shares"; docs/distributed.md) against the whole loss, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_loss_shares.py [--repeats 9] [--losses norm-softmax,...]
        [--batch 128 --classes 98 --dim 512 --n 5 --m 10] [--parts 1,2,3] [--gloo 2]

Shares: each loss's forward+backward at the given geometry (by default B=128, C=98, D=512, MemVir N=5, M=10 with the
memory full: k=5, the loss sees 768 rows and 588 classes), on consecutive MemVir outputs, one new step per repeat.
For every G of ``--parts`` there are G losses, one per rank, each keeping its own pairs as a rank's does; a repeat
times every share of every G on the same MemVir output, one after the other in this process (the order of the G
rotating), so the figures are the work one rank does, without the collectives. The process's CPU time, one thread:
on a shared, loaded machine the wall time mostly measures the wait for a core. Medians over the repeats; a share's
time is the slowest share of its G (the one the other ranks would wait for).

``--gloo G``: then G processes on this machine (gloo, one thread each) take the Trainer's step on the same inputs
(memvir.train.distributed, as tests/train/test_distributed.py does): each embeds nothing (its rows of the batch are
given), gathers them with autograd, runs MemVir and its share of the loss, backpropagates G times the share and
averages the class weights' gradient; the table has the slowest rank's median loss time (CPU time, as above) and
whole step (wall time, collectives included), next to one process doing the same with the whole loss.
"""

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_blocked_loss import MemoryFull  # noqa: E402

from memvir import LOSSES, build_loss  # noqa: E402
from memvir.train.distributed import World, shutdown  # noqa: E402


def timed_share(loss, x, w, out, share):
    """CPU seconds of one forward+backward of ``share`` of ``loss`` on MemVir's output ``out`` (live leaves x, w)."""
    x.grad = w.grad = None
    started = time.process_time()
    loss(*out, live=out.live, share=share).backward(retain_graph=True)
    return time.process_time() - started


def shares(args) -> list[str]:
    """The table of each loss's share times, in this process."""
    parts = [int(p) for p in args.parts.split(",")]
    print(f"## Shares: forward+backward of each rank's share in one process, B={args.batch} C={args.classes} "
          f"D={args.dim} N={args.n} M={args.m} (memory full), CPU time, medians of {args.repeats}\n")
    rows = ["| loss | " + " | ".join(f"G={g}: slowest share (ms)" for g in parts) + " | "
            + " | ".join(f"G=1 / G={g}" for g in parts if g > 1) + " |",
            "|---|" + "---:|" * (2 * len(parts) - (1 in parts))]
    print("\n".join(rows), flush=True)
    for name in args.losses.split(","):
        memory = MemoryFull(args.batch, args.classes, args.dim, args.n, args.m)
        losses = {g: [build_loss(name) for _ in range(g)] for g in parts}
        times = {g: [] for g in parts}
        for repeat in range(args.warmup + args.repeats):
            x, w, out = memory.next()
            order = parts[repeat % len(parts):] + parts[: repeat % len(parts)]
            for g in order:
                slowest = max(timed_share(loss, x, w, out, (r, g)) for r, loss in enumerate(losses[g]))
                if repeat >= args.warmup:
                    times[g].append(slowest)
        medians = {g: statistics.median(times[g]) * 1000 for g in parts}
        ratios = [f"{medians[1] / medians[g]:.2f}x" for g in parts if g > 1 and 1 in parts]
        rows.append(f"| {name} | " + " | ".join(f"{medians[g]:.1f}" for g in parts) + " | " + " | ".join(ratios)
                    + " |")
        print(rows[-1], flush=True)
    return rows


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gloo_rank(rank, port, world_size, args, results):
    """One rank of ``--gloo``: the Trainer's step with its share of the loss, timed; medians to ``results``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    world = World.from_environment()
    world.start(torch.device("cpu"))
    medians = {}
    for name in args.losses.split(","):
        memory = MemoryFull(args.batch, args.classes, args.dim, args.n, args.m)  # the same on every rank (seeded)
        loss_fn = build_loss(name)
        loss_times, step_times = [], []
        for repeat in range(args.warmup + args.repeats):
            x = torch.randn(args.batch, args.dim, generator=memory.generator).requires_grad_()
            w = torch.nn.Parameter(torch.randn(args.classes, args.dim, generator=memory.generator))
            labels = torch.randint(0, args.classes, (args.batch,), generator=memory.generator)
            rows = world.batch_rows(args.batch)
            world.sum(torch.zeros(()))  # every rank starts the step together
            started = time.perf_counter()
            out = memory.mv(world.gather_with_grad(x[rows]), world.gather(labels[rows]), w)
            loss_started = time.process_time()
            share = loss_fn(*out, live=out.live, share=world.loss_share)
            (share * world.world_size).backward()
            loss_time = time.process_time() - loss_started
            world.average_(w.grad)
            world.sum(share.detach())
            if repeat >= args.warmup:
                loss_times.append(loss_time)
                step_times.append(time.perf_counter() - started)
        medians[name] = (statistics.median(loss_times) * 1000, statistics.median(step_times) * 1000)
    results[rank] = medians
    shutdown()


def gloo(args) -> list[str]:
    """The table of the Trainer-like step on ``--gloo`` ranks against one process."""
    ranks = args.gloo
    with torch.multiprocessing.Manager() as manager:
        results = manager.dict()
        gloo_rank(0, free_port(), 1, args, results)  # one process: World() without a process group
        single = dict(results[0])
        torch.multiprocessing.spawn(gloo_rank, args=(free_port(), ranks, args, results), nprocs=ranks, join=True)
        per_rank = [dict(results[r]) for r in range(ranks)]
    print(f"\n## The Trainer's step on {ranks} gloo ranks (one thread each) against one process, medians of "
          f"{args.repeats}\n")
    rows = [f"| loss | 1 process: loss CPU (ms) | step wall (ms) | {ranks} ranks: slowest rank's loss CPU (ms) | "
            "step wall (ms) | loss: 1 / G |", "|---|---:|---:|---:|---:|---:|"]
    print("\n".join(rows), flush=True)
    for name in args.losses.split(","):
        loss_g = max(result[name][0] for result in per_rank)
        step_g = max(result[name][1] for result in per_rank)
        rows.append(f"| {name} | {single[name][0]:.1f} | {single[name][1]:.1f} | {loss_g:.1f} | {step_g:.1f} | "
                    f"{single[name][0] / loss_g:.2f}x |")
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--losses", default=",".join(LOSSES))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--classes", type=int, default=98)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--m", type=int, default=10)
    parser.add_argument("--parts", default="1,2,3")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default M+1: the kept "
                        "pairs fill)")
    parser.add_argument("--gloo", type=int, default=0, help="also time the step on this many gloo ranks")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.warmup is None:
        args.warmup = args.m + 1  # every step's pairs with the others kept once, as in a run past its first steps
    shares(args)
    if args.gloo:
        gloo(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
