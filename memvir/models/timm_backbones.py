"""Backbones from timm: `timm:NAME`, any timm image model (architecture, optionally `.tag`), ending in its pooled
features, with its pretrained weights read from the Hugging Face Hub through timm's own loader.

timm builds the model (`timm.create_model(NAME, pretrained, in_chans, num_classes=0)`: the classifier removed, the
pooled features out, a pretrained stem adapted to the input channels by timm itself) and says how its weights expect
images to be prepared: `timm_preprocessing` reads the input size, mean, std and interpolation from the model's
pretrained config (`timm.data.resolve_data_config`), which `EmbeddingModel`'s config then records, so that a query is
prepared as the training images were. The card names where the weights came from (`timm_hub_id`).

timm is imported only here, inside the functions, and only for a `timm:` backbone: the training path of the
registry's own backbones must import on a machine without timm.
"""

from __future__ import annotations

import difflib
from typing import Any

from huggingface_hub.errors import EntryNotFoundError

WEIGHT_DOWNLOAD_ERRORS = (OSError, EntryNotFoundError)
"""What timm's pretrained loading raises when the weights cannot be had: huggingface_hub's download and offline
errors (an entry missing from a repo is not an OSError), torch.hub's URLError."""

TIMM_PREFIX = "timm:"
TIMM_REQUIREMENT = "timm==1.0.31"
"""The version requirements.txt pins: what the refusal for a missing timm tells to install."""


def timm_model_name(backbone: str) -> str | None:
    """The timm model name of a `timm:NAME` backbone, None for any other backbone name."""
    if isinstance(backbone, str) and backbone.startswith(TIMM_PREFIX):
        return backbone.removeprefix(TIMM_PREFIX).strip()
    return None


def _timm():
    try:
        import timm
    except ImportError as error:
        raise ValueError(f"timm backbones need the timm package, which is not installed here: pip install "
                         f"{TIMM_REQUIREMENT} (or pick a backbone of the registry: convnet, resnet18, ...)") from error
    return timm


def _pretrained_cfg(name: str):
    """timm's pretrained config of `name` (its default tag when it names none), or None for an architecture timm
    knows without one. ValueError for a name or tag timm does not know, with the nearest names it does."""
    timm = _timm()
    from timm.models import get_pretrained_cfg, split_model_name_tag

    architecture, tag = split_model_name_tag(name)
    if not name or not timm.is_model(name):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"timm knows no model {architecture!r} (backbone timm:{name}){hint} See "
                         "timm.list_models('*pattern*') for its architectures, timm.list_pretrained() for those with "
                         "weights")
    try:
        return get_pretrained_cfg(name)
    except RuntimeError as error:  # timm's words for an unknown tag of a known architecture
        tags = timm.list_pretrained(f"{architecture}.*")
        raise ValueError(f"timm has no weights {tag!r} for {architecture} (backbone timm:{name}): {error} Its "
                         f"weights: {', '.join(tags) or 'none'}") from error


def check_timm_backbone(backbone: str, pretrained: bool = False) -> None:
    """ValueError unless timm knows the model of `backbone` (`timm:NAME`) and, when `pretrained`, has weights for it
    on the Hub. Reads timm's registry only: nothing is built or downloaded."""
    name = timm_model_name(backbone)
    if name is None:
        raise ValueError(f"{backbone!r} is not a timm backbone: write timm:NAME, NAME one of timm.list_models()")
    cfg = _pretrained_cfg(name)
    if pretrained and (cfg is None or not (cfg.hf_hub_id or cfg.url or cfg.file)):
        raise ValueError(f"timm has no pretrained weights for {name}: train it from scratch (without --pretrained) "
                         "or pick a model of timm.list_pretrained()")


def timm_hub_id(backbone: str) -> str | None:
    """The Hub repo the pretrained weights of a `timm:NAME` backbone come from (`timm/NAME.TAG`, the name timm's
    loader reads), None for another backbone or a model whose weights are not on the Hub."""
    name = timm_model_name(backbone)
    if name is None:
        return None
    cfg = _pretrained_cfg(name)
    return cfg.hf_hub_id if cfg is not None and cfg.hf_hub_id else None


def timm_preprocessing(backbone: str, in_channels: int) -> dict[str, Any]:
    """How the weights of a `timm:NAME` backbone expect their images, from timm's pretrained config (as
    `timm.data.resolve_data_config` resolves it): `input_size` (height, width), `mean` and `std` (one value per input
    channel, on pixels in [0, 1]) and `interpolation` (a torchvision InterpolationMode value).

    For other than 3 channels, the mean and std of the RGB channels' averages: timm sums a pretrained RGB stem's
    filters for one input channel (and cycles them for more), so a gray pixel stands for the same value on R, G and B.
    """
    name = timm_model_name(backbone)
    if name is None:
        raise ValueError(f"{backbone!r} is not a timm backbone: write timm:NAME")
    cfg = _pretrained_cfg(name)
    from timm.data import resolve_data_config

    data_config = resolve_data_config({}, pretrained_cfg=cfg.to_dict() if cfg is not None else {})
    mean, std = [float(v) for v in data_config["mean"]], [float(v) for v in data_config["std"]]
    if in_channels != len(mean):
        mean, std = [sum(mean) / len(mean)] * in_channels, [sum(std) / len(std)] * in_channels
    _, height, width = data_config["input_size"]
    return {"input_size": (int(height), int(width)), "mean": mean, "std": std,
            "interpolation": str(data_config["interpolation"])}


def timm_input_size(backbone: str) -> int:
    """The side of the square images a `timm:NAME` backbone's weights were made for. ValueError for a model made
    for oblong images: give the size (`--image-size`)."""
    height, width = timm_preprocessing(backbone, 3)["input_size"]
    if height != width:
        raise ValueError(f"{backbone} is made for {height}x{width} images and MemVir Studio's models take square ones: "
                         "give the side with --image-size (image_size)")
    return height


def create_timm_model(backbone: str, in_channels: int, pretrained: bool, image_size: int | None = None):
    """`timm.create_model` of a `timm:NAME` backbone, the classifier removed (`num_classes=0`), so that the model ends
    in its pooled features, `model.num_features` wide.

    `image_size`, where it differs from the model's own input size, is given to models that fix it at build time
    (ViTs: `img_size`, their position embeddings resampled from the pretrained ones by timm); the others take any size.
    Pretrained weights come from the Hub through timm (huggingface_hub's cache, HF_ENDPOINT, HF_HUB_OFFLINE), whose
    errors pass through when they cannot be had (memvir.models.backbones.build_backbone words them).
    """
    check_timm_backbone(backbone, pretrained)
    name = timm_model_name(backbone)
    timm = _timm()
    options: dict[str, Any] = {"pretrained": pretrained, "in_chans": in_channels, "num_classes": 0}
    if image_size is not None and image_size != timm_preprocessing(backbone, 3)["input_size"][0]:
        options["img_size"] = image_size
    try:
        model = timm.create_model(name, **options)
    except TypeError as error:  # a model that takes any input size has no img_size argument
        if "img_size" not in options or "img_size" not in str(error):
            raise
        del options["img_size"]
        model = timm.create_model(name, **options)
    if not isinstance(getattr(model, "num_features", None), int):
        raise ValueError(f"timm:{name} does not say the width of its pooled features (num_features): pick a timm "
                         "image classification model")
    return model
