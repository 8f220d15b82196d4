"""Backbones: a small registry (name -> builder, timm style) of feature extractors that end in global pooling.

Each builder returns the extractor and its feature dimension; `EmbeddingModel` (memvir.models.embedding_model) puts the
linear embedding head on top. `convnet` and `convnet-gn` are small CNNs for glyphs on a CPU; `resnet18`, `resnet50` and
`googlenet` are torchvision's, optionally with ImageNet weights. `googlenet` is torchvision's Inception-v1 with
BatchNorm, not the paper's BN-Inception (Inception-v2), so numbers on the paper's datasets need not match its own. A
model with another number of input channels than 3 gets a first convolution to match (its ImageNet weights adapted:
`adapt_stem_weight`).
"""

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torchvision
from torch import nn


class Backbone(NamedTuple):
    """A feature extractor (images [B, C, H, W] -> globally pooled features [B, feature_dim]) and its width."""

    features: nn.Module
    feature_dim: int


class PretrainedWeightsUnavailable(OSError):
    """ImageNet weights were asked for but are neither in the torch hub cache nor downloadable (e.g. offline)."""


BackboneBuilder = Callable[[int, bool], Backbone]
_BACKBONES: dict[str, BackboneBuilder] = {}


def register_backbone(name: str) -> Callable[[BackboneBuilder], BackboneBuilder]:
    """Decorator: register `builder(in_channels, pretrained) -> Backbone` under `name`."""

    def decorator(builder: BackboneBuilder) -> BackboneBuilder:
        if name in _BACKBONES:
            raise ValueError(f"backbone {name!r} is already registered; pick another name")
        _BACKBONES[name] = builder
        return builder

    return decorator


def available_backbones() -> tuple[str, ...]:
    """Names accepted by `build_backbone` and `EmbeddingModel(backbone=...)`, sorted."""
    return tuple(sorted(_BACKBONES))


def build_backbone(name: str, in_channels: int = 3, pretrained: bool = False) -> Backbone:
    """Build the backbone `name` for `in_channels`-channel images, with ImageNet weights when `pretrained`."""
    if name not in _BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(available_backbones())}")
    if in_channels < 1:
        raise ValueError(f"in_channels must be at least 1, got {in_channels}")
    return _BACKBONES[name](in_channels, pretrained)


def load_imagenet_state_dict(weights: torchvision.models.WeightsEnum) -> dict[str, torch.Tensor]:
    """The state dict of torchvision `weights`, from the torch hub cache or downloaded into it.

    Goes through `torch.hub.load_state_dict_from_url` (looked up at call time, so tests can stand in for it) with
    `weights_only=True`: a checkpoint is never unpickled. Offline without the cached file, the error says which
    file is missing, where it belongs and how to get it, instead of a bare URLError.
    """
    file_name = weights.url.rsplit("/", 1)[-1]
    cache_folder = Path(torch.hub.get_dir()) / "checkpoints"
    try:
        return torch.hub.load_state_dict_from_url(
            weights.url, map_location="cpu", progress=False, check_hash=True, weights_only=True
        )
    except OSError as error:  # URLError is an OSError; so are disk errors while writing the cache
        raise PretrainedWeightsUnavailable(
            f"ImageNet weights {file_name} ({weights}) are not in the torch hub cache at {cache_folder / file_name} "
            f"and could not be downloaded ({error}). Run once with network access so torch downloads {weights.url} "
            f"into {cache_folder} (or copy the file there; TORCH_HOME moves the cache), or set pretrained=False to "
            "start from random weights."
        ) from error


