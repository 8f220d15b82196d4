"""The reproduction study's definitions: every configuration (a Row) of every study, which rows two studies share,
which study continues another, and the statistics the tables and plots report (mean ± sd, paired t).

Imported by the runner (reproduce.py) and the plots (reproduction_plots.py); it imports neither.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "reproduction" / "results.json"
PLOTS = ROOT / "docs" / "reproduction"
RUNS = ROOT / "runs" / "reproduction"
SEEDS = (0, 1, 2)
VAL_CLASSES = 100
METRICS = ("recall@1", "r_precision", "map@r")
# What a choice is made on: MAP@R of the validation classes. Their Recall@1 saturates (about 99 % among 100 classes
# against about 91 % among the 1,021 test classes), while MAP@R still separates configurations.
CHOICE_METRIC = "val_map@r"


@dataclass(frozen=True)
class Row:
    """One configuration of a study; N = 0 is the baseline. Fields at their defaults add no flag to the command."""

    label: str
    loss: str = "norm-softmax"
    n: int = 0
    m: int = 0
    warmup: float = 0.0
    batch: int = 128
    epochs: int = 8
    schedule: str = "curriculum"
    val_classes: int = VAL_CLASSES
    eval_every: int = 1
    reduction: str = "official"
    loss_scale: float = 1.0  # --loss-scale-after-warmup
    adam_eps: float | None = None  # None: the Trainer's default (0.01, the reference's)
    augment: bool = True
    seeds: tuple[int, ...] = SEEDS

    def args(self, seed: int) -> list[str]:
        args = ["-m", "memvir", "train", "--dataset", "glyphs", "--loss", self.loss, "--memvir-n", str(self.n),
                "--memvir-m", str(self.m), "--warmup-epochs", f"{self.warmup:g}", "--epochs", str(self.epochs),
                "--batch-size", str(self.batch), "--seed", str(seed)]
        if self.schedule != "curriculum":
            args += ["--memvir-schedule", self.schedule]
        if self.val_classes:
            args += ["--val-classes", str(self.val_classes)]
        if self.eval_every != 1:
            args += ["--eval-every", str(self.eval_every)]
        if self.reduction != "official":
            args += ["--memvir-reduction", self.reduction]
        if self.loss_scale != 1.0:
            args += ["--loss-scale-after-warmup", f"{self.loss_scale:g}"]
        if self.adam_eps is not None:
            args += ["--adam-eps", f"{self.adam_eps:g}"]
        if not self.augment:
            args += ["--no-augment"]
        return args

    def folder(self, study: str, seed: int) -> Path:
        name = f"{study}-{self.loss}-n{self.n}-m{self.m}-u{self.warmup:g}-b{self.batch}-e{self.epochs}"
        if self.schedule != "curriculum":
            name += f"-{self.schedule}"
        if study == "losses":  # the first slice's folders, named before batch size became a study
            name = f"{study}-{self.loss}-n{self.n}-m{self.m}-u{self.warmup:g}-e{self.epochs}"
        if self.val_classes not in (VAL_CLASSES, 0):
            name += f"-v{self.val_classes}"
        if self.reduction != "official":
            name += f"-{self.reduction}"
        if self.loss_scale != 1.0:
            name += f"-scale{self.loss_scale:g}"
        if self.adam_eps is not None:
            name += f"-eps{self.adam_eps:g}"
        if not self.augment:
            name += "-noaug"
        return RUNS / f"{name}-s{seed}"


def memvir_label(n: int, m: int, extra: str = "") -> str:
    return f"MemVir({n}, {m}{extra})"


# The two losses of the reference code first (the first slice), then the five the paper adds, in Table 4's order.
LOSS_NAMES = (("Norm-softmax", "norm-softmax"), ("Proxy-NCA", "proxy-nca"), ("Softmax", "softmax"),
              ("CosFace", "cosface"), ("ArcFace", "arcface"), ("CurricularFace", "curricularface"),
              ("Proxy-Anchor", "proxy-anchor"))
GRID_N, GRID_M = (1, 2, 4), (10, 50)
BATCHES = (32, 128, 256)  # 128 is the grid's runs (SHARED), not trained again
# The batch study's reference: MemVir(2, 50) at batch 128 for 8 epochs with a 2-epoch warm-up (the grid's run)
REFERENCE_BATCH, REFERENCE_M, REFERENCE_EPOCHS, REFERENCE_WARMUP = 128, 50, 8, 2
# The dilution ablation's MemVir setting: the one the grid chose on validation for the 24-epoch budget.
DILUTION_N, DILUTION_M = 1, 50


def m_scaled(batch: int) -> int:
    """M that keeps the virtual sets as old in epochs as M=50 at batch 128: M counts steps, and a batch b takes
    128/b times as many steps an epoch."""
    return REFERENCE_M * REFERENCE_BATCH // batch


def equal_steps(batch: int) -> tuple[int, float]:
    """(epochs, warm-up epochs) that give batch b as many steps, and as long a warm-up in steps, as 8 epochs with a
    2-epoch warm-up at batch 128: the batch's effect apart from the number of optimiser steps."""
    return REFERENCE_EPOCHS * batch // REFERENCE_BATCH, REFERENCE_WARMUP * batch / REFERENCE_BATCH


