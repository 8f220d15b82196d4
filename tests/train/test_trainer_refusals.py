"""Hostile input to the Trainer and to model folders: refused with a message that names the problem (a memory past
the limit, NaN embeddings, a damaged or absurd checkpoint), before anything is allocated, keeping what was saved."""

import json
import struct
from pathlib import Path

import huggingface_hub
import pytest
import torch

from memvir import TrainConfig, Trainer, checkpoint
from memvir.checkpoint import CheckpointError
from memvir.hub import load_model
from memvir.memory.size import MemoryLimitError
from memvir.models import embedding_model
from memvir.models.embedding_model import MAX_EMBEDDING_DIM, EmbeddingModel
from memvir.train.checks import TrainingDiverged

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ the trainer
def test_the_trainer_refuses_a_memory_past_the_limit_when_built_and_on_a_live_change(monkeypatch):
    monkeypatch.delenv("MEMVIR_MAX_MEMORY_BYTES", raising=False)
    with pytest.raises(MemoryLimitError, match="batch 32, 24 classes, dimension 128"):
        Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, memvir_n=10**6, memvir_m=10**6))
    trainer = Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, memvir_n=2, memvir_m=1))
    trainer.update(memvir_n=1000)  # 2,000 steps of 28 KB fit in 16 GiB, and so would N=2, M=9,999...
    with pytest.raises(MemoryLimitError):
        trainer.update(memvir_m=9_999)  # ...but not both: pending changes count together
    assert trainer._pending == {"memvir_n": 1000}


def test_the_trainer_stops_on_non_finite_embeddings_and_keeps_the_last_checkpoint(tmp_path):
    config = TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=2, memvir_n=2, memvir_m=0, warmup_epochs=0,
                         snapshot_every=0, eval_every=0, eval_at_start=False, checkpoint_every=2)
    trainer = Trainer(config, tmp_path)
    network = trainer._network
    trainer._network = lambda images: network(images) * (float("nan") if trainer.step >= 3 else 1.0)
    with pytest.raises(TrainingDiverged, match="embeddings or class weights became NaN or infinite at step 4"):
        trainer.run()
    assert trainer.state == "failed" and trainer.step == 3
    resumed = Trainer.from_run_folder(tmp_path)
    assert resumed.step == 2
    for memory in (trainer.memvir, resumed.memvir):
        stored = memory.state_dict()["_extra_state"]
        assert memory.num_stored == 2
        assert torch.isfinite(stored["embeddings"]).all() and torch.isfinite(stored["class_weights"]).all()


def test_on_a_gpu_non_finite_embeddings_stop_the_run_at_the_next_check_and_never_enter_the_memory(tmp_path):
    """What the Trainer does on a GPU (no per-step check by MemVir or the loss, one host sync where it logs or saves),
    forced here on the CPU: embeddings NaN from step 4 on are found at the next checked step (6), before its update,
    the memory holding zeros in place of the NaN steps; the last checkpoint (step 3) is kept."""
    config = TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=2, memvir_n=2, memvir_m=0, warmup_epochs=0,
                         snapshot_every=0, eval_every=0, eval_at_start=False, checkpoint_every=3, log_every=6)
    trainer = Trainer(config, tmp_path)
    assert not any(trainer._reports_at(step) for step in (4, 5)) and trainer._reports_at(6)
    trainer._checks_every_step = trainer.memvir.check_values = trainer.loss_fn.check_values = False
    network = trainer._network
    trainer._network = lambda images: network(images) * (float("nan") if trainer.step >= 3 else 1.0)
    with pytest.raises(TrainingDiverged, match="the loss became nan at step 4"):
        trainer.run()
    assert trainer.state == "failed" and trainer.step == 5
    stored = trainer.memvir.state_dict()["_extra_state"]
    assert torch.isfinite(stored["embeddings"]).all() and torch.isfinite(stored["class_weights"]).all()
    assert (stored["embeddings"] == 0).all() and (stored["class_weights"] == 0).all()  # steps 5 and 6, refused
    assert Trainer.from_run_folder(tmp_path).step == 3


