"""Trainer throughput against a bare forward+backward of the same model, and the time from command to first step.

    .venv/bin/python bench/bench_train.py [--steps 40 --batch-size 128]

Everything is measured in this one run (ratios, since the machine is shared): the bare loop feeds pre-loaded
batches to model -> Norm-softmax -> backward -> Adam; the Trainer runs the same model on `glyphs` with its data
loading, per-sample augmentation seeds, events and MemVir (baseline N=0, and N=5, M=10 with a full memory).
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIRST_STEP_SCRIPT = """
import time
start = time.perf_counter()
from memvir import TrainConfig, Trainer
from memvir.events import StepEvent
imported = time.perf_counter()
trainer = Trainer(TrainConfig(dataset="glyphs", eval_at_start=False, max_steps=1, snapshot_every=0))
ready = time.perf_counter()
first = []
trainer.add_listener(lambda e: first.append(time.perf_counter()) if isinstance(e, StepEvent) else None)
trainer.run()
print(f"{imported - start:.2f} {ready - imported:.2f} {first[0] - ready:.2f} {first[0] - start:.2f}")
"""


def bare_rate(trainer, steps: int) -> float:
    import torch

    from memvir.losses import build_loss

    model, weights = trainer.model, trainer.class_weights
    loss_fn = build_loss("norm-softmax")
    optimizer = torch.optim.Adam([{"params": model.parameters()}, {"params": [weights], "lr": 1e-2}], lr=1e-3,
                                 eps=0.01)
    loader = iter(trainer.batches.epoch(0, 0))
    batches = [next(loader) for _ in range(4)]
    model.train()

    def step(i):
        images, labels = batches[i % 4]
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(images), labels, weights).backward()
        optimizer.step()
        return images.shape[0]

    for i in range(5):  # the first convolutions of a process and Adam's first step are slow: not measured
        step(i)
    start = time.perf_counter()
    images_seen = sum(step(i) for i in range(steps))
    return images_seen / (time.perf_counter() - start)


def trainer_rate(config, steps: int, skip: int) -> float:
    from memvir.events import StepEvent
    from memvir.train.trainer import Trainer

    trainer = Trainer(config)
    stamps = []
    trainer.add_listener(lambda e: stamps.append(time.perf_counter()) if isinstance(e, StepEvent) else None)
    trainer.run()
    measured = stamps[skip:]
    return (len(measured) - 1) * config.batch_size / (measured[-1] - measured[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    print("command: .venv/bin/python bench/bench_train.py " + " ".join(sys.argv[1:]))

    import torch

    from memvir import TrainConfig, Trainer

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    common = dict(dataset="glyphs", batch_size=args.batch_size, eval_at_start=False, eval_every=0,
                  snapshot_every=0, checkpoint_every=10_000)
    # The memory fills after warm-up + N(M+1) = 55 steps; measure after it, with the class count at its maximum.
    skip_full = 5 * 11 + 1
    rows = []
    reference = Trainer(TrainConfig(**common, memvir_n=0, max_steps=1))
    bare = bare_rate(reference, args.steps)
    rows.append(("bare forward+backward+Adam (pre-loaded batches)", bare))
    for label, extra, skip in (
        ("Trainer, baseline N=0, 0 loader workers", dict(memvir_n=0, num_workers=0), 3),
        ("Trainer, baseline N=0, 1 loader worker", dict(memvir_n=0, num_workers=1), 3),
        ("Trainer, MemVir N=5 M=10 (memory full), 1 loader worker",
         dict(memvir_n=5, memvir_m=10, warmup_epochs=0, num_workers=1), skip_full),
    ):
        config = TrainConfig(**common, **extra, max_steps=skip + args.steps)
        rows.append((label, trainer_rate(config, args.steps, skip)))

    print("| run | images/s | vs bare |")
    print("|---|---:|---:|")
    for label, rate in rows:
        print(f"| {label} | {rate:.0f} | {rate / bare:.2f} |")

    out = subprocess.run([sys.executable, "-c", FIRST_STEP_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True).stdout.split()
    print("\n| from a fresh process (glyphs cache warm) | seconds |")
    print("|---|---:|")
    for label, value in zip(("imports", "dataset + model + optimizer", "first step", "total to first step"), out,
                            strict=True):
        print(f"| {label} | {value} |")


if __name__ == "__main__":
    main()
