"""Data loading from a Hub dataset against the training step: images/s the loader decodes (JPEG bytes from 🤗 datasets'
Arrow rows -> the photo train transform at 224 px) with 0, 1, 2 workers, beside the images/s of a training step of
resnet18 at 224 px on the same batches (forward, loss, backward, Adam; MemVir off), on this machine.

    .venv/bin/python bench/bench_hub_loading.py [--images 512 --classes 32 --batch-size 32 --workers 0 1 2]
    .venv/bin/python bench/bench_hub_loading.py --dataset hf:OWNER/NAME   # a real repo instead (needs the Hub)

By default the rows are made here: photo-sized JPEGs (500 x 375, CUB's typical size, smooth random content, quality
90) in an in-memory 🤗 Dataset with an Image and a ClassLabel column, split by `memvir.data.hub.dataset.hub_splits`,
the same code that splits a repo that `load_dataset` fetched; so the decode path is the one a Hub run takes, without
the download (which 🤗 datasets does once, into its cache, before training). Loader rate: the images of the batches
after the first two (workers starting) over their time, batches drawn as the Trainer draws them
(memvir.data.batches.TrainingBatches). Step rate: the median over steps after two warm-up steps.
"""

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARM_UP_BATCHES = 2


def synthetic_dataset(images: int, classes: int, seed: int = 0):
    """A 🤗 DatasetDict of `images` JPEGs (500 x 375) in `classes` classes, one "train" split."""
    import numpy as np
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    rows = {"image": [], "label": []}
    for index in range(images):
        coarse = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)  # smooth content: upsampled noise
        picture = PILImage.fromarray(coarse).resize((500, 375), PILImage.BICUBIC)
        buffer = io.BytesIO()
        picture.save(buffer, "JPEG", quality=90)
        rows["image"].append({"bytes": buffer.getvalue(), "path": None})
        rows["label"].append(index % classes)
    features = Features({"image": Image(), "label": ClassLabel(names=[f"class-{c}" for c in range(classes)])})
    return DatasetDict({"train": Dataset.from_dict(rows, features=features)})


def loader_rate(split, batch_size: int, workers: int, batches: int) -> float:
    from memvir.data.batches import TrainingBatches

    loader = TrainingBatches(split, batch_size, seed=0, num_workers=workers)
    stamps = []
    for epoch in range(1000):
        for _ in loader.epoch(epoch, 0):
            stamps.append(time.perf_counter())
            if len(stamps) >= batches + WARM_UP_BATCHES:
                measured = stamps[WARM_UP_BATCHES - 1:]
                return (len(measured) - 1) * batch_size / (measured[-1] - measured[0])
    raise RuntimeError("the dataset ran out of batches")


def step_rate(split, batch_size: int, steps: int) -> float:
    import torch

    from memvir.losses import build_loss
    from memvir.models.embedding_model import EmbeddingModel

    torch.manual_seed(0)
    model = EmbeddingModel(backbone="resnet18", embedding_dim=128, in_channels=3, image_size=224,
                           mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], dataset="bench", image_kind="photo")
    class_weights = torch.nn.Parameter(torch.randn(split.num_classes, 128))
    loss_fn = build_loss("norm-softmax")
    optimizer = torch.optim.Adam([*model.parameters(), class_weights], lr=1e-4, eps=0.01)
    images = torch.stack([split[i][0] for i in range(batch_size)])  # decoded once: the step alone is timed
    labels = torch.as_tensor(split.labels[:batch_size])
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        loss = loss_fn(model(images), labels, class_weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return batch_size / statistics.median(times[2:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=None, help="hf:OWNER/NAME to measure a real repo (default: made here)")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--classes", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batches", type=int, default=8, help="batches timed per worker count")
    parser.add_argument("--steps", type=int, default=5, help="training steps timed")
    args = parser.parse_args(argv)
    print("command: .venv/bin/python bench/bench_hub_loading.py " + " ".join(sys.argv[1:] if argv is None else argv))

    import torch

    from memvir.data import load_dataset
    from memvir.data.hub.dataset import hub_splits

    if args.dataset:
        splits = load_dataset(args.dataset, image_size=224)
    else:
        splits = hub_splits("synthetic", synthetic_dataset(args.images, args.classes), 224, "imagenet", 0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(splits.train)} training images, "
          f"batch {args.batch_size}, 224 px")
    print("| what | images/s |\n|---|---|")
    for workers in args.workers:
        rate = loader_rate(splits.train, args.batch_size, workers, args.batches)
        print(f"| loader, {workers} worker(s): decode + train transform | {rate:.1f} |", flush=True)
    print(f"| training step, resnet18 at 224 px, norm-softmax, MemVir off | "
          f"{step_rate(splits.train, args.batch_size, args.steps):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
