"""Where the network trains and in what form: the device a name asks for, the model placed on it, and the network
a training step calls (DistributedDataParallel across ranks, torch.compile on request)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from memvir.train.distributed import World


def pick_device(name: str) -> torch.device:
    """The device `name` asks for ("auto": a CUDA GPU when there is one); ValueError for a name torch does not know
    or a GPU this machine lacks."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this machine has no CUDA GPU; use --device cpu or auto")
    return device


def place_model(model: nn.Module, device: torch.device, world: World) -> nn.Module:
    """`model` on `device`; on a GPU in channels-last memory format (the training step sends its images so too)."""
    model = model.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
        if world.is_distributed:  # BatchNorm statistics over the global batch, as one process has them
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def training_network(model: nn.Module, device: torch.device, world: World, compile: bool) -> nn.Module:
    """What a training step calls: `model` in DistributedDataParallel across ranks, compiled on request.

    `model` itself stays the bare module, for evaluation and saving.
    """
    network = model
    if world.is_distributed:
        network = DistributedDataParallel(network, device_ids=[device.index] if device.type == "cuda" else None)
    if compile:
        network = torch.compile(network)  # around DDP, as torch documents: it splits graphs at gradient buckets
    return network
