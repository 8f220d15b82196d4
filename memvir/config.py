"""TrainConfig: everything a training run needs, in one frozen, validated, JSON round-tripping dataclass.

Each setting is declared once, with its default and its help text (field metadata): the command line builds its
`train` options from them (memvir.cli), the app takes its defaults from them, and a checkpoint stores the config
as JSON. Which settings may change while a run trains (`LIVE_SETTINGS`) or when it is resumed (`RESUMABLE`) is
declared here too. A config is frozen: a change is a new config (`dataclasses.replace`), validated as it is made.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from memvir.checkpoint import CheckpointError, RunFolder
from memvir.losses import LOSS_REGISTRY, LOSSES, build_loss
from memvir.memory import size as memory_size
from memvir.memory.virtual_classes import SCHEDULES

STORE_DTYPES = tuple(memory_size.STORE_DTYPES)
SAMPLERS = ("random", "balanced")
LR_DECAYS = ("none", "cosine", "step")
# How the loss averages over MemVir's sets (memvir.losses, docs/method.md "Reduction"): "official" is the mean over
# all (k+1)B rows, as the reference code; "balanced" sums each set's own mean, so the live batch's gradient keeps the
# weight it has without MemVir.
REDUCTIONS = ("official", "balanced")
# What the stored embeddings are labelled in the loss (docs/method.md, "Virtual or seen labels"): "virtual" is MemVir
# (a past copy of class c is a new class, with its stored weight appended); "seen" is the control in which the same
# memory only adds more instances of the seen classes (labels y, no stored weights), as XBM and BroadFace do.
MEMORY_LABELS = ("virtual", "seen")
FOCUS_CLASSES = 8  # the few-class view's default: few enough to tell apart by colour, enough to show a spread
MAX_FOCUS_CLASSES = 20
# Where a run's metrics are also sent (memvir.train.reporting): besides metrics.jsonl, which every run writes.
REPORT_TO = ("none", "trackio", "tensorboard")
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")  # NAME or OWNER/NAME
_MAX_SEED = 2**63 - 2  # the model's initial class weights are drawn with seed + 1, which torch takes as an int64
_MAX_WARMUP_EPOCHS = 1_000_000  # far past any run; bounds the conversion to steps, which inf or 1e308 would overflow


class SettingRefused(ValueError):
    """TrainConfig refused one setting: `setting` (its field's name) and what is wrong with its value (`detail`,
    e.g. "must be an integer >= 0, got -1"), as data, so that a front end names the setting in its own words."""

    def __init__(self, setting: str, detail: str):
        super().__init__(f"TrainConfig: {setting} {detail}")
        self.setting = setting
        self.detail = detail

    def __reduce__(self):  # pickled by the app's run process with its fields, not its message alone
        return type(self), (self.setting, self.detail)


def _need(condition, message: str) -> None:
    if not condition:
        raise ValueError(f"TrainConfig: {message}")


def _need_setting(condition, setting: str, detail: str) -> None:
    if not condition:
        raise SettingRefused(setting, detail)


def _need_choice(config, name: str, choices: tuple) -> None:
    value = getattr(config, name)
    _need_setting(value in choices, name, f"must be one of {', '.join(choices)}, got {value!r}")


def _setting(default=None, help: str = "", *, factory=None, flag: str | None = None, cli: bool = True,
             live: bool = False, resumable: bool = False, choices: tuple | None = None, item_type=None):
    """A TrainConfig field with what the command line and the app need to offer it.

    flag: its command-line option (default --name-with-dashes); cli=False keeps it off the command line (the app's
    own settings). live: `Trainer.update` may change it while the run trains (and a resume may too). resumable: a
    resumed run may change it. choices: argparse's choices. item_type: the type of a list's items.
    """
    metadata = {"help": help, "flag": flag, "cli": cli, "live": live, "resumable": resumable or live,
                "choices": choices, "item_type": item_type}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs; JSON round-trips. Defaults: the embedded glyphs on a laptop CPU."""

    dataset: str = _setting("glyphs", "glyphs | glyphs-mini | glyphs-pretrain (for pretraining) | glyphs-few (~116 "
                            "classes to fine-tune on, disjoint from glyphs-pretrain's) | cub200 | cars196 | sop | "
                            "folder:PATH | hf:OWNER/NAME[@REVISION] (a Hub image-classification dataset, read "
                            "through 🤗 datasets; classes split as the benchmarks split them)")
    data_root: str | None = _setting(None, "folder of cub200 / cars196 / sop", resumable=True)
    image_column: str | None = _setting(
        None, "for hf: datasets, the column of images (default: the dataset's one Image feature)")
    label_column: str | None = _setting(
        None, "for hf: datasets, the column of classes (default: the dataset's one ClassLabel feature; a column of "
        "strings or integers works too, its distinct values being the classes)")
    image_size: int | None = _setting(None, "input size (default: the dataset's own; a timm backbone's own)")
    backbone: str = _setting("convnet", "convnet | convnet-gn | resnet18 | resnet50 | googlenet | timm:NAME (a timm "
                             "model, e.g. timm:resnet50.a1_in1k; its size, mean, std and resizing are its own)")
    pretrained: bool = _setting(False, "start from pretrained weights: ImageNet's (torchvision, cached or online), or "
                                "for timm:NAME the Hub's through timm (the Hugging Face cache or online)")
    init_from: str | None = _setting(
        None, "start the backbone from this checkpoint folder (config.json + model.safetensors, read offline), and "
        "the embedding head too where the embedding dimension is the same; never its class weights (e.g. "
        "checkpoints/glyphs-pretrain-convnet, pretrained on glyphs-pretrain, for --dataset glyphs-few)",
        flag="--init")
    embedding_dim: int = _setting(128, "embedding dimension")
    loss: str = _setting("norm-softmax", "one of memvir.LOSSES")
    loss_params: dict = _setting(factory=dict, help="the loss's hyper-parameters (--scale, --margin, --alpha)",
                                 cli=False)
    # Defaults chosen on glyphs (docs/benchmarks.md): at a CPU budget of 8 epochs a gentle curriculum costs the least
    # Recall@1 while two virtual sets still arrive within a couple of minutes (paper's CARS setting: N=45, M=10).
    memvir_n: int = _setting(2, "N, the past steps used as virtual classes; 0 = the baseline", live=True)
    memvir_m: int = _setting(50, "M, the gap between used steps", live=True)
    warmup_epochs: float = _setting(2.0, "U, the warm-up in epochs, converted to steps", live=True)
    memvir_store_dtype: str = _setting("float32", "float32 | float16 | bfloat16: the memory's precision",
                                       flag="--store-dtype")
    memvir_schedule: str = _setting(
        "curriculum", "curriculum (the paper's staircase) | all-at-once (all N sets when the warm-up ends)")
    memvir_reduction: str = _setting(
        "official", "official: the loss is the mean over all (k+1)B rows, as the reference code (the live batch "
        "weighs 1/(k+1)); balanced: each set averaged on its own and the means summed, which with MemVir's "
        "equal-size batches is (k+1) x official for the row-averaged losses: a larger step, same direction",
        choices=REDUCTIONS)
    memvir_labels: str = _setting(
        "virtual", "virtual (MemVir: stored embeddings and weights become new classes) | seen (the control: stored "
        "embeddings keep their own classes and no stored weight is used, as XBM and BroadFace)", choices=MEMORY_LABELS)
    loss_scale_after_warmup: float = _setting(
        1.0, "ablation: multiply the loss by this once the warm-up is over (0.5 in a baseline imitates "
        "MemVir(1, M)'s official dilution without virtual classes)")
    loss_scale_schedule: int = _setting(
        0, "ablation, the step-schedule control: N of a MemVir whose step schedule a baseline (--memvir-n 0) takes: "
        "its loss is multiplied by k(t)+1, k(t) the virtual sets MemVir(this N, --memvir-m) uses at step t after the "
        "same warm-up; balanced MemVir's exact step schedule without a virtual row (0: off)")
    epochs: int = _setting(8, "epochs to train", resumable=True)
    batch_size: int = _setting(128, "images per step")
    sampler: str = _setting("random", "random (the reference's) | balanced (P classes x K images)")
    samples_per_class: int = _setting(4, "K, images of each class in a batch of the balanced sampler")
    lr: float = _setting(1e-3, "network learning rate", live=True)
    class_lr: float = _setting(1e-2, "class-weight learning rate", live=True)
    weight_decay: float = _setting(1e-4, "Adam's weight decay")
    adam_eps: float = _setting(
        0.01, "Adam's epsilon (the reference's; with it many parameters take steps that scale with their gradient)")
    freeze_bn: bool = _setting(
        False, "keep BatchNorm layers in eval mode (fixed running statistics) while training, as the reference's "
        "--freeze_BN (for pretrained backbones; off for the from-scratch CPU ones)")
    lr_decay: str = _setting("none", "none (MemVir's: docs/method.md, \"Reference settings\") | cosine | step")
    lr_decay_epochs: list = _setting(
        factory=list, help="with --lr-decay step: the (1-based) epochs at whose start the learning rates drop",
        item_type=int)
    lr_decay_rate: float = _setting(0.1, "with --lr-decay step: the factor of each drop")
    seed: int = _setting(0, "seeds the model, the batches and the augmentation")
    device: str = _setting("auto", "auto | cpu | cuda | cuda:N", resumable=True)
    num_workers: int = _setting(0, "data loader processes", resumable=True)
    eval_every: int = _setting(1, "epochs between evaluations (0: only at the end)", resumable=True)
    log_every: int = _setting(10, "steps between the step records of metrics.jsonl", resumable=True)
    snapshot_every: int = _setting(25, "steps between embedding snapshots (0: none)", cli=False, resumable=True)
    checkpoint_every: int = _setting(200, "steps between checkpoints, besides epoch ends and stops", resumable=True)
    probe_classes: int = _setting(8, "test classes in the snapshots' fixed probe set", cli=False)
    focus_classes: list = _setting(
        factory=list, help="training classes of the snapshots' few-class view (their clean images, live and "
        f"virtual weights, stored embeddings); empty: {FOCUS_CLASSES} drawn with the run's seed", cli=False,
        live=True, item_type=int)
    val_classes: int = _setting(0, "training classes held out as validation, scored as val_* metrics (for choices "
                                   "made without the test classes)")
    val_fold: int = _setting(0, "which of the class-disjoint folds of --val-classes classes each is held out: fold f "
                                "is the f-th block of a fixed permutation of the training classes")
    augment: bool = _setting(True, "train on the clean images, without random augmentation", flag="--no-augment")
    max_steps: int | None = _setting(None, "stop after this many steps", resumable=True)
    eval_at_start: bool = _setting(True, "the untrained model's metrics as the first point of the curve", cli=False,
                                   resumable=True)
    compile: bool = _setting(False, "torch.compile the network (pays off on a GPU over long runs)", resumable=True)
    report_to: str = _setting(
        "none", "also send each logged step's and evaluation's metrics to trackio (its local dashboard: trackio show; "
        "or a Space: --report-space) or tensorboard (event files in the run folder's tensorboard/); under torchrun "
        "rank 0 alone", choices=REPORT_TO, resumable=True)
    report_project: str = _setting("memvir", "with --report-to trackio: the trackio project of the run", resumable=True)
    report_space: str | None = _setting(
        None, "with --report-to trackio: a Hugging Face Space (OWNER/NAME) whose trackio dashboard receives the run "
        "instead of the local one (created if missing, with your Hub login)", resumable=True)
    report_bucket: str | None = _setting(
        None, "with --report-space: the Hugging Face bucket (OWNER/NAME) that keeps the Space's metrics (default: "
        "trackio's, named after the Space)", resumable=True)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """ValueError naming the first setting that is out of range. The whole numbers come first: the checks of
        each group after them (optimiser, MemVir, data, model, reporting) compute with them."""
        self._check_whole_numbers()
        self._check_optimiser()
        self._check_memvir()
        self._check_data()
        self._check_model()
        self._check_reporting()

    def _check_whole_numbers(self) -> None:
        for name in ("memvir_n", "memvir_m", "loss_scale_schedule", "num_workers", "eval_every", "log_every",
                     "snapshot_every", "seed", "val_classes", "val_fold"):
            value = getattr(self, name)
            _need_setting(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                          name, f"must be an integer >= 0, got {value!r}")
        for name in ("epochs", "batch_size", "embedding_dim", "samples_per_class", "checkpoint_every", "probe_classes"):
            value = getattr(self, name)
            _need_setting(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                          name, f"must be an integer >= 1, got {value!r}")
        _need_setting(self.seed <= _MAX_SEED, "seed", f"must be at most {_MAX_SEED:,}, got {self.seed:,}")
        _need(self.max_steps is None or (isinstance(self.max_steps, int) and self.max_steps >= 1),
              f"max_steps must be None or an integer >= 1, got {self.max_steps!r}")
        # imported here: `python -m memvir --help` reads this module, and the models bring torchvision
        from memvir.models.embedding_model import MAX_EMBEDDING_DIM

        _need(self.embedding_dim <= MAX_EMBEDDING_DIM,
              f"embedding_dim must be at most {MAX_EMBEDDING_DIM:,}, got {self.embedding_dim:,}")

    def _check_optimiser(self) -> None:
        """The learning rates, Adam's settings and their decay."""
        for name in ("lr", "class_lr", "adam_eps", "loss_scale_after_warmup"):
            value = getattr(self, name)
            _need_setting(isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf,
                          name, f"must be > 0 and finite, got {value!r}")
        _need(isinstance(self.weight_decay, int | float) and 0 <= self.weight_decay < math.inf,
              f"weight_decay must be >= 0 and finite, got {self.weight_decay!r}")
        _need_choice(self, "lr_decay", LR_DECAYS)
        _need(isinstance(self.lr_decay_epochs, list | tuple) and all(
            isinstance(e, int) and not isinstance(e, bool) and e >= 1 for e in self.lr_decay_epochs),
            f"lr_decay_epochs must be a list of epochs >= 1, got {self.lr_decay_epochs!r}")
        _need(self.lr_decay != "step" or self.lr_decay_epochs,
              "lr_decay 'step' needs lr_decay_epochs, the epochs at whose start the learning rates drop")
        _need(isinstance(self.lr_decay_rate, int | float) and not isinstance(self.lr_decay_rate, bool)
              and 0 < self.lr_decay_rate <= 1, f"lr_decay_rate must be in (0, 1], got {self.lr_decay_rate!r}")

    def _check_memvir(self) -> None:
        """MemVir's warm-up, memory, schedule and loss, and the ablations that go with some of them only."""
        _need_setting(isinstance(self.warmup_epochs, int | float) and 0 <= self.warmup_epochs <= _MAX_WARMUP_EPOCHS,
                      "warmup_epochs", f"must be a number from 0 to {_MAX_WARMUP_EPOCHS:,}, got {self.warmup_epochs!r}")
        for name, choices in (("memvir_store_dtype", STORE_DTYPES), ("memvir_schedule", SCHEDULES),
                              ("memvir_reduction", REDUCTIONS), ("memvir_labels", MEMORY_LABELS)):
            _need_choice(self, name, choices)
        _need(self.memvir_labels != "seen" or self.memvir_reduction == "official",
              "memvir_labels 'seen' keeps every row in the seen classes, so there are no sets for the balanced "
              "reduction to average apart; use the official reduction with it")
        _need(self.loss_scale_schedule == 0 or self.memvir_n == 0,
              f"loss_scale_schedule {self.loss_scale_schedule} is the baseline's control (balanced MemVir's step "
              f"schedule without its virtual rows); use it with memvir_n 0, not {self.memvir_n}")
        _need(self.loss_scale_schedule == 0 or self.memvir_schedule == "curriculum",
              "loss_scale_schedule follows the curriculum's staircase; use it with memvir_schedule 'curriculum'")

    def _check_data(self) -> None:
        """The batches, the validation classes, the snapshots' few classes and a Hub dataset's columns."""
        _need_choice(self, "sampler", SAMPLERS)
        _need(self.sampler != "balanced" or self.batch_size % self.samples_per_class == 0,
              f"batch_size {self.batch_size} must be a multiple of samples_per_class {self.samples_per_class} "
              "for the balanced sampler")
        _need_setting(isinstance(self.focus_classes, list | tuple) and len(self.focus_classes) <= MAX_FOCUS_CLASSES
                      and len(set(self.focus_classes)) == len(self.focus_classes) and all(
                          isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in self.focus_classes),
                      "focus_classes", f"must be at most {MAX_FOCUS_CLASSES} distinct training-class indices >= 0, "
                      f"got {self.focus_classes!r}")
        _need(self.val_fold == 0 or self.val_classes > 0,
              f"val_fold {self.val_fold} needs val_classes, the size of each fold")
        for name in ("image_column", "label_column"):
            value = getattr(self, name)
            _need(value is None or (isinstance(value, str) and value.strip() != ""),
                  f"{name} must be None or a column name, got {value!r}")
            _need(value is None or self.dataset.startswith("hf:"),
                  f"{name} names a column of a Hub dataset (hf:OWNER/NAME); dataset {self.dataset!r} has no columns")

    def _check_model(self) -> None:
        """The switches, the loss and its hyper-parameters, the backbone and where its weights start."""
        for name in ("compile", "freeze_bn", "pretrained", "augment", "eval_at_start"):
            _need(isinstance(getattr(self, name), bool), f"{name} must be True or False, got {getattr(self, name)!r}")
        _need(self.loss in LOSSES, LOSS_REGISTRY.refusal(self.loss))
        _need(isinstance(self.loss_params, dict), "loss_params must be a dict such as {'scale': 23}")
        build_loss(self.loss, **self.loss_params)  # bad loss hyper-parameters fail here, in the loss's words
        _need(self.init_from is None or (isinstance(self.init_from, str) and self.init_from.strip() != ""),
              f"init_from must be None or a checkpoint folder's path, got {self.init_from!r}")
        _need(not (self.pretrained and self.init_from),
              "pretrained (ImageNet weights) and init_from (a checkpoint folder) both choose the starting weights; "
              "pass one of them")
        _need(isinstance(self.backbone, str), f"backbone must be a name such as 'convnet', got {self.backbone!r}")
        # imported here: `python -m memvir --help` reads this module, and the models bring torchvision
        from memvir.models.backbones import check_backbone

        try:  # a timm name is checked against timm's registry (no download): a typo fails before any data loads
            check_backbone(self.backbone, self.pretrained)
        except ValueError as error:
            _need(False, str(error))

    def _check_reporting(self) -> None:
        """Where the metrics are also sent."""
        _need_choice(self, "report_to", REPORT_TO)
        _need(isinstance(self.report_project, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.report_project),
              f"report_project must be a name of letters, digits, '.', '_' or '-', got {self.report_project!r}")
        for name in ("report_space", "report_bucket"):
            value = getattr(self, name)
            _need(value is None or (isinstance(value, str) and _HUB_NAME.fullmatch(value)),
                  f"{name} must be a Hugging Face id such as your-name/memvir-runs, got {value!r}")
        _need(self.report_space is None or self.report_to == "trackio",
              f"report_space {self.report_space!r} is where trackio sends the run; add report_to trackio (it is "
              f"{self.report_to!r})")
        _need(self.report_bucket is None or self.report_space is not None,
              f"report_bucket {self.report_bucket!r} keeps a trackio Space's metrics; name the Space too "
              "(report_space)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown setting(s) {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_run_folder(cls, folder: str | Path) -> TrainConfig:
        """The config a run folder's train_config.json holds.

        Args:
            folder: a run folder (`memvir train --out`, or one of the app's runs).

        Returns:
            The TrainConfig; a setting added since the folder was written reads as its default.

        Raises:
            CheckpointError: the file is missing, damaged or holds settings this version refuses; the message names it.
        """
        run = RunFolder(folder)
        values = run.config_dict()
        try:
            return cls.from_dict(values)
        except (ValueError, TypeError) as error:
            raise CheckpointError(f"{run.config_file} holds no readable run config ({error})") from error


LIVE_SETTINGS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.metadata["live"])
"""What `Trainer.update` changes while a run trains."""
RESUMABLE = frozenset(f.name for f in dataclasses.fields(TrainConfig) if f.metadata["resumable"])
"""Settings a resumed run may change: its length, the live hyper-parameters, and where and how it runs. The others
(data, model, loss, batch, sampler, seed, reduction...) made the model, optimizer and memory its checkpoint holds."""


