"""Every use memvir makes of huggingface_hub outside its documented API, in one place.

`PyTorchModelHubMixin` keeps the configuration it writes to config.json in `_hub_mixin_config`, filled from the
constructor's arguments it can serialise (it silently drops the rest, a numpy mean, say); `EmbeddingModel` writes its
checked, plain-Python config there itself. And `_load_as_safetensor` is the mixin's own strict safetensors load, which
`EmbeddingModel._from_pretrained` calls once it has built the model from its config. Written for huggingface_hub
2.4.0 (requirements.txt); the training image of a GPU machine may carry another version, so the check here is of the
two private names themselves, at import, and tests/models/test_hub_shims.py fails loudly on a version change.
"""

from __future__ import annotations

from huggingface_hub import PyTorchModelHubMixin

if not callable(getattr(PyTorchModelHubMixin, "_load_as_safetensor", None)):
    raise ImportError(
        "this huggingface_hub has no PyTorchModelHubMixin._load_as_safetensor, which memvir's EmbeddingModel loads "
        "its weights with: install the version pinned in requirements.txt (pip install -r requirements.txt)"
    )


def set_config(model: PyTorchModelHubMixin, config: dict) -> None:
    """What `model.save_pretrained` writes to config.json."""
    model._hub_mixin_config = config


def config_of(model: PyTorchModelHubMixin) -> dict:
    """The dict `model.save_pretrained` writes to config.json (the model's own, not a copy)."""
    return model._hub_mixin_config


def load_safetensors(cls: type[PyTorchModelHubMixin], model, weights_file: str, map_location: str, strict: bool):
    """`model` with the weights of `weights_file` loaded by the mixin (key checking as `strict`)."""
    return cls._load_as_safetensor(model, weights_file, map_location, strict=strict)
