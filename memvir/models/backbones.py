"""Backbones: a small registry (name -> builder, timm style) of feature extractors that end in global pooling.

Each builder returns the extractor and its feature dimension; `EmbeddingModel` (memvir.models.embedding_model) puts the
linear embedding head on top. `convnet` and `convnet-gn` are small CNNs for glyphs on a CPU; `resnet18`, `resnet50` and
`googlenet` are torchvision's, optionally with ImageNet weights. `googlenet` is torchvision's Inception-v1 with
BatchNorm, not the paper's BN-Inception (Inception-v2), so numbers on the paper's datasets need not match its own. A
model with another number of input channels than 3 gets a first convolution to match (its ImageNet weights adapted:
`adapt_stem_weight`).

Besides the registry's names, `timm:NAME` names any timm model (memvir.models.timm_backbones), its weights from the
Hugging Face Hub through timm and its preprocessing from timm's pretrained config (`backbone_preprocessing`).
"""

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torchvision
from torch import nn

from memvir._registry import Registry
from memvir.models import timm_backbones


class Backbone(NamedTuple):
    """A feature extractor (images [B, C, H, W] -> globally pooled features [B, feature_dim]) and its width."""

    features: nn.Module
    feature_dim: int


class PretrainedWeightsUnavailable(OSError):
    """ImageNet weights were asked for but are neither in the torch hub cache nor downloadable (e.g. offline)."""


BackboneBuilder = Callable[[int, bool], Backbone]
BACKBONE_REGISTRY: Registry[BackboneBuilder] = Registry(
    "backbone", other_forms=("timm:NAME for a timm model (timm:resnet50.a1_in1k, say)",))
"""The backbones `build_backbone` builds by name, besides `timm:NAME`."""


def register_backbone(name: str) -> Callable[[BackboneBuilder], BackboneBuilder]:
    """Decorator: register `builder(in_channels, pretrained) -> Backbone` under `name`; ValueError if it is taken."""
    return BACKBONE_REGISTRY.register(name)


def available_backbones() -> tuple[str, ...]:
    """Names accepted by `build_backbone` and `EmbeddingModel(backbone=...)`, sorted."""
    return tuple(sorted(BACKBONE_REGISTRY.names()))


def check_backbone(name: str, pretrained: bool = False) -> None:
    """ValueError unless `name` is a backbone of the registry or a timm model timm knows (`timm:NAME`; with
    `pretrained`, one with weights). Builds and downloads nothing."""
    if timm_backbones.timm_model_name(name) is not None:
        timm_backbones.check_timm_backbone(name, pretrained)
    elif name not in BACKBONE_REGISTRY:
        raise ValueError(BACKBONE_REGISTRY.refusal(name))


def build_backbone(name: str, in_channels: int = 3, pretrained: bool = False,
                   image_size: int | None = None) -> Backbone:
    """Build the backbone `name` for `in_channels`-channel images, with pretrained weights when `pretrained`
    (ImageNet's from torchvision for the registry's, the Hub's through timm for `timm:NAME`). `image_size`: the side
    of the inputs, for the timm models that fix it when built (ViTs); the others take any size."""
    check_backbone(name, pretrained)
    if in_channels < 1:
        raise ValueError(f"in_channels must be at least 1, got {in_channels}")
    if timm_backbones.timm_model_name(name) is None:
        return BACKBONE_REGISTRY.get(name)(in_channels, pretrained)
    try:
        model = timm_backbones.create_timm_model(name, in_channels, pretrained, image_size)
    except timm_backbones.WEIGHT_DOWNLOAD_ERRORS as error:
        raise PretrainedWeightsUnavailable(
            f"the pretrained weights of {name} ({timm_backbones.timm_hub_id(name) or 'their URL'}) are not in the "
            f"Hugging Face cache and could not be downloaded ({type(error).__name__}: {error}). Run once with network "
            "access (HF_HUB_OFFLINE unset) so that timm downloads them into the cache, or train without pretrained "
            "weights"
        ) from error
    return Backbone(model, model.num_features)


def backbone_preprocessing(name: str, in_channels: int) -> dict | None:
    """How the backbone `name` wants its images prepared, where it says so (timm's models: `input_size`, `mean`,
    `std`, `interpolation`, memvir.models.timm_backbones.timm_preprocessing); None for the registry's, which take
    the dataset's own preprocessing."""
    if timm_backbones.timm_model_name(name) is None:
        return None
    return timm_backbones.timm_preprocessing(name, in_channels)


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
