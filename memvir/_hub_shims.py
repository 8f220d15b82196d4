"""Every use memvir makes of huggingface_hub outside its documented API, or that depends on its version, in one place.

Two kinds. What the front ends (the CLI, the app) tell huggingface_hub before using it, so that it sends only the
requests asked of it: huggingface_hub 2.4.0 builds its user agent on every request; unless telemetry is off, the
first one in a process also fetches `{HF_ENDPOINT}/api/agent-harnesses` with a timeout of its own
(utils._detect_agent), before the request that was asked for, so against a Hub that does not answer
`memvir.hub.pull`'s look-up waits for both timeouts. Its only switch is the telemetry setting
(HF_HUB_DISABLE_TELEMETRY, DISABLE_TELEMETRY or DO_NOT_TRACK), which huggingface_hub reads once, when it is imported.

And the internals of `PyTorchModelHubMixin` that `EmbeddingModel` relies on: the mixin keeps the configuration it
writes to config.json in `_hub_mixin_config`, filled from the constructor's arguments it can serialise (it silently
drops the rest, a numpy mean, say), so `EmbeddingModel` writes its checked, plain-Python config there itself; and
`_load_as_safetensor` is the mixin's own strict safetensors load, which `EmbeddingModel._from_pretrained` calls once
it has built the model from its config.

Written for huggingface_hub 2.4.0 (requirements.txt); the training image of a GPU machine may carry another version,
so `check_mixin_internals` checks the private names themselves (memvir.models.embedding_model calls it at import),
and tests/test_hub_shims.py fails loudly on a version change. huggingface_hub is imported inside the one function
that needs it: `turn_off_side_requests` must be callable before anything imports huggingface_hub.
"""

from __future__ import annotations

import os
import sys

TELEMETRY_VARIABLE = "HF_HUB_DISABLE_TELEMETRY"


def turn_off_side_requests() -> None:
    """Turn huggingface_hub's telemetry (and with it the agent-harness look-up) off, unless the user set
    HF_HUB_DISABLE_TELEMETRY themselves: an explicit choice, either way, stands.

    Call it before huggingface_hub is imported; if it already was (gradio imports it), its setting is changed too,
    since it read the variable at import.
    """
    if TELEMETRY_VARIABLE in os.environ:
        return
    os.environ[TELEMETRY_VARIABLE] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_DISABLE_TELEMETRY = True


def check_mixin_internals() -> None:
    """ImportError, saying what to install, unless this huggingface_hub's mixin has the private loader used here."""
    from huggingface_hub import PyTorchModelHubMixin  # not at the top: see turn_off_side_requests

    if not callable(getattr(PyTorchModelHubMixin, "_load_as_safetensor", None)):
        raise ImportError(
            "this huggingface_hub has no PyTorchModelHubMixin._load_as_safetensor, which memvir's EmbeddingModel "
            "loads its weights with: install the version pinned in requirements.txt (pip install -r requirements.txt)"
        )


def set_config(model, config: dict) -> None:
    """What `model.save_pretrained` (a PyTorchModelHubMixin) writes to config.json."""
    model._hub_mixin_config = config


def config_of(model) -> dict:
    """The dict `model.save_pretrained` writes to config.json (the model's own, not a copy)."""
    return model._hub_mixin_config


def load_safetensors(cls, model, weights_file: str, map_location: str, strict: bool):
    """`model` with the weights of `weights_file` loaded by the mixin class `cls` (key checking as `strict`)."""
    return cls._load_as_safetensor(model, weights_file, map_location, strict=strict)
