"""Training: the loop and what it needs around it.

- `trainer`: `Trainer`, the loop (its step is the paper's spine), live control, events, checkpoints and resume;
  `training_data`, the splits a Trainer of a config trains and evaluates on.
- `state`: the format of `trainer_state.pt` (`Trainer.state_dict()`), checked before a resume builds anything.
- `checks`: a step's labels and losses checked without making a GPU wait; `TrainingDiverged`.
- `devices`: the device a name asks for (`pick_device`), the model placed on it, the network that trains (DDP,
  compile).
- `distributed`: torchrun: which process this is (`World`), and the collectives the Trainer needs.
- `host_memory`: a CPU process keeps the memory its steps free instead of page-faulting it back.
- `reporting`: the run's metrics sent to trackio or TensorBoard (`TrainConfig.report_to`), by rank 0.
- `adam_regime`: the share of Adam's parameters whose step grows with the gradient, logged with each step record.

`from memvir.train import Trainer`, and so for each name given with its part above: resolved on first use, so
`import memvir.train` imports none of the parts. A run's settings, `TrainConfig`, live in `memvir.config`.
"""

from memvir._lazy import lazy_exports

_EXPORTS = {
    "Trainer": "memvir.train.trainer",
    "training_data": "memvir.train.trainer",
    "TrainingDiverged": "memvir.train.checks",
    "pick_device": "memvir.train.devices",
    "World": "memvir.train.distributed",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