class ResumeConflict(ValueError):
    """A resume was asked to change settings outside RESUMABLE; `changes` holds them as {setting: (old, new)}."""

    def __init__(self, message: str, changes: dict):
        super().__init__(message)
        self.changes = changes


def resume_changes(stored: TrainConfig, overrides: dict, where) -> dict:
    """{setting: (old, new)} for the `overrides` (None: keep) that differ from the run's `stored` config; a value
    equal to the run's is no change, `loss_params` merge into the run's. ResumeConflict for a change outside
    RESUMABLE (`where`: the run folder, for the message)."""
    known = stored.to_dict()
    changes = {}
    for name, value in overrides.items():
        if name not in known:
            raise ValueError(f"TrainConfig: unknown setting {name}")
        old = known[name]
        new = {**old, **value} if name == "loss_params" and isinstance(value, dict) else value
        if value is not None and new != old:
            changes[name] = (old, new)
    refused = sorted(set(changes) - RESUMABLE)
    if refused:
        described = ", ".join(f"{name} ({changes[name][0]!r} -> {changes[name][1]!r})" for name in refused)
        raise ResumeConflict(
            f"cannot change {described} when resuming {where}: its checkpoint holds a model, optimizer and memory "
            "made for the run's settings. Start a new run in a new folder to train with other settings",
            {name: changes[name] for name in refused},
        )
    return changes
