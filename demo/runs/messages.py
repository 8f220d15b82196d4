"""What the server and a run's training process (demo.runs.child) say to each other over their pipe.

Down, from the server: the `LaunchSpec` the process starts with, then commands as tuples: ("go",) once the server
accepts the run, ("stop",), ("pause",), ("resume",), and ("update", request, changes) for a live change, which the
process answers with a `Reply`. Up, from the process: `Ready` once its Trainer is built, then the Trainer's events
(memvir.events) in the order it emits them (those holding tensors as files, demo.runs.snapshot_transport), replies,
and a `Crash` when the Trainer raises.

Plain dataclasses of plain values only: the process imports this module before torch, so that it can set its thread
count first (demo.common.cores).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

GO, STOP, PAUSE, RESUME, UPDATE = "go", "stop", "pause", "resume", "update"


@dataclass(frozen=True)
class LaunchSpec:
    """How to start a run's process: a new run of `config` (a TrainConfig as a dict) in `folder`, or, with no
    config, a resume of the run in `folder` from its checkpoint."""

    folder: str
    config: dict | None
    threads: int  # torch's (and faiss's) threads in the process
    memory_limit: int | None = None  # bytes of address space the process may take (RLIMIT_AS); None: no limit
    # MEMVIR_MEMORY_BUDGET: the bytes MemVir's memory may take; None: the process measures what it may take
    # (demo.runs.memory_budget) and hands that to its Trainer as its limit
    memory_budget: int | None = None
    # the server's environment as the run is started: the process forks from one started earlier (demo.runs.process)
    environment: dict = field(default_factory=lambda: dict(os.environ))

    @property
    def resume(self) -> bool:
        return self.config is None


@dataclass(frozen=True)
class ClassNames:
    """A run's class names as its dataset gives them ("Ն U+0546" for a glyph, a sub-folder's or a Hub label's name),
    by the label that indexes them: the training classes (as the Trainer trains them, validation classes held out),
    which its snapshots' rows and class weights are, and the test classes, which its probe images are."""

    train: tuple = ()
    test: tuple = ()

    def words(self, labels, split: str = "train") -> list[str]:
        """Each label's name, as the neighbours of a clicked image say it; its number where no name is known (a
        run read back from its folder)."""
        names = self.train if split == "train" else self.test
        return [names[label] if 0 <= label < len(names) else str(label) for label in (int(x) for x in labels)]


UNNAMED_CLASSES = ClassNames()  # names not known (a run read back from its folder): the labels' numbers stand in


@dataclass(frozen=True)
class Ready:
    """The Trainer is built: what the server needs of it, since it never holds the Trainer itself."""

    step: int  # where it starts (a resumed run: its checkpoint's step)
    total_steps: int
    history: list  # the records it starts from: its checkpoint's, for a resumed run
    config: dict  # the Trainer's TrainConfig as a dict (a resumed run's own settings)
    num_classes: int  # real classes C, the rows of its class weights
    dim: int  # embedding dimension D
    device: str  # where it trains, as torch.device names it ("cpu", "cuda:0")
    threads: int  # torch's threads in the process
    class_names: ClassNames = UNNAMED_CLASSES  # the names the page's pictures give their points on hover


@dataclass(frozen=True)
class Reply:
    """The answer to ("update", request, changes): `error` is the Trainer's refusal, None when it took the change."""

    request: int
    error: str | None


@dataclass(frozen=True)
class Crash:
    """The Trainer raised: while it was built (`step` None), or during the run."""

    step: int | None
    error: str  # "TypeName: message"
    message: str  # the message alone, as a refusal is shown
    refused: bool  # a ValueError: the settings, the dataset or the checkpoint are at fault, not the machine
    out_of_memory: bool
    trace: str  # the traceback, for the server's log
