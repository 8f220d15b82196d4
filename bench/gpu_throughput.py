"""Training throughput of resnet50 with and without MemVir at the reference CARS196 geometry, on synthetic images.

    python bench/gpu_throughput.py [--device cuda --image-size 224 --batch-size 128 --classes 98 --memvir-n 45
                                    --memvir-m 10 --steps 30 --warmup 5 --compile --out FILE]

What is timed is the Trainer's step without data loading: images already on the device (random, fixed), the
network forward in bfloat16 autocast and channels_last on a GPU, MemVir, Norm-softmax, backward, Adam, as the
Trainer runs them: the loss given MemVir's output as it is (its blocks, the live step's pairs kept: memvir.losses,
"Blocks" and "Cache") and no per-step value check (the Trainer checks at its logging cadence on a GPU). Rows: the
baseline (N=0), MemVir with a full memory (all N virtual sets in use) storing float32, the same with the loss over the
whole concatenated matrix (the computation before the blocks), the same storing float16, and with --compile the MemVir
row again with torch.compile. The memory is filled before timing with random embeddings: the step's cost does not
depend on what the memory holds, only on how much. On a GPU the timed steps of every row run under
`torch.cuda.set_sync_debug_mode("error")`: a step that waits for the GPU (a host sync) fails its row, named.
Columns: images/s, ms per step, peak GPU memory of the timed steps (CUDA only), the memory ring's size.
It is `bench/gpu.sh`'s first part (not one of `make bench`'s CPU scripts: its name does not start with bench_).
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memvir import MemVir, build_loss  # noqa: E402
from memvir.data.transforms import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from memvir.models.embedding_model import EmbeddingModel  # noqa: E402


def build_step(args, device: torch.device, memvir: MemVir, compile_network: bool, whole_matrix: bool = False):
    """The components of a Trainer step at the bench geometry and one step as a function (returns the loss)."""
    torch.manual_seed(0)
    model = EmbeddingModel(backbone=args.backbone, embedding_dim=args.embedding_dim, in_channels=3,
                           image_size=args.image_size, mean=IMAGENET_MEAN, std=IMAGENET_STD, dataset="synthetic",
                           image_kind="photo").to(device)
    cuda = device.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    network = torch.compile(model) if compile_network else model
    class_weights = nn.Parameter(torch.randn(args.classes, args.embedding_dim, device=device) / args.embedding_dim**0.5)
    loss_fn = build_loss("norm-softmax")
    loss_fn.check_values = False  # its labels checked where the batch is made, as the Trainer does
    optimizer = torch.optim.Adam([{"params": model.parameters(), "lr": 1e-4}, {"params": [class_weights], "lr": 1e-2}],
                                 eps=0.01, weight_decay=1e-4)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    if cuda:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(args.classes, (args.batch_size,), device=device)
    model.train()

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            embeddings = network(images)
        out = memvir(embeddings.float(), labels, class_weights)
        loss = loss_fn(*out) if whole_matrix else loss_fn(*out, live=out.live)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step, class_weights


def fill(memvir: MemVir, args, device: torch.device, class_weights: torch.Tensor) -> None:
    """Store N(M+1) random steps, so every timed step uses all N virtual sets."""
    generator = torch.Generator(device=device).manual_seed(1)
    with torch.no_grad():
        for _ in range(memvir.capacity):
            embeddings = F.normalize(torch.randn(args.batch_size, args.embedding_dim, device=device,
                                                 generator=generator), dim=1)
            labels = torch.randint(args.classes, (args.batch_size,), device=device, generator=generator)
            memvir(embeddings, labels, class_weights)


def measure(args, device: torch.device, label: str, num_steps: int, store_dtype, compile_network: bool,
            whole_matrix: bool = False) -> dict:
    memvir = MemVir(num_steps, args.memvir_m if num_steps else 0, store_dtype=store_dtype, check_values=False,
                    live_pairs=True)
    step, class_weights = build_step(args, device, memvir, compile_network, whole_matrix)
    fill(memvir, args, device, class_weights.detach())
    cuda = device.type == "cuda"
    for _ in range(args.warmup):  # first convolutions pick their algorithms, Adam allocates, compile compiles
        step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    host_syncs = "none" if cuda else "-"
    started = time.perf_counter()
    try:
        if cuda:  # a step that makes the host wait for the GPU raises here, naming the operation
            torch.cuda.set_sync_debug_mode("error")
        losses = [step() for _ in range(args.steps)]
    except RuntimeError as error:
        host_syncs = f"a host sync: {str(error).splitlines()[0][:120]}"
        losses = [step() for _ in range(args.steps)]  # timed again without the check, so the row has its figure
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    loss = float(torch.stack(losses)[-1])  # one sync at the end, not one per step
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    return {
        "run": label,
        "virtual_sets": memvir.num_virtual_sets,
        "classes": args.classes * (memvir.num_virtual_sets + 1),
        "images_per_s": args.batch_size * args.steps / elapsed,
        "ms_per_step": 1e3 * elapsed / args.steps,
        "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
        "store_mib": memvir.memory_bytes() / 2**20,
        "loss": loss,
        "host_syncs": host_syncs,
    }


def table(rows: list[dict], header: str) -> str:
    lines = [header, "", "| run | virtual sets | classes | images/s | vs baseline | ms/step | peak GPU MiB | memory "
             "store MiB | host syncs in the timed steps |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        peak = "-" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}"
        lines.append(f"| {row['run']} | {row['virtual_sets']} | {row['classes']} | {row['images_per_s']:.0f} | "
                     f"{row['images_per_s'] / rows[0]['images_per_s']:.3f} | {row['ms_per_step']:.1f} | {peak} | "
                     f"{row['store_mib']:.1f} | {row['host_syncs']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--classes", type=int, default=98)
    parser.add_argument("--embedding-dim", type=int, default=512)
    parser.add_argument("--memvir-n", type=int, default=45)
    parser.add_argument("--memvir-m", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--compile", action="store_true", help="add a row with torch.compile")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA GPU; use --device cpu for a dry run",
              file=sys.stderr)
        return 2

    n, m = args.memvir_n, args.memvir_m
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    header = (f"{args.backbone} at {args.image_size} px, B={args.batch_size}, C={args.classes}, "
              f"D={args.embedding_dim}, Norm-softmax, Adam; {where}; torch {torch.__version__}; {args.steps} timed "
              f"steps after {args.warmup}; synthetic images already on the device (no data loading).\n"
              "command: python bench/gpu_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv))
    plans = [("baseline (N=0)", 0, None, False, False),
             (f"MemVir N={n} M={m}, memory full, float32 store", n, None, False, False),
             (f"MemVir N={n} M={m}, float32 store, the loss over the whole matrix (before the blocks)", n, None, False,
              True),
             (f"MemVir N={n} M={m}, memory full, float16 store", n, torch.float16, False, False)]
    if args.compile:
        plans.append((f"MemVir N={n} M={m}, float32 store, torch.compile", n, None, True, False))
    rows = []
    for label, num_steps, store_dtype, compile_network, whole_matrix in plans:
        rows.append(measure(args, device, label, num_steps, store_dtype, compile_network, whole_matrix))
        print(f"measured: {label}", file=sys.stderr, flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    text = table(rows, header)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