def grid_rows() -> list[Row]:
    return [Row("baseline")] + [Row(memvir_label(n, m), n=n, m=m, warmup=2) for n in GRID_N for m in GRID_M]


def chosen_on_validation(results: list[dict]) -> tuple[int, int] | None:
    """The grid's (N, M) with the best mean CHOICE_METRIC, once all its seeds are in."""
    best = None
    for row in grid_rows()[1:]:
        group = [r for r in results if r["study"] == "grid" and r["label"] == row.label]
        if len(group) < len(SEEDS):
            return None
        score = statistics.mean(r[CHOICE_METRIC] for r in group)
        if best is None or score > best[0]:
            best = (score, row.n, row.m)
    return best[1], best[2]


def study_rows(study: str, results: list[dict]) -> list[Row]:
    if study == "losses":
        rows = []
        for name, loss in LOSS_NAMES:
            rows += [Row(name, loss=loss, val_classes=0),
                     Row(f"{name} + MemVir(2, 50)", loss=loss, n=2, m=50, warmup=2, val_classes=0)]
        return rows
    if study == "grid":
        return grid_rows()
    if study == "schedule":
        return [Row("step pacing (the paper's)", n=2, m=50, warmup=2),
                Row("no warm-up", n=2, m=50, warmup=0),
                Row("all N at once", n=2, m=50, warmup=2, schedule="all-at-once")]
    if study == "batch":
        rows = []
        for batch in BATCHES:
            rows += [Row(f"baseline, batch {batch}", batch=batch),
                     Row(f"MemVir(2, 50), batch {batch}", n=2, m=50, warmup=2, batch=batch)]
            if (m := m_scaled(batch)) != REFERENCE_M:  # as old in epochs: M counts steps
                rows.append(Row(f"MemVir(2, {m}), batch {batch}", n=2, m=m, warmup=2, batch=batch))
        for batch in BATCHES:
            epochs, warmup = equal_steps(batch)
            if epochs != REFERENCE_EPOCHS:  # batch 128's are the rows above
                rows += [Row(f"baseline, batch {batch}, {epochs} epochs", batch=batch, epochs=epochs),
                         Row(f"MemVir(2, 50), batch {batch}, {epochs} epochs", n=2, m=50, warmup=warmup, batch=batch,
                             epochs=epochs)]
        return rows
    if study == "budget":
        chosen = chosen_on_validation(results)
        if chosen is None:
            raise SystemExit("the budget study takes its MemVir setting from the grid: run the grid study first")
        n, m = chosen
        return [Row("baseline", epochs=24), Row(memvir_label(n, m), n=n, m=m, warmup=8, epochs=24)]
    if study == "long":
        # The budget study's runs carried on to 48 epochs (same warm-up): does the Recall@1 gap close, and does the
        # MAP@R lead hold? `continue_from` starts each from its 24-epoch checkpoint.
        return [replace(row, epochs=48) for row in study_rows("budget", results)]
    if study == "few-classes":
        # Train on 100 classes only (the other 921 training classes become validation), about CUB200's count, for
        # 100 epochs with the paper's 40-epoch warm-up: a regime where the baseline can over-fit its seen classes.
        few = dict(epochs=100, val_classes=921, eval_every=10)
        return [Row("baseline, 100 classes", **few),
                Row("MemVir(1, 50), 100 classes", n=1, m=50, warmup=40, **few),
                Row("MemVir(2, 50), 100 classes", n=2, m=50, warmup=40, **few)]
    if study == "dilution":
        # The official loss is the mean over all (k+1)B rows, so with one virtual set the live batch's gradient is
        # halved; under Adam with eps 0.01 that is close to halving the learning rate. These rows take the two
        # apart: the same halving without virtual classes, MemVir without the halving, and an Adam whose step no
        # longer scales with the gradient.
        n, m, long = DILUTION_N, DILUTION_M, dict(epochs=24)
        memvir = dict(n=n, m=m, warmup=8, **long)
        return [Row("baseline", **long),
                Row("baseline, loss x0.5 after warm-up", warmup=8, loss_scale=0.5, **long),
                Row(memvir_label(n, m, ", official"), **memvir),
                Row(memvir_label(n, m, ", balanced"), reduction="balanced", **memvir),
                Row("baseline, Adam eps 1e-8", adam_eps=1e-8, **long),
                Row(memvir_label(n, m, ", official, Adam eps 1e-8"), adam_eps=1e-8, **memvir)]
    if study == "overfit-probe":
        # Looking for a glyph setting in which the baseline over-fits, from the baseline alone (one seed each):
        # no augmentation and few training classes, the rest of the training classes as validation.
        probe = dict(epochs=100, eval_every=5, augment=False, seeds=(0,))
        return [Row("baseline, 100 classes, no augmentation", val_classes=921, **probe),
                Row("baseline, 50 classes, no augmentation", val_classes=971, **probe)]
    if study == "overfit":
        # The regime the probe found, fixed from the baseline alone: 100 training classes without augmentation. The
        # baseline's training loss falls below 0.01 within 10 epochs while its validation metrics flatten from
        # about epoch 20 (validation Recall@1 76.9 % from epoch 15 to 70). MemVir's warm-up ends there, at 20 of
        # 60 epochs, with the grid's setting under both reductions.
        over = dict(epochs=60, val_classes=921, eval_every=5, augment=False)
        return [Row("baseline, 100 classes, no augmentation", **over),
                Row(memvir_label(1, 50, ", official"), n=1, m=50, warmup=20, **over),
                Row(memvir_label(1, 50, ", balanced"), n=1, m=50, warmup=20, reduction="balanced", **over)]
    if study == "preset":
        # The app's default run: about 5 minutes on 2 CPU cores (12 epochs of glyphs at batch 128, about 1,000
        # steps) with the first virtual set arriving within a minute (a 2-epoch warm-up is 172 steps, M+1 more to
        # the first set). The candidates: the reference's official reduction and the balanced one, which the
        # dilution study singles out, at N = 1 and 2. The choice is made on validation MAP@R.
        preset = dict(epochs=12)
        return [Row("baseline, 12 epochs", **preset),
                Row(memvir_label(1, 50, ", official"), n=1, m=50, warmup=2, **preset),
                Row(memvir_label(1, 50, ", balanced"), n=1, m=50, warmup=2, reduction="balanced", **preset),
                Row(memvir_label(2, 50, ", balanced"), n=2, m=50, warmup=2, reduction="balanced", **preset),
                Row(memvir_label(1, 25, ", balanced"), n=1, m=25, warmup=2, reduction="balanced", **preset)]
    raise ValueError(study)


