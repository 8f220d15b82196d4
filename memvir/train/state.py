"""The trainer state a run folder keeps for resume (trainer_state.pt): what it holds, taken from a Trainer and put
back into one, checked first so that a damaged or foreign file is a CheckpointError that says what to do.

It holds tensors and plain containers only, so `checkpoint.load_state` reads it without unpickling code.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from memvir import checkpoint
from memvir.config import TrainConfig

if TYPE_CHECKING:
    from memvir.train.trainer import Trainer

STATE_FORMAT = 1
STATE_KEYS = ("config", "step", "model", "class_weights", "optimizer", "memvir", "loss", "rng", "history",
              "last_metrics")


def trainer_state(trainer: Trainer) -> dict:
    """Everything a resume needs: the config, the step, the model, the class weights, the optimizer, the MemVir
    memory, the loss's own state, the random state and the records so far."""
    return {
        "format": STATE_FORMAT,
        "config": trainer.config.to_dict(),
        "step": trainer.step,
        "model": trainer.model.state_dict(),
        "class_weights": trainer.class_weights.detach().cpu(),
        "optimizer": trainer.optimizer.state_dict(),
        "memvir": trainer.memvir.state_dict(),
        "loss": trainer.loss_fn.state_dict(),
        "rng": torch.get_rng_state(),
        "history": list(trainer.history),
        "last_metrics": dict(trainer.last_metrics),
    }


def stored_config(state, path: Path) -> TrainConfig:
    """The config a trainer state holds, after checking the state has every part a resume reads."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise checkpoint.CheckpointError(f"{path} was written by another version")
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise checkpoint.CheckpointError(
            f"{path} lacks {', '.join(missing)}: it is damaged or was not written by a memvir Trainer. The model "
            "files beside it may still load (memvir eval); to train on, start a new run in a new folder"
        )
    try:
        if not isinstance(state["config"], dict):
            raise TypeError(f"a {type(state['config']).__name__}, not a dict")
        return TrainConfig.from_dict(state["config"])
    except (TypeError, ValueError) as error:
        raise checkpoint.CheckpointError(f"{path} holds no valid run config ({error}): it is damaged or was edited; "
                                         "start a new run in a new folder") from error


def restore_trainer_state(trainer: Trainer, state: dict, path: Path) -> None:
    """Put `state` (read from `path`) into `trainer`, built with the state's config; CheckpointError when a part
    does not fit it."""
    try:
        trainer.model.load_state_dict(state["model"])
        with torch.no_grad():
            trainer.class_weights.copy_(state["class_weights"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        # the memory's N, M, U are the live ones saved with it; the warm-up follows this run's steps per epoch
        trainer.memvir.load_state_dict(state["memvir"])
        trainer.loss_fn.load_state_dict(state["loss"])
        torch.set_rng_state(state["rng"])
        trainer.step = int(state["step"])
        trainer.history = list(state["history"])
        trainer.last_metrics = dict(state["last_metrics"])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise checkpoint.CheckpointError(
            f"{path} does not fit the run it describes ({error}): it is damaged or was edited. The model files "
            "beside it may still load (memvir eval); to train on, start a new run in a new folder"
        ) from error
