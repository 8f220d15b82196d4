"""A live change whose memory the device cannot hold, tried for real: the allocator's own refusal (on a GPU, torch's
OutOfMemoryError from CUDA) must leave the run training with its old memory and answer the change with
ControlRefused (memvir.train.trainer.Trainer.update). The unit tests make the allocation fail with a stand-in; this asks
the real allocator for a ring whose class-weight store alone is about 1.5 times the device's memory (one
allocation past it is refused at once; several smaller ones that together pass it could each succeed and then be
killed as their pages fill, which is what the app's budget is for).

    python bench/gpu_live_change.py --device cuda      (on a CPU it asks for 1.5 times the machine's memory)

It also prints the app's memory budget for a run on that device and the limit that bounds it
(demo.runs.memory_budget). Exit 0 when the run finished with the change refused and its memory as before.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from demo.runs.memory_budget import memory_budget  # noqa: E402
from memvir import TrainConfig, Trainer  # noqa: E402
from memvir.events import ControlRefused, StepEvent  # noqa: E402
from memvir.memory.size import MAX_MEMORY_ENV, STORE_DTYPES, format_bytes, ring_bytes  # noqa: E402


def device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    os.environ[MAX_MEMORY_ENV] = str(2**50)  # past the library's own limit: the allocator is what refuses here

    budget = memory_budget(None, device)
    print(f"budget on {device}: {format_bytes(budget.bytes) if budget else 'none'} "
          f"(bound by {budget.bound if budget else '-'}; {budget.source if budget else ''})")

    config = TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=2, memvir_n=2, memvir_m=1, warmup_epochs=0,
                         snapshot_every=0, eval_every=0, eval_at_start=False, log_every=1, checkpoint_every=1000,
                         device=args.device)
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(config, Path(folder) / "run")
        classes = trainer.data.info.num_train_classes
        weights_per_step = classes * config.embedding_dim * STORE_DTYPES[config.memvir_store_dtype].itemsize
        margin = int(1.5 * device_memory(device) / (config.memvir_n * weights_per_step))
        print(f"asking at step 4 for N = {config.memvir_n}, M = {margin:,}: a ring of "
              f"{format_bytes(ring_bytes(config.memvir_n, margin, config.batch_size, classes, config.embedding_dim))}"
              f" on a device of {format_bytes(device_memory(device))}")
        events = []
        trainer.add_listener(events.append)
        trainer.add_listener(lambda e: trainer.update(memvir_m=margin) if isinstance(e, StepEvent) and e.step == 4
                             else None)
        outcome = trainer.run()
        refused = [e for e in events if isinstance(e, ControlRefused)]
        steps = [e.step for e in events if isinstance(e, StepEvent)]
        print(f"run: {outcome}, {len(steps)} of {trainer.total_steps} steps")
        for event in refused:
            print(f"refused: {event.message}")
        ok = (outcome == "finished" and len(refused) == 1 and trainer.config.memvir_m == 1
              and trainer.memvir.capacity == 4 and steps == list(range(1, trainer.total_steps + 1)))
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