def adapt_stem_weight(rgb_weight: torch.Tensor, in_channels: int) -> torch.Tensor:
    """Turn a stem conv weight [out, 3, kh, kw] made for RGB into one for `in_channels` input channels.

    One channel: the sum of the RGB filters, so a gray image gives exactly the activations the RGB network gives
    for that image repeated on R, G and B. Other counts (timm's rule): the RGB filters repeated cyclically and
    scaled by 3 / in_channels, which keeps the activation scale for channels of similar magnitude.
    """
    if rgb_weight.dim() != 4 or rgb_weight.shape[1] != 3:
        raise ValueError(f"expected an RGB stem weight [out, 3, kh, kw], got shape {tuple(rgb_weight.shape)}")
    if in_channels == 3:
        return rgb_weight.clone()
    if in_channels == 1:
        return rgb_weight.sum(dim=1, keepdim=True)
    repeats = -(-in_channels // 3)  # ceil division
    return rgb_weight.repeat(1, repeats, 1, 1)[:, :in_channels] * (3 / in_channels)


def _stem_for(rgb_stem: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """A copy of `rgb_stem` taking `in_channels` inputs, its weights derived from the RGB ones (`adapt_stem_weight`).

    Deriving (instead of re-initialising) keeps one code path for random and ImageNet weights alike.
    """
    if in_channels == 3:
        return rgb_stem
    stem = nn.Conv2d(
        in_channels,
        rgb_stem.out_channels,
        kernel_size=rgb_stem.kernel_size,
        stride=rgb_stem.stride,
        padding=rgb_stem.padding,
        dilation=rgb_stem.dilation,
        groups=rgb_stem.groups,
        bias=rgb_stem.bias is not None,
    )
    with torch.no_grad():
        stem.weight.copy_(adapt_stem_weight(rgb_stem.weight, in_channels))
        if rgb_stem.bias is not None:
            stem.bias.copy_(rgb_stem.bias)
    return stem


class ConvNet(nn.Module):
    """A small CNN for 32x32 or 64x64 glyphs, fast on a CPU: four conv3x3-norm-ReLU blocks of 32, 64, 128 and
    256 channels, 2x2 max-pooling after the first three, then global average pooling.

    `norm(width)` builds each block's normalisation: BatchNorm by default; GroupNorm makes every image's features
    independent of the rest of its batch (see "convnet-gn").
    """

    widths = (32, 64, 128, 256)

    def __init__(self, in_channels: int, norm: Callable[[int], nn.Module] = nn.BatchNorm2d):
        super().__init__()
        layers: list[nn.Module] = []
        previous = in_channels
        for block, width in enumerate(self.widths):
            layers += [nn.Conv2d(previous, width, 3, padding=1, bias=False), norm(width), nn.ReLU(True)]
            if block < len(self.widths) - 1:
                layers.append(nn.MaxPool2d(2))
            previous = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.layers = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)


@register_backbone("convnet")
def _build_convnet(in_channels: int, pretrained: bool) -> Backbone:
    if pretrained:
        raise ValueError(
            "backbone 'convnet' has no pretrained weights; set pretrained=False, or pick an ImageNet backbone: "
            "resnet18, resnet50, googlenet"
        )
    return Backbone(ConvNet(in_channels), ConvNet.widths[-1])


CONVNET_GROUPS = 8  # GroupNorm groups per block: 4 to 32 channels each over the widths 32..256


@register_backbone("convnet-gn")
def _build_convnet_gn(in_channels: int, pretrained: bool) -> Backbone:
    """ConvNet with GroupNorm instead of BatchNorm: an image's embedding does not depend on its batch, so training
    split across processes (each with a part of the batch) computes exactly what one process computes on the CPU,
    where SyncBatchNorm is not available."""
    if pretrained:
        raise ValueError(
            "backbone 'convnet-gn' has no pretrained weights; set pretrained=False, or pick an ImageNet backbone: "
            "resnet18, resnet50, googlenet"
        )
    return Backbone(ConvNet(in_channels, norm=lambda width: nn.GroupNorm(CONVNET_GROUPS, width)), ConvNet.widths[-1])


def _build_resnet(arch: Callable[..., nn.Module], weights: torchvision.models.WeightsEnum, in_channels: int,
                  pretrained: bool) -> Backbone:
    model = arch(weights=None)
    if pretrained:
        model.load_state_dict(load_imagenet_state_dict(weights))
    feature_dim = model.fc.in_features
    model.conv1 = _stem_for(model.conv1, in_channels)
    model.fc = nn.Identity()  # torchvision's ResNet already ends in global average pooling + flatten
    return Backbone(model, feature_dim)


@register_backbone("resnet18")
def _build_resnet18(in_channels: int, pretrained: bool) -> Backbone:
    return _build_resnet(torchvision.models.resnet18, torchvision.models.ResNet18_Weights.IMAGENET1K_V1,
                         in_channels, pretrained)


@register_backbone("resnet50")
def _build_resnet50(in_channels: int, pretrained: bool) -> Backbone:
    return _build_resnet(torchvision.models.resnet50, torchvision.models.ResNet50_Weights.IMAGENET1K_V1,
                         in_channels, pretrained)


@register_backbone("googlenet")
def _build_googlenet(in_channels: int, pretrained: bool) -> Backbone:
    """torchvision's GoogLeNet (BN-Inception v1), auxiliary heads and dropout off, ending in global average pooling.

    With ImageNet weights and RGB input, `transform_input` stays on as torchvision has it, so inputs are normalised
    with ImageNet mean/std like the other backbones. It indexes R, G and B, so any other channel count turns it off.
    """
    model = torchvision.models.googlenet(
        weights=None, aux_logits=False, init_weights=not pretrained, transform_input=pretrained and in_channels == 3
    )
    if pretrained:
        state = load_imagenet_state_dict(torchvision.models.GoogLeNet_Weights.IMAGENET1K_V1)
        model.load_state_dict({key: value for key, value in state.items() if not key.startswith(("aux1.", "aux2."))})
    feature_dim = model.fc.in_features
    model.conv1.conv = _stem_for(model.conv1.conv, in_channels)
    model.dropout = nn.Identity()  # the reference head is pool -> linear; no dropout before the embedding
    model.fc = nn.Identity()
    return Backbone(model, feature_dim)