STUDIES = ("losses", "grid", "schedule", "batch", "budget", "long", "few-classes", "dilution", "overfit-probe",
           "overfit", "preset")
# A study whose runs extend another's: each starts from the other's checkpoint with --resume, which continues a run
# exactly as if it had never stopped (tests/train/test_trainer.py), so the result is that of the stored plain command.
CONTINUES = {"long": "budget"}
# Rows another study already ran with the same command: the grid's baseline and MemVir(2, 50) at batch 128 are the
# schedule study's step pacing and the batch study's batch 128. (The dilution study trains its own baseline and
# official MemVir again, rather than sharing the budget study's: the budget runs were made on another machine, whose
# floating-point arithmetic takes the same command down a different path, as far apart as another seed.)
SHARED = {("schedule", "step pacing (the paper's)"): ("grid", memvir_label(2, 50)),
          ("batch", "baseline, batch 128"): ("grid", "baseline"),
          ("batch", "MemVir(2, 50), batch 128"): ("grid", memvir_label(2, 50))}


# Differences the report tests, paired over seeds with Holm's correction: (reference row, compared row) per study.
_ML = memvir_label(DILUTION_N, DILUTION_M)
_OFFICIAL, _BALANCED = memvir_label(DILUTION_N, DILUTION_M, ", official"), memvir_label(DILUTION_N, DILUTION_M,
                                                                                        ", balanced")
