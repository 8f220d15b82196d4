"""A run started from a checkpoint folder (TrainConfig.init_from, `--init`): which weights it starts from, which it
does not, what a resume does with it, and the refusals. The references are the checkpoint file's own tensors, read
with safetensors, and the class weights written out as the Trainer draws them (seed + 1)."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from memvir import TrainConfig, Trainer
from memvir.checkpoint import CheckpointError
from memvir.models.embedding_model import EmbeddingModel


def tiny_config(**overrides):
    values = dict(dataset="glyphs-mini", batch_size=32, epochs=1, memvir_n=0, snapshot_every=0, eval_every=0,
                  eval_at_start=False, log_every=1, checkpoint_every=1000, embedding_dim=32)
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def fixture_checkpoint(tmp_path_factory):
    """A checkpoint folder made the way a user makes one: a few steps on glyphs-mini, saved by the Trainer."""
    folder = tmp_path_factory.mktemp("pretrained")
    Trainer(tiny_config(max_steps=3, seed=5), folder).run()
    return folder


def checkpoint_tensors(folder):
    return load_file(str(folder / "model.safetensors"))


def assert_model_holds(model, tensors, prefixes):
    state = model.state_dict()
    names = [name for name in tensors if name.startswith(prefixes)]
    assert names, prefixes
    for name in names:
        assert torch.equal(state[name], tensors[name]), name


def test_the_run_starts_from_the_checkpoint_s_backbone_and_head_never_its_classes(fixture_checkpoint):
    tensors = checkpoint_tensors(fixture_checkpoint)
    trainer = Trainer(tiny_config(init_from=str(fixture_checkpoint), seed=1, max_steps=1))
    # every tensor of the file, BatchNorm's running statistics included, is the model's at its first step
    assert set(tensors) == set(trainer.model.state_dict())
    assert_model_holds(trainer.model, tensors, ("backbone.", "head."))
    assert trainer.initialisation.head_loaded
    assert trainer.initialisation.describe() == (
        f"backbone and embedding head from {fixture_checkpoint}; new class weights")
    # the class weights are this run's own draw (seed + 1), as in a run without --init
    expected = torch.randn(24, 32, generator=torch.Generator().manual_seed(2)) / math.sqrt(32)
    assert torch.equal(trainer.class_weights.detach(), expected)
    # and the start really is the model's: its first step trains from these weights
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    trainer.run()
    moved = [name for name, value in trainer.model.state_dict().items() if not torch.equal(value, before[name])]
    assert any(name.startswith("backbone.") for name in moved)


def test_another_embedding_dimension_takes_the_backbone_alone(fixture_checkpoint):
    tensors = checkpoint_tensors(fixture_checkpoint)
    trainer = Trainer(tiny_config(init_from=str(fixture_checkpoint), embedding_dim=16))
    assert_model_holds(trainer.model, tensors, ("backbone.",))
    assert trainer.model.head.weight.shape == (16, 256)
    assert not trainer.initialisation.head_loaded
    assert "the checkpoint's embedding is 32-d, this run's 16-d" in trainer.initialisation.describe()
    # without the init the same seed draws the same head: so the head above is the run's own, not the file's
    plain = Trainer(tiny_config(embedding_dim=16))
    assert torch.equal(trainer.model.head.weight, plain.model.head.weight)


def test_the_setting_is_kept_in_the_run_s_config_and_card(fixture_checkpoint, tmp_path):
    out = tmp_path / "run"
    Trainer(tiny_config(init_from=str(fixture_checkpoint), max_steps=2), out).run()
    assert json.loads((out / "train_config.json").read_text())["init_from"] == str(fixture_checkpoint)
    card = (out / "README.md").read_text()
    assert f"initialised from the checkpoint {fixture_checkpoint}" in card
    assert "trained from scratch" not in card


def test_a_resume_continues_from_its_own_weights_not_the_init(fixture_checkpoint, tmp_path):
    init = shutil.copytree(fixture_checkpoint, tmp_path / "init")
    out = tmp_path / "run"
    first = Trainer(tiny_config(init_from=str(init), max_steps=3, epochs=2), out)
    first.run()
    trained = load_file(str(out / "model.safetensors"))
    shutil.rmtree(init)  # a resume does not read the init folder at all
    resumed = Trainer.from_run_folder(out, max_steps=4)
    assert resumed.initialisation is None and resumed.step == 3
    assert_model_holds(resumed.model, trained, ("backbone.", "head."))
    assert resumed.config.init_from == str(init)  # the run still says where it started
    resumed.run()
    assert resumed.step == 4


def test_refusals_say_what_is_wrong_and_what_to_pass(fixture_checkpoint, tmp_path):
    with pytest.raises(CheckpointError, match="there is no such folder; pass a checkpoint folder"):
        Trainer(tiny_config(init_from=str(tmp_path / "nowhere")))
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        Trainer(tiny_config(init_from=str(tmp_path / "file")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is not a checkpoint: config.json and model.safetensors missing"):
        Trainer(tiny_config(init_from=str(tmp_path / "empty")))
    gn = tmp_path / "gn"
    EmbeddingModel(backbone="convnet-gn", embedding_dim=32, mean=(0.1,), std=(0.3,)).save_pretrained(gn)
    with pytest.raises(CheckpointError, match="holds a 'convnet-gn' backbone, but this run builds 'convnet': pass "
                                              "--backbone convnet-gn"):
        Trainer(tiny_config(init_from=str(gn)))
    rgb = tmp_path / "rgb"
    EmbeddingModel(embedding_dim=32, in_channels=3, mean=(0.5,) * 3, std=(0.2,) * 3).save_pretrained(rgb)
    with pytest.raises(CheckpointError, match="takes 3-channel images, but dataset glyphs-mini has 1-channel ones"):
        Trainer(tiny_config(init_from=str(rgb)))
    with pytest.raises(ValueError, match="pretrained .* and init_from .* both choose the starting weights"):
        tiny_config(init_from=str(fixture_checkpoint), pretrained=True)
    with pytest.raises(ValueError, match="init_from must be None or a checkpoint folder's path"):
        tiny_config(init_from="  ")
