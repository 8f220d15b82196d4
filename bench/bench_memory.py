"""MemVir's cost per step at the reference CARS196 geometry, measured against the loss it feeds, in one run.

    .venv/bin/python bench/bench_memory.py [--batch 128 --classes 98 --dim 512 --n 45 --m 10]

Prints a markdown table: the augmentation step alone (memory full), the Norm-softmax loss forward+backward on the
plain batch and on the augmented batch, their ratios, the ring's bytes in float32 and float16, and whether a full
memory re-allocates its ring between steps.
"""

import argparse
import sys
from pathlib import Path

import torch
from torch.utils.benchmark import Timer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memvir import MemVir, build_loss  # noqa: E402


def full_memory(args, store_dtype=None):
    mv = MemVir(args.n, args.m, store_dtype=store_dtype)
    gen = torch.Generator().manual_seed(0)
    for _ in range(mv.capacity):
        x = torch.nn.functional.normalize(torch.randn(args.batch, args.dim, generator=gen), dim=1)
        mv(x, torch.randint(0, args.classes, (args.batch,), generator=gen), torch.randn(args.classes, args.dim))
    return mv


def median_ms(stmt, env):
    return Timer(stmt=stmt, globals=env).blocked_autorange(min_run_time=1.0).median * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--classes", type=int, default=98)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--n", type=int, default=45)
    parser.add_argument("--m", type=int, default=10)
    args = parser.parse_args()
    print("command: .venv/bin/python bench/bench_memory.py " + " ".join(sys.argv[1:]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={args.batch} C={args.classes} "
          f"D={args.dim} N={args.n} M={args.m}\n")

    loss_fn = build_loss("norm-softmax")
    x = torch.nn.functional.normalize(torch.randn(args.batch, args.dim), dim=1).requires_grad_()
    y = torch.randint(0, args.classes, (args.batch,))
    w = torch.randn(args.classes, args.dim, requires_grad=True)
    rows = []
    for label, store_dtype in (("float32", None), ("float16", torch.float16)):
        mv = full_memory(args, store_dtype)
        pointers = (mv._embeddings.data_ptr(), mv._weights.data_ptr())
        env = {"mv": mv, "x": x, "y": y, "w": w, "loss_fn": loss_fn}
        augment = median_ms("mv(x, y, w)", env)
        in_place = pointers == (mv._embeddings.data_ptr(), mv._weights.data_ptr())
        ax, ay, aw = mv(x, y, w)
        env.update(ax=ax, ay=ay, aw=aw)
        loss_plain = median_ms("loss_fn(x, y, w).backward()", env)
        loss_augmented = median_ms("loss_fn(ax, ay, aw).backward(retain_graph=True)", env)
        rows.append((label, augment, loss_plain, loss_augmented, mv.memory_bytes(), in_place, mv.num_virtual_sets))

    print("| store | augment (ms) | loss fwd+bwd, plain batch (ms) | loss fwd+bwd, augmented (ms) "
          "| augment / plain loss | augment / augmented loss | ring bytes | ring re-allocated per step |")
    print("|---|---|---|---|---|---|---|---|")
    for label, augment, plain, augmented, nbytes, in_place, _ in rows:
        print(f"| {label} | {augment:.2f} | {plain:.2f} | {augmented:.2f} | {augment / plain:.2f} "
              f"| {augment / augmented:.2f} | {nbytes / 1e6:.1f} MB | {'no' if in_place else 'YES'} |")
    print(f"\nvirtual sets in use: {rows[0][-1]} (augmented batch {(rows[0][-1] + 1) * args.batch} rows, "
          f"{(rows[0][-1] + 1) * args.classes} classes)")


if __name__ == "__main__":
    main()