COMPARISONS = {
    "budget": [("baseline", _ML)],
    "long": [("baseline", _ML)],
    "few-classes": [("baseline, 100 classes", "MemVir(1, 50), 100 classes"),
                    ("baseline, 100 classes", "MemVir(2, 50), 100 classes")],
    "dilution": [("baseline", "baseline, loss x0.5 after warm-up"),
                 ("baseline", _OFFICIAL),
                 ("baseline", _BALANCED),
                 (_OFFICIAL, _BALANCED),
                 ("baseline, loss x0.5 after warm-up", _OFFICIAL),
                 ("baseline, Adam eps 1e-8", memvir_label(DILUTION_N, DILUTION_M, ", official, Adam eps 1e-8"))],
    "overfit": [("baseline, 100 classes, no augmentation", memvir_label(1, 50, ", official")),
                ("baseline, 100 classes, no augmentation", memvir_label(1, 50, ", balanced")),
                (memvir_label(1, 50, ", official"), memvir_label(1, 50, ", balanced"))],
    "preset": [("baseline, 12 epochs", memvir_label(1, 50, ", official")),
               ("baseline, 12 epochs", memvir_label(1, 50, ", balanced")),
               ("baseline, 12 epochs", memvir_label(2, 50, ", balanced")),
               ("baseline, 12 epochs", memvir_label(1, 25, ", balanced"))],
}


def rows_of(results: list[dict], study: str, label: str) -> list[dict]:
    study, label = SHARED.get((study, label), (study, label))
    return [r for r in results if r["study"] == study and r["label"] == label]


def summary(group: list[dict], key: str) -> tuple[float, float]:
    """Mean and sample standard deviation of `key` over a group of runs, in percent."""
    values = [100 * r[key] for r in group]
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def paired(first: list[dict], second: list[dict], key: str):
    """The paired t-test of `second` minus `first` for `key`, in points, over the seeds both groups ran (seed s gives
    both the same initialisation and batches, so the design is paired); None when fewer than two seeds pair up."""
    import fair_stats  # scipy: only the report needs it

    by_seed = {r["seed"]: r for r in first if key in r}
    pairs = [(100 * by_seed[r["seed"]][key], 100 * r[key]) for r in second if key in r and r["seed"] in by_seed]
    if len(pairs) < 2:
        return None
    a, b = zip(*pairs, strict=True)
    return fair_stats.paired_t(b, a)
