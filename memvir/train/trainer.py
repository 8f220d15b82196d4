"""Trainer: the training loop, live control, events, checkpoints and resume (its settings: memvir.config).

Read top to bottom: ``Trainer.run`` is the loop; ``_train_step`` is one MemVir step (embed, augment with past
steps, loss, update). The Trainer knows nothing of a UI or a terminal: it emits events (memvir.events) to
listeners, writes a run folder when given one, and accepts live changes between steps from any thread.

Determinism: every sample's augmentation is drawn from its own seed (run seed, epoch, position), batches come from a
seeded permutation per epoch, and a checkpoint holds the step, the optimizer and the MemVir memory. So a run stopped
at any step and resumed reproduces the uninterrupted run on the CPU, whatever the number of loader workers.

Several processes (torchrun, memvir.train.distributed): each rank trains on its contiguous share of every global batch
under DistributedDataParallel and gathers the embeddings, so all ranks store the memory of the whole batch, as one
process would, and each computes its share of the loss over it (the shares sum to the one-process loss). Rank 0
alone writes the run folder and talks to listeners; its word on stopping and live changes is broadcast between
steps, so every rank takes the same steps and ends in the same state.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from pathlib import Path
from typing import NoReturn

import torch
import torch.nn.functional as F
from torch import nn

from memvir import checkpoint
from memvir.analysis.snapshots import SnapshotMaker
from memvir.analysis.spread import class_weight_spread, virtual_spread
from memvir.config import LIVE_SETTINGS, TrainConfig, resume_changes
from memvir.data import load_dataset
from memvir.data.batches import TrainingBatches
from memvir.data.splits import without_augmentation
from memvir.data.validation import hold_out_validation
from memvir.events import ControlEvent, ControlRefused, EvalEvent, SnapshotEvent, StatusEvent, StepEvent
from memvir.losses import build_loss
from memvir.memory.checks import NonFiniteError
from memvir.memory.size import STORE_DTYPES
from memvir.memory.virtual_classes import MemVir, virtual_sets_at
from memvir.models.card import changes_summary, live_changes, memvir_summary, started_with
from memvir.models.embedding_model import EmbeddingModel
from memvir.models.initialisation import initialise_from_checkpoint
from memvir.models.preprocessing import backbone_input_size, model_input, read_for_model
from memvir.retrieval import evaluation
from memvir.train.adam_regime import eps_dominated_shares
from memvir.train.checks import TrainingDiverged, UncheckedLosses, check_labels
from memvir.train.devices import pick_device, place_model, training_network
from memvir.train.distributed import World
from memvir.train.host_memory import keep_freed_memory
from memvir.train.reporting import reporter_for
from memvir.train.state import STATE_FORMAT, stored_config

# What MemVir.set_hparams takes: a change of one of them may re-allocate the memory.
MEMORY_SETTINGS = ("memvir_n", "memvir_m", "warmup_epochs")


def _allocation_failed(error: BaseException) -> bool:
    """Whether `error` is the allocator refusing memory: Python's MemoryError, torch's OutOfMemoryError on a GPU, or
    the RuntimeError its CPU allocator raises ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(error, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return "can't allocate memory" in text or "out of memory" in text or "cannot allocate memory" in text


def training_data(config: TrainConfig):
    """(splits, validation) as a Trainer of `config` trains and evaluates on them: the dataset at its size and seed,
    read clean throughout without augmentation, and `config.val_classes` training classes held out as validation
    (None without). A snapshot's item indices (memvir.events.SnapshotEvent) index these splits.

    A backbone that says how its images are prepared (a timm model's pretrained config) sets the default size and
    the normalisation and resizing (memvir.models.preprocessing): the splits are read as its model takes queries."""
    image_size = config.image_size or backbone_input_size(config.backbone)
    data = load_dataset(config.dataset, data_root=config.data_root, image_size=image_size, seed=config.seed,
                        image_column=config.image_column, label_column=config.label_column)
    data = read_for_model(data, model_input(config.backbone, data.info))
    if not config.augment:
        data = without_augmentation(data)
    if config.val_classes:
        return hold_out_validation(data, config.val_classes, config.val_fold)
    return data, None


def _batch_norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


class Trainer:
    """Trains an EmbeddingModel with MemVir, as one TrainConfig says. ``run()`` blocks; ``stop``/``pause``/``resume``/
    ``update`` may be called from other threads and take effect between two steps. `Trainer.from_run_folder`
    continues a run from its checkpoint.

    Under torchrun every rank builds its own Trainer with the same config and `out_dir`; rank 0 alone writes there
    (on the others `out_dir` is None) and calls listeners, and its stop, pause and updates hold for all ranks.

    Example:
        trainer = Trainer(TrainConfig(dataset="glyphs-mini", memvir_n=5, memvir_m=10), out_dir="runs/mini")
        trainer.run()  # 'finished'
    """

    def __init__(self, config: TrainConfig, out_dir: str | Path | None = None, listeners=(), *,
                 load_init: bool = True, max_memory_bytes: int | None = None):
        """Build the run's data, model, class weights, loss, MemVir and optimiser; nothing trains until `run`.

        Args:
            config: the run's settings (a validated TrainConfig).
            out_dir: the run folder to write: the model's Hub files, train_config.json, metrics.jsonl and the trainer
                state a resume needs (memvir.checkpoint). None writes nothing.
            listeners: callables, each called with every event the run emits (memvir.events), on the training thread.
            load_init: start the model from `config.init_from` when it names a checkpoint folder; False when a
                trainer state will replace the weights (a resume: the run's own weights, not the init, are where it
                is).
            max_memory_bytes: the largest MemVir memory this run may allocate (memvir.memory.size.memory_limit;
                None: MEMVIR_MAX_MEMORY_BYTES, else 16 GiB), e.g. what the process that trains it measured it may
                take.

        Raises:
            MemoryLimitError: N and M whose memory would pass `max_memory_bytes`; checked at the start and at every
                live change, before anything is allocated.
            DatasetError: a dataset that cannot be read (memvir.data), saying what to fix.
        """
        self.config = config
        self.world = World.from_environment()
        self._local_rows = self.world.batch_rows(config.batch_size)  # checked before any process waits for another
        self.out_dir = Path(out_dir) if out_dir is not None and self.world.is_main else None
        self.device = self.world.start(pick_device(config.device))
        if self.device.type == "cpu":
            keep_freed_memory()  # a step's memory mapped once, not at every step (memvir.train.host_memory)
        self._listeners = list(listeners)
        if config.report_to != "none":  # the tracker's package is imported only when asked for

            reporter = reporter_for(config, self.out_dir, self.world)
            if reporter is not None:
                self._listeners.append(reporter)
        self._lock = threading.Lock()
        self._pending: dict = {}
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self.state = "ready"

        torch.manual_seed(config.seed)
        self._load_data(config)
        info = self.data.info
        # a GPU checks its steps' values in batches, not at every step (memvir.train.checks)
        self._checks_every_step = self.device.type != "cuda"
        # MemVir first: told the steps it will store (the gathered global batch, float32), it refuses an N and M
        # past the memory limit before the model is built, not at its first stored step
        self.memvir = MemVir(config.memvir_n, config.memvir_m, self._warmup_steps(config.warmup_epochs),
                             store_dtype=STORE_DTYPES[config.memvir_store_dtype], schedule=config.memvir_schedule,
                             max_memory_bytes=max_memory_bytes, check_values=self._checks_every_step,
                             expected_steps=(config.batch_size, info.num_train_classes, config.embedding_dim),
                             # the loss computes no stored block (memvir.losses, "Cache"); the checkpoint saves the
                             # pairs it keeps with the loss's state, so a resume still reproduces the run
                             live_pairs=True)
        self._build_model(config, load_init)
        self._build_loss(config)
        self.step = 0
        self._set_learning_rates()
        self.history: list[dict] = []  # records of metrics.jsonl, also kept in checkpoints
        self.last_metrics: dict = {}
        self.snapshots = SnapshotMaker(self.data, config.seed, config.probe_classes, config.focus_classes,
                                       config.dataset)
        self._speed = None
        self.command: str | None = None  # the command line that started the run, for the model card
        self.resume_changes: dict = {}  # {setting: (old, new)} that `resume` changed, for callers to report

    def _load_data(self, config: TrainConfig) -> None:
        """The splits (training_data), this rank's batches of them and the run's length in steps."""
        self.data, self.validation = training_data(config)
        self.batches = TrainingBatches(self.data.train, config.batch_size, config.seed, rows=self._local_rows,
                                       sampler=config.sampler, samples_per_class=config.samples_per_class,
                                       num_workers=config.num_workers, pin_memory=self.device.type == "cuda",
                                       name=config.dataset)
        self.steps_per_epoch = self.batches.steps_per_epoch
        self.total_steps = config.epochs * self.steps_per_epoch
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)

    def _build_model(self, config: TrainConfig, load_init: bool) -> None:
        """The model on its device (from `config.init_from` where `load_init`), the network that trains it, and the
        training classes' weights, drawn with the run's seed + 1."""
        info = self.data.info
        self.model = place_model(EmbeddingModel(
            backbone=config.backbone, embedding_dim=config.embedding_dim, pretrained=config.pretrained,
            **model_input(config.backbone, info),  # the input the splits were read for (training_data)
        ), self.device, self.world)
        self.initialisation = None  # what config.init_from gave the model (memvir.models.initialisation)
        if config.init_from and load_init:
            self.initialisation = initialise_from_checkpoint(self.model, config.init_from, f"dataset {info.name}")
        self._network = training_network(self.model, self.device, self.world, config.compile)
        init = torch.Generator().manual_seed(config.seed + 1)
        weights = torch.randn(info.num_train_classes, config.embedding_dim, generator=init)
        self.class_weights = nn.Parameter((weights / math.sqrt(config.embedding_dim)).to(self.device))

    def _build_loss(self, config: TrainConfig) -> None:
        """The loss and the optimiser of the model and the class weights."""
        self._unchecked = UncheckedLosses()
        self.loss_fn = build_loss(config.loss, **config.loss_params).to(self.device)
        self.loss_fn.check_values = self._checks_every_step
        self._scales_loss = config.loss_scale_after_warmup != 1.0 or config.loss_scale_schedule > 0
        self._raw_embeddings = self.loss_fn.takes_raw_embeddings  # the paper's Softmax (memvir.losses)
        self.optimizer = torch.optim.Adam(
            [{"params": self.model.parameters(), "lr": config.lr},
             {"params": [self.class_weights], "lr": config.class_lr}],
            eps=config.adam_eps, weight_decay=config.weight_decay,
        )

    # -------------------------------------------------------------------------------------- construction helpers
    @classmethod
    def from_run_folder(cls, out_dir: str | Path, listeners=(), *, max_memory_bytes: int | None = None,
                        **overrides) -> Trainer:
        """Continue the run in `out_dir` from its checkpoint: same config, model, optimizer, MemVir memory and step.

        `overrides` (None: keep) may change the settings in RESUMABLE. N, M, the warm-up and the learning rates
        apply as a live change does (`update`): checked, recorded in the history, the memory resized. A value equal
        to the run's is no change; changing any other setting is a ResumeConflict. `resume_changes` of the trainer
        returned lists what changed, as {setting: (old, new)}. `max_memory_bytes` as for a new Trainer.
        """
        out_dir = Path(out_dir)
        path = out_dir / checkpoint.TRAINER_STATE
        state = checkpoint.load_state(path)
        stored = stored_config(state, path)
        changes = resume_changes(stored, overrides, out_dir)
        live = {name: new for name, (_, new) in changes.items() if name in LIVE_SETTINGS}
        values = {name: new for name, (_, new) in changes.items() if name not in live}
        trainer = cls(dataclasses.replace(stored, **values), out_dir, listeners, load_init=False,
                      max_memory_bytes=max_memory_bytes)
        trainer.load_state_dict(state, path)
        if live:
            trainer._check_changes(live)
            trainer._apply_changes(live)
        trainer.resume_changes = changes
        return trainer

    def _warmup_steps(self, warmup_epochs: float) -> int:
        return int(round(warmup_epochs * self.steps_per_epoch))

    def add_listener(self, listener) -> None:
        self._listeners.append(listener)

    def _emit(self, event) -> None:
        if hasattr(event, "record") and not isinstance(event, StepEvent | SnapshotEvent):
            self._log(event.record())
        if not self.world.is_main:  # one voice per run: the other ranks' events are the same
            return
        for listener in list(self._listeners):
            listener(event)

    def _log(self, record: dict) -> None:
        self.history.append(record)
        if self.out_dir is not None:
            checkpoint.append_record(record, self.out_dir / checkpoint.METRICS_LOG)

    # -------------------------------------------------------------------------------------- live control
    def update(self, memvir_n=None, memvir_m=None, warmup_epochs=None, lr=None, class_lr=None,
               focus_classes=None) -> None:
        """Ask for new N, M, warm-up (epochs), learning rates or few-class view; checked now, applied before the next
        step. Asks between two steps coalesce: the newest value of each setting is the one applied."""
        changes = {k: v for k, v in dict(memvir_n=memvir_n, memvir_m=memvir_m, warmup_epochs=warmup_epochs, lr=lr,
                                         class_lr=class_lr, focus_classes=focus_classes).items() if v is not None}
        with self._lock:
            self._check_changes({**self._pending, **changes})
            self._pending.update(changes)

    def _check_changes(self, changes: dict) -> None:
        """Validate the config that `changes` would make, its memory against the limit included, before any applies."""
        candidate = dataclasses.replace(self.config, **changes)  # validated as it is made
        self.memvir.check_hparams(num_steps=candidate.memvir_n, margin=candidate.memvir_m,
                                  warmup_steps=self._warmup_steps(candidate.warmup_epochs))
        self.snapshots.focus(candidate.focus_classes)

    def stop(self) -> None:
        """Stop before the next step; the run saves a checkpoint and ``run()`` returns."""
        self._stop.set()
        self._running.set()

    def pause(self) -> None:
        self._running.clear()

    def resume_training(self) -> None:
        self._running.set()

    def _between_steps(self) -> bool:
        """Wait out a pause, then apply live changes; True when the run is to stop. Rank 0 decides for all ranks."""
        if not self._running.is_set():
            self._set_state("paused", "paused: press resume to continue")
            self._running.wait()
            if not self._stop.is_set():
                self._set_state("running", "resumed")
        with self._lock:
            changes, self._pending = self._pending, {}
        stop, changes = self.world.agree((self._stop.is_set(), changes))
        self._apply_changes(changes)
        return stop

    def _apply_changes(self, changes: dict) -> None:
        # a setting asked back to its value before it applied (N 2 -> 4 -> 2 within a step) is no change
        changes = {k: v for k, v in changes.items() if getattr(self.config, k) != v}
        if not changes:
            return
        old = {k: getattr(self.config, k) for k in changes}
        candidate = dataclasses.replace(self.config, **changes)
        try:
            self.memvir.set_hparams(num_steps=candidate.memvir_n, margin=candidate.memvir_m,
                                    warmup_steps=self._warmup_steps(candidate.warmup_epochs))
        except (MemoryError, RuntimeError) as error:
            if not _allocation_failed(error):
                raise
            # The memory for the new N, M could not be had: the run keeps its memory and trains on, the change
            # refused with the reason, rather than ending the run with what it trained since its last checkpoint.
            changes = self._refuse_memory_changes(changes, error)
            if not changes:
                return
            old = {k: getattr(self.config, k) for k in changes}
            candidate = dataclasses.replace(self.config, **changes)
        self.config = candidate
        self._set_learning_rates()
        if "focus_classes" in changes:
            self.snapshots.set_focus(self.config.focus_classes)
        described = ", ".join(f"{k} {old[k]} -> {v}" for k, v in changes.items())
        self._emit(ControlEvent(self.step, changes, f"{described}: applied at step {self.step + 1}",
                                previous={k: old[k] for k in changes}))

    def _refuse_memory_changes(self, changes: dict, error: BaseException) -> dict:
        """Tell the listeners that the changes of MemVir's settings in `changes` were not applied (set_hparams
        changes nothing when its allocation fails); the other changes, still to apply."""
        refused = {k: v for k, v in changes.items() if k in MEMORY_SETTINGS}
        described = ", ".join(f"{k} {getattr(self.config, k)} -> {v}" for k, v in refused.items())
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self._emit(ControlRefused(self.step, refused, reason, (
            f"{described}: refused at step {self.step + 1}, the memory could not be allocated ({reason}); the run "
            f"trains on with memvir_n {self.config.memvir_n}, memvir_m {self.config.memvir_m}")))
        return {k: v for k, v in changes.items() if k not in MEMORY_SETTINGS}

    def _set_learning_rates(self) -> None:
        """The optimizer's learning rates for the next step, from the configured ones and the decay."""
        self.optimizer.param_groups[0]["lr"] = self._lr(self.config.lr)
        self.optimizer.param_groups[1]["lr"] = self._lr(self.config.class_lr)

    def _lr(self, base: float) -> float:
        if self.config.lr_decay == "cosine":
            return base * 0.5 * (1 + math.cos(math.pi * self.step / max(1, self.total_steps)))
        if self.config.lr_decay == "step":  # the step being taken is in 1-based epoch step // steps_per_epoch + 1
            epoch = self.step // self.steps_per_epoch + 1
            return base * self.config.lr_decay_rate ** sum(epoch >= e for e in self.config.lr_decay_epochs)
        return base

    # -------------------------------------------------------------------------------------- the loop
    def run(self) -> str:
        """Train until the last epoch, ``max_steps``, or a stop, evaluating, logging and checkpointing as the config
        says.

        Returns:
            The final state: 'finished', or 'stopped' after `stop()`.

        Raises:
            TrainingDiverged: a NaN or infinite loss (after emitting the 'failed' status).
        """
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            checkpoint.remove_stale_temporaries(self.out_dir)  # what a process killed mid-checkpoint left
            checkpoint.save_text(self.config.to_json(), self.out_dir / checkpoint.TRAIN_CONFIG)
            checkpoint.write_records(self.history, self.out_dir / checkpoint.METRICS_LOG)
        self.state = "running"
        where = self.device.type if not self.world.is_distributed else f"{self.world.world_size} x {self.device.type}"
        split_rule = f" ({self.data.info.split_rule})" if self.data.info.split_rule else ""
        self._emit(StatusEvent("running", self.step, f"training {self.config.dataset}{split_rule} on {where}"))
        if self.step == 0 and self.config.eval_at_start:
            self.evaluate()
        while self.step < self.total_steps:
            epoch, position = divmod(self.step, self.steps_per_epoch)
            for images, labels in self.batches.epoch(epoch, position):
                if self._between_steps():
                    return self._finish("stopped", f"stopped at step {self.step}")
                self._train_step(images, labels, epoch)
                if self.step % self.config.checkpoint_every == 0:
                    self.save_checkpoint()
                if self.step >= self.total_steps:
                    break
            end_of_epoch = self.step % self.steps_per_epoch == 0
            last = self.step >= self.total_steps
            due = self.config.eval_every and (self.step // self.steps_per_epoch) % self.config.eval_every == 0
            if last or (end_of_epoch and due):
                self.evaluate()
            if not last:
                self.save_checkpoint()
        return self._finish("finished", f"finished {self.step} steps")

    def _train_step(self, images: torch.Tensor, labels: torch.Tensor, epoch: int) -> None:
        """One step: embed, MemVir's loss over the live and the virtual classes, update, report."""
        started = time.perf_counter()
        embeddings, labels = self._embed(images, labels)
        after_warmup = self.step >= self.memvir.warmup_steps  # this step's MemVir call is past the warm-up
        augmented, loss_share, num_loss_classes = self._memvir_loss(embeddings, labels)
        # every rank's share summed: the step's loss, the same on every rank (so is a NaN in any share)
        loss = self.world.sum(loss_share)
        # the values logged (a GPU syncs for them only at the steps that report, memvir.train.checks)
        loss_value, cosine_value = self._observe(embeddings, labels, loss)
        loss_scale = self._update(loss_share, after_warmup)
        self._report(epoch, started, labels.shape[0], augmented, num_loss_classes, loss_value, cosine_value,
                     loss_scale)

    def _embed(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's embeddings and labels: on a GPU in bfloat16 autocast, gathered over the ranks into the global
        batch (no-ops in one process) with gradients reaching this rank's rows."""
        self.model.train()
        if self.config.freeze_bn:
            for module in _batch_norms(self.model):
                module.eval()
        if not self._checks_every_step:
            check_labels(labels, self.class_weights.shape[0])  # on the CPU, before the batch goes to the GPU
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            # the paper's Softmax takes the head's raw output; every other loss unit vectors (the model's default)
            embeddings = self._network(images, normalize=False) if self._raw_embeddings else self._network(images)
        return self.world.gather_with_grad(embeddings.float()), self.world.gather(labels)

    def _memvir_loss(self, embeddings: torch.Tensor, labels: torch.Tensor):
        """The paper's step (docs/method.md, "Algorithm"): the live rows and classes extended with the memory's past
        steps as virtual classes, then the loss, unchanged, over all of them. Returns (the memory's output, this
        rank's share of the loss (memvir.train.distributed; the loss itself in one process), the number of classes
        the loss saw)."""
        try:
            augmented = self.memvir(embeddings, labels, self.class_weights)
        except NonFiniteError:  # refused, so the memory stays clean
            self._diverge(f"the embeddings or class weights became NaN or infinite at step {self.step + 1}")
        all_embeddings, all_labels, all_weights = augmented
        num_classes = self.class_weights.shape[0]
        if self.config.memvir_labels == "seen":  # the control: more instances of the seen classes, no new class
            all_labels, all_weights = all_labels % num_classes, self.class_weights
        # with neither option, the plain three-argument call of the loss contract
        options = {"classes_per_set": num_classes} if self.config.memvir_reduction == "balanced" else {}
        if augmented.num_live_rows < all_embeddings.shape[0]:
            # the memory's rows and weight rows are constants: the loss spends no gradient work on them, and given
            # MemVir's own output it keeps what it computes from pairs of stored steps for the later steps
            # (memvir.losses, "Cache"); the seen control's labels and weights are not that output
            seen = self.config.memvir_labels == "seen"
            options["live"] = (augmented.num_live_rows, num_classes) if seen else augmented.live
        if self.world.is_distributed:  # this rank's rows of the loss; one process computes the whole, share (0, 1)
            options["share"] = self.world.loss_share
        loss_share = self.loss_fn(all_embeddings, all_labels, all_weights, **options)
        return augmented, loss_share, all_weights.shape[0]

    def _observe(self, embeddings: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor):
        """Queue the step's loss and mean cos(x, W_y) (the paper's Fig. 5) for checking; (loss, cosine) as floats
        where this step reports, else (None, None): a GPU is not made to wait at every step."""
        with torch.no_grad():
            target_cosine = (F.normalize(embeddings, dim=1) * F.normalize(self.class_weights, dim=1)[labels]).sum(1)
            self._unchecked.add(self.step + 1, loss, target_cosine.mean())
        if self._checks_every_step or self._reports_at(self.step + 1):
            return self._checked()  # the host sync
        return None, None

    def loss_scale(self, after_warmup: bool) -> float:
        """What this step multiplies its loss by before the backward: the ablations' factors (1.0 without them).
        The step-schedule control's k(t)+1 follows the memory's current M and warm-up, as MemVir's own k(t) does."""
        scale = self.config.loss_scale_after_warmup if after_warmup else 1.0
        if self.config.loss_scale_schedule:
            scale *= 1 + virtual_sets_at(self.step, self.config.loss_scale_schedule, self.memvir.margin,
                                         self.memvir.warmup_steps)
        return scale

    def _update(self, loss_share: torch.Tensor, after_warmup: bool) -> float:
        """The backward of this rank's share of the loss and the optimiser's step; returns the factor the loss was
        multiplied by."""
        scale = self.loss_scale(after_warmup)
        # G times the share, so that the mean over the ranks is the loss: DDP averages the network's gradients and the
        # class weights' are averaged below (memvir.train.distributed, "Gradient scaling"); the ablations' scale too
        factor = scale * self.world.world_size
        loss = loss_share * factor if factor != 1.0 else loss_share  # the logged loss stays unscaled
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the network's gradients over the ranks here
        self.world.average_(self.class_weights.grad)  # not in DDP; also keeps the ranks' copies bit-equal
        self.optimizer.step()
        self.step += 1
        if self.config.lr_decay != "none":
            self._set_learning_rates()
        return scale

    def _report(self, epoch: int, started: float, batch: int, augmented: tuple, num_loss_classes: int,
                loss_value: float | None, cosine_value: float | None, loss_scale: float) -> None:
        """The step's record, event and snapshot, at their cadences."""
        all_embeddings, all_labels, all_weights = augmented
        num_classes = self.class_weights.shape[0]
        rate = batch / max(time.perf_counter() - started, 1e-9)
        self._speed = rate if self._speed is None else 0.9 * self._speed + 0.1 * rate
        # the spread of the classes at the snapshot cadence (the logging cadence without snapshots): cheap, but
        # each figure costs a host sync on a GPU, so not every step
        # (every rank computes them from the same gathered tensors, so that all ranks keep the same history)
        spread_every = self.config.snapshot_every or self.config.log_every
        spread = {}
        if self.step % spread_every == 0:
            spread = class_weight_spread(all_weights[:num_classes]) | virtual_spread(
                all_embeddings, all_labels, all_weights, num_classes)
        # the first and last steps too, so that every curve spans the whole run, however short
        logged = self.step % self.config.log_every == 0 or self.step in (1, self.total_steps) or bool(spread)
        event = StepEvent(
            step=self.step, epoch=epoch, loss=loss_value, num_classes=num_loss_classes,
            num_virtual_sets=self.memvir.num_virtual_sets, mean_target_cosine=cosine_value,
            images_per_s=self._speed, lr=self.optimizer.param_groups[0]["lr"],
            warmup=self.step <= self.memvir.warmup_steps, spread=spread, logged=logged,
            adam=eps_dominated_shares(self.optimizer) if logged else {},  # a host sync, at the log cadence only
            loss_scale=loss_scale if self._scales_loss else None,
        )
        if logged:
            self._log(event.record())
        self._emit(event)
        if self.config.snapshot_every and self.step % self.config.snapshot_every == 0 and self.world.is_main:
            self._emit(self.snapshots.make(self.model, self.step, self.memvir.margin, all_embeddings, all_labels,
                                           all_weights, num_classes))

    def _reports_at(self, step: int) -> bool:
        """Whether step `step` logs, snapshots, evaluates or saves anything (what needs its values checked)."""
        every = [self.config.log_every, self.config.checkpoint_every, self.steps_per_epoch,
                 self.config.snapshot_every]
        return step in (1, self.total_steps) or any(n and step % n == 0 for n in every)

    def _checked(self) -> tuple[float, float] | tuple[None, None]:
        """Check the unchecked steps' losses, and the steps MemVir stored since (without its per-step check), in
        one host sync each; TrainingDiverged at the first NaN or inf, else the latest step's (loss, mean target
        cosine)."""
        diverged, latest = self._unchecked.check()
        if diverged is not None:
            step, loss = diverged
            self._diverge(f"the loss became {loss} at step {step}")
        try:
            self.memvir.check_stored()
        except NonFiniteError:  # the memory holds zeros in the step's place, never its values
            self._diverge("the embeddings or class weights became NaN or infinite")
        return latest

    def _diverge(self, what: str) -> NoReturn:
        message = (f"{what}; the run stopped and the last good checkpoint is kept. Try a lower learning rate or a "
                   "smaller loss scale.")
        self.state = "failed"
        self._emit(StatusEvent("failed", self.step, message))
        raise TrainingDiverged(message)

    # -------------------------------------------------------------------------------------- views of the model
    def evaluate(self) -> dict:
        """Retrieval metrics on the test classes, and on the validation classes as "val_*" when some are held out
        (emits an EvalEvent). Call it on every rank: each embeds its shard and rank 0 scores them all."""
        metrics = self._score(self.data.test)
        if self.validation is not None:
            metrics |= {f"val_{name}": value for name, value in self._score(self.validation).items()}
        self.last_metrics = metrics
        self._emit(EvalEvent(self.step, self.step // self.steps_per_epoch, dict(self.last_metrics)))
        return self.last_metrics

    def _score(self, split) -> dict:
        total = len(split)
        embeddings, labels = evaluation.embed(self.model, split, self.world.shard(total),
                                           num_workers=self.config.num_workers)
        embeddings = self.world.gather_shards(embeddings, total, self.device)
        labels = self.world.gather_shards(labels, total, self.device)
        metrics = evaluation.score(embeddings, labels, self.config.dataset) if self.world.is_main else None
        return self.world.agree(metrics)

    # -------------------------------------------------------------------------------------- state on disk
    def save_checkpoint(self) -> Path | None:
        """Write the trainer state and the Hub files of the current model into the run folder, as one set: a kill at
        any moment leaves the folder loadable (`checkpoint.staged`)."""
        if self.out_dir is None:
            return None
        self._checked()  # never save a state whose steps are not all known to be finite
        with checkpoint.staged(self.out_dir) as stage:
            checkpoint.save_state(self.state_dict(), stage / checkpoint.TRAINER_STATE)
            # the MemVir it started with, then each live change at its step: the settings now did not hold throughout
            changes = live_changes(self.history)
            start = started_with(self.config, changes)
            card_extra = {"command": self.command,
                          "MemVir": memvir_summary(start, self._warmup_steps(start.warmup_epochs)),
                          **({"Live changes": changes_summary(changes)} if changes else {}),
                          "train_config": self.config.to_dict(), "step": self.step}
            card_kwargs = {}
            if self.config.init_from:
                card_kwargs["backbone_origin"] = f"initialised from the checkpoint {self.config.init_from}"
            self.model.save_pretrained(stage, metrics=self.last_metrics or None, card_extra=card_extra,
                                       model_card_kwargs=card_kwargs)
        return self.out_dir / checkpoint.TRAINER_STATE

    def state_dict(self) -> dict:
        """Everything a resume needs (what trainer_state.pt holds, memvir.train.state): the config, the step, the
        model, the class weights, the optimizer, the MemVir memory, the loss's own state, the random state and the
        records so far; tensors and plain containers only, so it loads without unpickling code."""
        return {
            "format": STATE_FORMAT,
            "config": self.config.to_dict(),
            "step": self.step,
            "model": self.model.state_dict(),
            "class_weights": self.class_weights.detach().cpu(),
            "optimizer": self.optimizer.state_dict(),
            "memvir": self.memvir.state_dict(),
            "loss": self.loss_fn.state_dict(),
            "rng": torch.get_rng_state(),
            "history": list(self.history),
            "last_metrics": dict(self.last_metrics),
        }

    def load_state_dict(self, state: dict, path: Path | str = "the trainer state") -> None:
        """Put `state` (from `state_dict`, read from `path`) into this Trainer, built with the state's config;
        CheckpointError when a part does not fit it."""
        try:
            self.model.load_state_dict(state["model"])
            with torch.no_grad():
                self.class_weights.copy_(state["class_weights"])
            self.optimizer.load_state_dict(state["optimizer"])
            # the memory's N, M, U are the live ones saved with it; the warm-up follows this run's steps per epoch
            self.memvir.load_state_dict(state["memvir"])
            self.loss_fn.load_state_dict(state["loss"])
            torch.set_rng_state(state["rng"])
            self.step = int(state["step"])
            self.history = list(state["history"])
            self.last_metrics = dict(state["last_metrics"])
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise checkpoint.CheckpointError(
                f"{path} does not fit the run it describes ({error}): it is damaged or was edited. The model files "
                "beside it may still load (memvir eval); to train on, start a new run in a new folder"
            ) from error

    def _set_state(self, state: str, message: str) -> None:
        self.state = state
        self._emit(StatusEvent(state, self.step, message))

    def _finish(self, state: str, message: str) -> str:
        saved = self.save_checkpoint()
        self.batches.release_workers()
        self.state = state
        self._emit(StatusEvent(state, self.step, message, checkpoint=str(saved) if saved else None))
        return state