# ------------------------------------------------------------------------------------------------ model folders
def saved_model(folder: Path) -> Path:
    EmbeddingModel(dataset="glyphs-mini").save_pretrained(folder)
    return folder


def test_one_checkpoint_error_and_one_set_of_file_names():
    assert embedding_model.CheckpointError is CheckpointError
    assert checkpoint.CONFIG_FILE == huggingface_hub.constants.CONFIG_NAME
    assert checkpoint.WEIGHTS_FILE == huggingface_hub.constants.SAFETENSORS_SINGLE_FILE
    sources = {path: path.read_text() for path in (ROOT / "memvir").rglob("*.py")}
    assert [p.name for p, text in sources.items() if "class CheckpointError" in text] == ["checkpoint.py"]
    assert [p.name for p, text in sources.items() if "os.replace(" in text or "mkstemp(" in text] == ["checkpoint.py"]


def test_from_pretrained_takes_the_mixins_strict_and_map_location(tmp_path):
    folder = saved_model(tmp_path / "model")
    model = EmbeddingModel.from_pretrained(folder, strict=True, map_location="cpu")
    assert model.embedding_dim == 128 and not model.training
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    save_file({**weights, "head.scale": torch.ones(1)}, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="Unexpected key"):
        EmbeddingModel.from_pretrained(folder)  # strict by default
    loose = EmbeddingModel.from_pretrained(folder, strict=False)
    assert torch.equal(loose.head.weight, weights["head.weight"])


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda data: data[: len(data) // 2], "incomplete metadata"),
        (lambda data: bytes(reversed(data)), "not a readable safetensors file"),
        (lambda data: struct.pack("<Q", 2**62) + data[8:], "header too large"),
        (lambda data: b"", "header too small"),
    ],
    ids=["truncated", "scrambled", "2**62 header", "empty"],
)
def test_a_damaged_weights_file_is_a_checkpoint_error_that_names_it(tmp_path, damage, message):
    folder = saved_model(tmp_path / "model")
    weights = folder / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    for load in (EmbeddingModel.from_pretrained, load_model):
        with pytest.raises(CheckpointError, match=message) as caught:
            load(folder)
        assert "model.safetensors" in str(caught.value) and "truncated or damaged" in str(caught.value)


@pytest.mark.parametrize(
    "config,message",
    [
        ({"embedding_dim": 10**9}, "embedding_dim must be at most 65,536, got 1,000,000,000"),
        ({"in_channels": 10**6}, "in_channels must be at most 256"),
        ({"image_size": 10**6}, "image_size must be at most 1,024"),
        ({"mean": 5}, "describes no valid model"),
    ],
)
def test_a_config_json_with_absurd_sizes_is_refused_before_allocating(tmp_path, config, message):
    folder = saved_model(tmp_path / "model")
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    with pytest.raises(CheckpointError, match=message):
        EmbeddingModel.from_pretrained(folder)


def test_a_config_json_that_is_not_json_is_a_checkpoint_error(tmp_path):
    folder = saved_model(tmp_path / "model")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        EmbeddingModel.from_pretrained(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="holds a JSON list"):
        EmbeddingModel.from_pretrained(folder)


def test_model_and_config_sizes_are_bounded():
    with pytest.raises(ValueError, match=f"embedding_dim must be at most {MAX_EMBEDDING_DIM:,}"):
        EmbeddingModel(embedding_dim=10**9)
    for values, message in (({"embedding_dim": 10**9}, "embedding_dim must be at most"),
                            ({"warmup_epochs": float("inf")}, "warmup_epochs must be a number from 0 to 1,000,000"),
                            ({"warmup_epochs": 1e308}, "warmup_epochs"),
                            ({"lr": float("inf")}, "lr must be > 0 and finite"),
                            ({"seed": 2**64}, "seed must be at most"),
                            ({"epochs": 0}, "epochs must be an integer >= 1")):
        with pytest.raises(ValueError, match=message):
            TrainConfig(dataset="glyphs-mini", **values).validate()
