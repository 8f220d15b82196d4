"""Settings that suit each embedded dataset, put into the Train tab's controls when the visitor picks the dataset;
the page opens with glyphs' (its default dataset).

glyphs: the widened fair comparison's choice (docs/reproduction.md, "A converged search"; bench/fair_study.py,
profile wide). Every MemVir arm (the paper's reduction, balanced, the memory with seen labels) searched the same 6
points of a wide box over its optimiser, N and M, and the baseline the same points with and without a loss multiplier
after the warm-up (12 trials, as many as both reductions together), scored on validation MAP@R over two class-disjoint
folds of the training classes, never on test; a choice on the box's edge grew the box. The preset is the MemVir arm
whose choice scored higher (balanced, MemVir(4, 10)), and "Compare with baseline" trains the baseline arm's own choice
(`baseline`: the same optimiser point, its loss x2 after the warm-up), not N = 0 with MemVir's settings. The bundled
checkpoints are the two arms' seed-0 finals. The library keeps the reference's official reduction and optimiser as its
defaults; the page departs from them here.

glyphs-mini has 288 training images: at the library's batch of 128 a run of 8 epochs is 16 steps, which ends before
the library's warm-up and gap (2 epochs, then M + 1 = 51 steps) let a single virtual set arrive. Its preset trains
in batches of 32 with a short warm-up and gap, so all its virtual sets arrive early in a run of the default length.
It was not studied and keeps the reference's optimiser. A folder or a zip keeps what the controls hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from memvir.config import TrainConfig
from memvir.losses import loss_defaults


@dataclass(frozen=True)
class Optimiser:
    """The settings the fair comparison searched for every arm: the two learning rates, Adam's eps, the loss's scale,
    and (the baseline's, in the widened search) a multiplier of the loss once the warm-up ends."""

    lr: float
    class_lr: float
    adam_eps: float
    scale: float
    loss_scale_after_warmup: float = 1.0

    def settings(self) -> dict:
        """The TrainConfig fields it sets (the scale is Norm-softmax's, the loss every preset trains)."""
        return {"lr": self.lr, "class_lr": self.class_lr, "adam_eps": self.adam_eps,
                "loss_params": {"scale": self.scale}, "loss_scale_after_warmup": self.loss_scale_after_warmup}

    def describe(self) -> str:
        multiplied = (f", loss x{self.loss_scale_after_warmup:g} after the warm-up"
                      if self.loss_scale_after_warmup != 1 else "")
        return (f"lr {self.lr:g}, class-weight lr {self.class_lr:g}, Adam eps {self.adam_eps:g}, scale "
                f"{self.scale:g}{multiplied}")


# The reference code's (and the library's defaults): lr 1e-3, class weights 1e-2, eps 0.01, Norm-softmax scale 23.
REFERENCE = Optimiser(1e-3, 1e-2, 1e-2, 23.0)


@dataclass(frozen=True)
class Preset:
    batch_size: int
    epochs: int
    memvir_n: int
    memvir_m: int
    warmup_epochs: float
    memvir_reduction: str
    note: str  # what the visitor is told: the settings, and when the virtual sets arrive
    optimiser: Optimiser = REFERENCE
    # The baseline's own tuned optimiser, which "Compare with baseline" trains; None: the run's, with N = 0.
    baseline: Optimiser | None = None
    tuning: str = ""  # the search both were chosen by, in words, for the results table

    def settings(self) -> dict:
        """The TrainConfig fields it sets."""
        return {"loss": "norm-softmax", "batch_size": self.batch_size, "epochs": self.epochs,
                "memvir_n": self.memvir_n, "memvir_m": self.memvir_m, "warmup_epochs": self.warmup_epochs,
                "memvir_reduction": self.memvir_reduction, **self.optimiser.settings()}


def arrival_steps(steps_per_epoch: int, warmup_epochs: float, memvir_n: int, memvir_m: int) -> list[int]:
    """The steps, numbered as the charts number them (1 = the first step), at which virtual set 1..N first takes
    part: the U warm-up steps store nothing, then set j is in use from the step after j(M+1) stored steps."""
    warmup = round(warmup_epochs * steps_per_epoch)
    return [warmup + j * (memvir_m + 1) + 1 for j in range(1, memvir_n + 1)]


def _arrivals_text(steps_per_epoch: int, warmup_epochs: float, memvir_n: int, memvir_m: int) -> str:
    steps = [f"{step:,}" for step in arrival_steps(steps_per_epoch, warmup_epochs, memvir_n, memvir_m)]
    named = steps[0] if len(steps) == 1 else ", ".join(steps[:-1]) + f" and {steps[-1]}"
    return f"At {steps_per_epoch} steps an epoch, the virtual sets arrive at steps {named}."


PRESETS = {
    # 12,251 training images (glyphs v2): 95 whole batches an epoch
    "glyphs": Preset(128, 12, 4, 10, 2.0, "balanced",
                     "Settings for glyphs from the widened fair comparison (docs/reproduction.md, \"A converged "
                     "search\"), where MemVir and the baseline were each tuned by a search on validation classes: "
                     "batch 128, 12 epochs, N = 4, M = 10, warm-up 2 epochs, balanced reduction, lr 0.000702, "
                     "class-weight lr 0.00287, Adam eps 0.0001, scale 17.1; Compare with baseline trains the "
                     "baseline's own tuned settings (the same, its loss x2 after the warm-up). "
                     + _arrivals_text(95, 2.0, 4, 10),
                     optimiser=Optimiser(0.000702, 0.00287, 1e-4, 17.1),
                     baseline=Optimiser(0.000702, 0.00287, 1e-4, 17.1, loss_scale_after_warmup=2.0),
                     tuning="each chosen by the widened search (12 trials for the baseline, its loss multiplier after "
                            "the warm-up included, 6 for each MemVir arm), scored on 2 class-disjoint validation "
                            "folds (docs/reproduction.md, \"A converged search\")"),
    # 288 training images: 9 steps an epoch
    "glyphs-mini": Preset(32, TrainConfig().epochs, 3, 10, 1.0, "balanced",
                          "Settings for glyphs-mini: batch 32, N = 3, M = 10, warm-up 1 epoch. "
                          + _arrivals_text(9, 1.0, 3, 10)),
}
# The page's opening settings: the library's, with its default dataset's preset
PAGE_DEFAULTS = {**TrainConfig().to_dict(), **PRESETS[TrainConfig().dataset].settings()}
# The settings a preset's baseline was tuned at besides its dataset: a run that differs in one of them gets a
# baseline with its own optimiser (N = 0), and the results table says it was not tuned.
TUNED_AT = ("loss", "backbone", "pretrained", "embedding_dim", "batch_size", "epochs", "val_classes", "augment",
            "sampler", "weight_decay", "lr_decay", "freeze_bn")


def tuned_baseline(config: TrainConfig) -> Optimiser | None:
    """The tuned baseline optimiser for a run of `config`, when its dataset's preset has one and the run trains at
    the settings it was tuned at (TUNED_AT, the preset's loss, batch and epochs, the library's others)."""
    preset = PRESETS.get(config.dataset)
    if preset is None or preset.baseline is None:
        return None
    tuned = TrainConfig(dataset=config.dataset, **preset.settings()).to_dict()
    settings = config.to_dict()
    return preset.baseline if all(settings[name] == tuned[name] for name in TUNED_AT) else None


def optimiser_of(config: TrainConfig) -> Optimiser:
    """What a run's optimiser settings are, in the presets' terms (its loss's scale, or the loss's default)."""
    scale = config.loss_params.get("scale", loss_defaults(config.loss).get("scale", float("nan")))
    return Optimiser(config.lr, config.class_lr, config.adam_eps, scale, config.loss_scale_after_warmup)


def suggest_settings(dataset):
    """(batch size, epochs, N, M, warm-up, reduction, lr, class-weight lr, Adam eps, loss, scale, notice) for the
    dataset just picked; unchanged controls for a folder or a zip."""
    preset = PRESETS.get(dataset)
    if preset is None:
        return (gr.skip(),) * 12
    optimiser = preset.optimiser
    return (preset.batch_size, preset.epochs, preset.memvir_n, preset.memvir_m, preset.warmup_epochs,
            preset.memvir_reduction, optimiser.lr, optimiser.class_lr, optimiser.adam_eps, "norm-softmax",
            optimiser.scale, preset.note)
