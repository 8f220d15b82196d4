"""memvir._hub_shims, memvir's one door to huggingface_hub's private parts: it fails loudly here when an upgrade
moves them, and the import-time check refuses a mixin without them in words."""

import json
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import PyTorchModelHubMixin

from memvir import _hub_shims
from memvir.models.embedding_model import EmbeddingModel

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"


def test_huggingface_hub_is_the_pinned_version_with_the_private_names_the_shims_use():
    pins = dict(line.strip().split("==") for line in REQUIREMENTS.read_text().splitlines() if "==" in line)
    assert huggingface_hub.__version__ == pins["huggingface-hub"]
    assert callable(PyTorchModelHubMixin._load_as_safetensor)


def test_the_config_set_through_the_shim_is_what_save_pretrained_writes(tmp_path):
    model = EmbeddingModel(backbone="convnet", embedding_dim=8, in_channels=1, image_size=32, mean=[0.5], std=[0.5])
    config = _hub_shims.config_of(model)
    assert config is _hub_shims.config_of(model) and config["embedding_dim"] == 8
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == config
    loaded = EmbeddingModel.from_pretrained(tmp_path)  # through load_safetensors
    assert loaded.config == config
    for name, tensor in model.state_dict().items():
        assert tensor.equal(loaded.state_dict()[name]), name


def test_a_mixin_without_the_private_loader_is_refused_in_words(monkeypatch):
    _hub_shims.check_mixin_internals()  # the pinned version passes
    monkeypatch.delattr(PyTorchModelHubMixin, "_load_as_safetensor")
    with pytest.raises(ImportError, match=r"no PyTorchModelHubMixin\._load_as_safetensor.*pip install -r requirements"):
        _hub_shims.check_mixin_internals()
