"""Training: the loop and what it needs around it.

- `trainer`: `Trainer`, the loop (its step is the paper's spine), live control, events, checkpoints and resume.
- `state`: the format of `trainer_state.pt` (`Trainer.state_dict()`), checked before a resume builds anything.
- `checks`: a step's labels and losses checked without making a GPU wait; `TrainingDiverged`.
- `devices`: the device a name asks for, the model placed on it, the network that trains (DDP, compile).
- `distributed`: torchrun: which process this is, and the collectives the Trainer needs.
- `host_memory`: a CPU process keeps the memory its steps free instead of page-faulting it back.
- `adam_regime`: the share of Adam's parameters whose step grows with the gradient, logged with each step record.
"""
