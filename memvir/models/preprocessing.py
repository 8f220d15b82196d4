"""A model's input preprocessing: what its config says, the transform of its queries, and a dataset read its way.

A dataset prepares its images its own way (memvir.data: size, mean, std of the dataset). A backbone whose weights
were made for another preparation (a timm model: memvir.models.timm_backbones) says so
(memvir.models.backbones.backbone_preprocessing); `model_input` gives the `EmbeddingModel` settings that follow, and
`read_for_model` reads a dataset's splits that way: the test split through the model's own query transform
(`query_transform`, the one retrieval applies to a query), the training split's augmentation followed by the
change of normalisation. So training, evaluation and a query see the same pixels.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torchvision.transforms import v2

from memvir.data.transforms import eval_transform
from memvir.models.backbones import backbone_preprocessing
from memvir.models.timm_backbones import timm_input_size, timm_model_name

DEFAULT_INTERPOLATION = "bilinear"
"""What a config without `interpolation` (one saved before it was recorded) resizes with: torchvision's default,
which the dataset transforms use."""
INTERPOLATIONS = tuple(mode.value for mode in v2.InterpolationMode)
_CAFFE_SCALE = 255.0  # "caffe" normalisation keeps pixels on the 0-255 scale


def backbone_input_size(backbone: str) -> int | None:
    """The side of the images `backbone`'s weights were made for, where it has one (timm models); None for the
    registry's backbones, which take the dataset's own size."""
    return timm_input_size(backbone) if timm_model_name(backbone) is not None else None


def model_input(backbone: str, info) -> dict[str, Any]:
    """The input settings of an `EmbeddingModel` with `backbone` trained on a dataset of `info` (a DatasetInfo):
    in_channels, image_size, mean, std, dataset, image_kind, normalization, interpolation. The dataset's own, except
    where the backbone says how its images are to be prepared (mean, std, interpolation of a timm model's pretrained
    config, on pixels in [0, 1])."""
    settings = {"in_channels": info.channels, "image_size": info.image_size, "mean": list(info.mean),
                "std": list(info.std), "dataset": info.name, "image_kind": info.kind,
                "normalization": info.normalization, "interpolation": DEFAULT_INTERPOLATION}
    wanted = backbone_preprocessing(backbone, info.channels)
    if wanted is not None:
        settings.update(mean=list(wanted["mean"]), std=list(wanted["std"]), normalization=None,
                        interpolation=wanted["interpolation"])
    return settings


def query_transform(config: Mapping[str, Any]) -> v2.Compose:
    """The deterministic transform of a model's config: a PIL image (or uint8 tensor) -> float [C, size, size],
    resized with the config's `interpolation` (memvir.data.transforms.eval_transform otherwise)."""
    transform = eval_transform(config["image_kind"], config["image_size"], config["mean"], config["std"],
                               config.get("normalization"))
    mode = v2.InterpolationMode(config.get("interpolation") or DEFAULT_INTERPOLATION)
    if mode == v2.InterpolationMode(DEFAULT_INTERPOLATION):
        return transform
    return v2.Compose([
        v2.Resize(step.size, interpolation=mode, max_size=step.max_size, antialias=step.antialias)
        if isinstance(step, v2.Resize) else step
        for step in transform.transforms
    ])


class Renormalised:
    """A transform followed by a change of normalisation: images normalised with one mean and std (on 0-1 or, for
    "caffe", 0-255 pixels) come out normalised with another, on 0-1 pixels. Per channel, for one image [C, H, W] or
    a batch [B, C, H, W]; exact up to rounding, since both normalisations are affine maps of the same pixels."""

    def __init__(self, transform: Callable, mean: tuple[float, ...], std: tuple[float, ...],
                 normalization: str | None, to_mean: tuple[float, ...], to_std: tuple[float, ...]):
        scale = _CAFFE_SCALE if normalization == "caffe" else 1.0
        mean, std = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
        to_mean, to_std = torch.tensor(to_mean, dtype=torch.float64), torch.tensor(to_std, dtype=torch.float64)
        # y = (x - mean) / std on the dataset's scale; z = (x / scale - to_mean) / to_std = (y - shift) / divisor
        self.shift = ((scale * to_mean - mean) / std).float().view(-1, 1, 1)
        self.divisor = (scale * to_std / std).float().view(-1, 1, 1)
        self.transform = transform

    def __call__(self, images):
        return (self.transform(images) - self.shift) / self.divisor

    def __repr__(self) -> str:
        return f"Renormalised({self.transform!r}, shift={self.shift.flatten().tolist()}, " \
               f"divisor={self.divisor.flatten().tolist()})"


def read_for_model(splits, settings: Mapping[str, Any]):
    """`splits` (a DatasetSplits) read as a model of `settings` (`model_input`, or a model's config) takes its
    images: the test split through the model's `query_transform`, the training split's transforms (per image and per
    batch) followed by the change from the dataset's normalisation to the model's, and the info's mean, std and
    normalisation the model's. The splits themselves where the two agree (the registry's backbones)."""
    info = splits.info
    same = (list(info.mean) == list(settings["mean"]) and list(info.std) == list(settings["std"])
            and info.normalization == settings.get("normalization")
            and (settings.get("interpolation") or DEFAULT_INTERPOLATION) == DEFAULT_INTERPOLATION)
    if same:
        return splits
    if info.image_size != settings["image_size"] or info.channels != settings["in_channels"]:
        raise ValueError(f"{info.name} was loaded at {info.channels} channel(s), {info.image_size} px, and the model "
                         f"takes {settings['in_channels']}, {settings['image_size']} px: load it at the model's size")

    def renormalised(transform):
        return Renormalised(transform, info.mean, info.std, info.normalization, settings["mean"], settings["std"])

    train = copy.copy(splits.train)
    train.transform = renormalised(splits.train.transform)
    if splits.train.batch_transform is not None:
        train.batch_transform = renormalised(splits.train.batch_transform)
    test = splits.test.with_transform(query_transform(settings))
    return dataclasses.replace(splits, train=train, test=test, info=dataclasses.replace(
        info, mean=tuple(settings["mean"]), std=tuple(settings["std"]), normalization=settings.get("normalization")))
