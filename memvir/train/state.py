"""The format of the trainer state a run folder keeps for resume (trainer_state.pt, written by `Trainer.state_dict`):
its version and parts, checked before a resume builds anything, so that a damaged or foreign file is a
CheckpointError that says what to do.

It holds tensors and plain containers only, so `checkpoint.load_state` reads it without unpickling code.
"""

from __future__ import annotations

from pathlib import Path

from memvir import checkpoint
from memvir.config import TrainConfig

STATE_FORMAT = 1
STATE_KEYS = ("config", "step", "model", "class_weights", "optimizer", "memvir", "loss", "rng", "history",
              "last_metrics")


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
