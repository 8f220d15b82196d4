"""The fair comparison: MemVir against a baseline tuned with the same search budget, chosen on validation folds.

    .venv/bin/python bench/fair_study.py plan                 # the protocol and every trial's settings, runs nothing
    .venv/bin/python bench/fair_study.py run --jobs 2         # search, then the chosen settings at every seed, controls
    .venv/bin/python bench/fair_study.py run --profile gpu --device cuda
    .venv/bin/python bench/fair_study.py report               # the tables of docs/reproduction.md, from results.json
    .venv/bin/python bench/fair_study.py run --profile regime # the paper's regime: fine-tuning a pretrained backbone
    .venv/bin/python bench/fair_study.py run --profile regime-30   # ... on 30 % of its classes, at the regime's choice

The protocol (docs/reproduction.md, "A fair comparison", states it before any result) follows "A Metric Learning
Reality Check" (Musgrave, Belongie, Lim, ECCV 2020), whose protocol the paper reports in its Table 2:
- Every arm (the baseline, MemVir with the paper's reduction, MemVir balanced) gets the same number of trials. Trial
  0 is the page's current setting; trials 1.. are the points of a seeded Latin hypercube over the optimiser settings
  (learning rate, class-weight learning rate, Adam eps, the loss's scale), the same points for every arm, and of a
  second one over MemVir's N and M shared by the two MemVir arms: N and M are searched within the same trials.
- A trial trains at seed 0 on each of the profile's class-disjoint validation folds of the training classes
  (`--val-classes 255 --val-fold f`); its record keeps validation metrics only (the run's own metrics.jsonl also
  holds test metrics, which nothing here reads).
- The choice: the trial with the highest validation MAP@R averaged over the folds (ties: the lower trial).
  In the widened search, a choice on its box's edge grows that arm's box and the search goes on (arm_search).
- Each arm's choice is then trained on all training classes at the profile's seeds (5; the widened search's 10),
  and scored on the test classes. Seed s gives every arm the same initialisation and batches, so arms are compared
  with paired tests (memvir's bench/fair_stats).
- Controls, at the chosen settings, separate the step size from the virtual classes (CONTROLS).

Every run is `python -m memvir train ...`, recorded with its command; finished runs are skipped when the study is run
again and a run stopped half-way resumes from its checkpoint, so the study can be stopped and restarted at any time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ siblings, run from a checkout
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
REPRODUCTION = ROOT / "docs" / "reproduction"
METRICS = ("recall@1", "r_precision", "map@r")
CHOICE_METRIC = "val_map@r"
SEARCH_SEED = 2025  # a project constant: the trials' settings are fixed before any run
SEARCH_SEED_APART = 10  # comparisons over this many seeds also give their difference without seed 0


@dataclass(frozen=True)
class Profile:
    """How large the study is: the CPU profile fits a 2-core machine, the GPU one is MLRC's four folds."""

    name: str
    folds: int
    fold_size: int
    trials: int
    seeds: tuple[int, ...]
    epochs: int = 12
    warmup: float = 2.0
    dataset: str = "glyphs"
    init: str | None = None  # a checkpoint folder the backbone is fine-tuned from (`train --init`)
    search_eval_every: int = 0  # epochs between a search run's validation evaluations (0: at its end only)
    final_eval_every: int = 3
    held_out: int = 0  # training classes the finals hold out as validation (a share of the classes; 0: none)
    choose_from: str | None = None  # a profile whose search chose the settings (this one runs no search)
    # the CONTROLS it runs: the fair comparison's four by default
    controls: tuple[str, ...] = ("baseline-loss-x2", "baseline-class-lr-x2", "balanced-eps-1e-8", "seen-labels")
    study: str = "fair"  # its folder under docs/reproduction/ (results.json, per_query/), shared by related profiles
    box: str = "first"  # the search box (BOXES) its trials are drawn from
    arms: tuple[str, ...] = ("baseline", "memvir-official", "memvir-balanced")  # the arms it searches (ARMS)
    # Post-warm-up loss multipliers the baseline searches besides x1: its trials are then the shared points at x1 and
    # again at one of these, as many as the two MemVir reductions' trials together (baseline_trials)
    baseline_multipliers: tuple[float, ...] = ()
    finals: tuple[str, ...] | None = None  # the chosen arms trained at every seed (None: every chosen arm)
    # An arm whose choice lies on its box's edge grows its box past that end and searches on (arm_search); the first
    # study's profiles only report such a choice
    grows: bool = False

    def arm_trials(self, arm: str) -> int:
        """How many trials `arm` gets: the profile's count, twice that for a baseline that searches its multiplier."""
        return 2 * self.trials if arm == "baseline" and self.baseline_multipliers else self.trials

    def trial(self, arm: str, trial: int) -> Setting:
        return trial_setting(arm, trial, self.trials, BOXES[self.box], self.baseline_multipliers)


SEEDS = (0, 1, 2, 3, 4)
TEN_SEEDS = tuple(range(10))
DILUTION_CONTROLS = ("baseline-memvir-optimiser", "baseline-memvir-optimiser-half")
PRETRAINED = "checkpoints/glyphs-pretrain-convnet"
FEW_CLASSES = 116  # glyphs-few's training classes
# The paper's regime (docs/reproduction.md, "The paper's regime"): the pretrained backbone fine-tuned on glyphs-few's
# 116 classes, long enough for the baseline to fit them; its length was fixed from the baseline's validation curve
# alone (the probe there) before any MemVir run. The class shares of the paper's Table 1b reuse its choices.
REGIME = dict(dataset="glyphs-few", init=PRETRAINED, epochs=100, warmup=20.0, search_eval_every=10,
              final_eval_every=10, controls=(), study="regime")
PROFILES = {
    "cpu": Profile("cpu", folds=2, fold_size=255, trials=6, seeds=SEEDS),
    # The step-schedule study (docs/reproduction.md): the CPU study's choices trained again on one commit, with
    # balanced MemVir's step schedule as a control of its own and each MemVir arm's optimiser without a virtual class.
    # The first study's finals came from older code, which the schedule's runs must not be paired with.
    "schedule": Profile("schedule", folds=2, fold_size=255, trials=6, seeds=SEEDS, choose_from="cpu",
                        controls=("schedule-balanced-optimiser", "baseline-balanced-optimiser",
                                  "schedule-baseline-optimiser", "baseline-official-optimiser")),
    # The widened search (docs/reproduction.md, "A converged search"): every arm in a box that reaches past the first
    # study's choices, the baseline with its post-warm-up loss multiplier searched in as many trials as the two MemVir
    # reductions together, and the seen-labels memory searched as an arm of its own (N and M included); its finals and
    # controls at ten seeds, so that no verdict rests on the search's seed alone.
    "wide": Profile("wide", folds=2, fold_size=255, trials=6, seeds=TEN_SEEDS, box="wide", study="wide",
                    arms=("baseline", "memvir-official", "memvir-balanced", "memvir-seen"),
                    baseline_multipliers=(2.0, 5.0), grows=True,
                    controls=("schedule-balanced-optimiser", "schedule-baseline-optimiser")),
    "gpu": Profile("gpu", folds=4, fold_size=255, trials=16, seeds=SEEDS),
    # the whole pipeline in a couple of minutes, to try the runner (write it elsewhere: --output)
    "smoke": Profile("smoke", folds=2, fold_size=6, trials=2, seeds=(0, 1), epochs=2, warmup=1, dataset="glyphs-mini"),
    "regime": Profile("regime", folds=2, fold_size=38, trials=5, seeds=SEEDS, **REGIME),
    **{f"regime-{share}": Profile(f"regime-{share}", folds=2, fold_size=38, trials=5, seeds=SEEDS, **REGIME,
                                  held_out=FEW_CLASSES - round(FEW_CLASSES * share / 100), choose_from="regime")
       for share in (70,)},
    # where MemVir led most: also the baseline with MemVir's chosen optimiser (the arms' choices differ in it)
    **{f"regime-{share}": Profile(f"regime-{share}", folds=2, fold_size=38, trials=5, seeds=SEEDS,
                                  **{**REGIME, "controls": ("baseline-memvir-optimiser",)},
                                  held_out=FEW_CLASSES - round(FEW_CLASSES * share / 100), choose_from="regime")
       for share in (10, 30)},
    # The regime's dilution control (docs/reproduction.md, "The regime's dilution control"): where MemVir's paper
    # reduction led, the baseline at its optimiser with its loss halved after the warm-up (official's cut of the live
    # batch at N = 1, without a virtual class), beside the runs it is paired with, all again on one commit, 10 seeds.
    **{f"dilution-{share}": Profile(f"dilution-{share}", folds=2, fold_size=38, trials=5, seeds=TEN_SEEDS,
                                    **{**REGIME, "controls": DILUTION_CONTROLS},
                                    held_out=FEW_CLASSES - round(FEW_CLASSES * share / 100), choose_from="regime",
                                    finals=("memvir-official",))
       for share in (10, 30)},
    # the regime's pipeline on the bundled backbone in a few minutes, to try it
    "regime-smoke": Profile("regime-smoke", folds=2, fold_size=38, trials=2, seeds=(0, 1), dataset="glyphs-few",
                            init=PRETRAINED, epochs=2, warmup=1, search_eval_every=1, final_eval_every=1,
                            controls=(), study="regime-smoke"),
}


@dataclass(frozen=True)
class Setting:
    """One training configuration with Norm-softmax; n = 0 is the baseline."""

    lr: float = 1e-3
    class_lr: float = 1e-2
    adam_eps: float = 1e-2
    scale: float = 23.0
    n: int = 0
    m: int = 50
    reduction: str = "official"
    labels: str = "virtual"
    loss_scale_after_warmup: float = 1.0
    loss_scale_schedule: int = 0  # the step-schedule control: loss x (k+1) of MemVir(this, m), no virtual row

    def args(self, profile: Profile) -> list[str]:
        args = ["-m", "memvir", "train", "--dataset", profile.dataset, "--loss", "norm-softmax",
                "--scale", f"{self.scale:g}", "--memvir-n", str(self.n), "--memvir-m", str(self.m),
                "--warmup-epochs", f"{profile.warmup:g}", "--epochs", str(profile.epochs), "--batch-size", "128",
                "--lr", f"{self.lr:.3g}", "--class-lr", f"{self.class_lr:.3g}", "--adam-eps", f"{self.adam_eps:g}"]
        if profile.init:
            args += ["--init", profile.init]
        if self.reduction != "official":
            args += ["--memvir-reduction", self.reduction]
        if self.labels != "virtual":
            args += ["--memvir-labels", self.labels]
        if self.loss_scale_after_warmup != 1.0:
            args += ["--loss-scale-after-warmup", f"{self.loss_scale_after_warmup:g}"]
        if self.loss_scale_schedule:
            args += ["--loss-scale-schedule", str(self.loss_scale_schedule)]
        return args

    def describe(self) -> str:
        optimiser = f"lr {self.lr:.2g}, class lr {self.class_lr:.2g}, eps {self.adam_eps:g}, scale {self.scale:g}"
        if self.n == 0:
            memvir = "baseline"
        else:
            memvir = f"MemVir({self.n}, {self.m}), {self.reduction}"
            if self.labels != "virtual":
                memvir += f", {self.labels} labels"
        scaled = f", loss x{self.loss_scale_after_warmup:g} after warm-up" if self.loss_scale_after_warmup != 1 else ""
        if self.loss_scale_schedule:
            scaled += f", loss x(k+1) of MemVir({self.loss_scale_schedule}, {self.m})"
        return f"{memvir}; {optimiser}{scaled}"


@dataclass(frozen=True)
class SearchBox:
    """The ranges the trials' learning rates (log scale) and the loss's scale (linear) are drawn from."""

    lr: tuple[float, float]
    class_lr: tuple[float, float]
    scale: tuple[float, float]


# The search space. Adam eps is searched over four decades because it decides whether a scaled loss acts as a
# learning-rate change (memvir.train.adam_regime); 1e-2 is the reference code's. The first study's box; the widened
# one reaches 6x lower learning rates and half the lowest scale, where the first study's baseline chose its corner.
BOXES = {"first": SearchBox(lr=(3e-4, 3e-3), class_lr=(3e-3, 3e-2), scale=(12.0, 40.0)),
         "wide": SearchBox(lr=(5e-5, 3e-3), class_lr=(5e-4, 3e-2), scale=(6.0, 40.0))}
EDGE = 0.1  # a chosen value within this share of its range's end lies on the box's edge: the box grows
GROWTH = 1 / 3  # a growth moves the edge's end past it by this share of the range's current width, on a log scale
GROWTHS = 3  # the most times one arm's box grows; a choice still on the edge after them is taken as it is
ADAM_EPS = (1e-8, 1e-6, 1e-4, 1e-2)
MEMVIR_N, MEMVIR_M = (1, 2, 4), (10, 25, 50, 100)
ARMS = {"baseline": Setting(), "memvir-official": Setting(n=2, m=50),
        "memvir-balanced": Setting(n=2, m=50, reduction="balanced"),
        "memvir-seen": Setting(n=2, m=50, labels="seen")}  # trial 0 of each: the page's current settings
ARM_NAMES = {"baseline": "baseline", "memvir-official": "MemVir, paper's reduction",
             "memvir-balanced": "MemVir, balanced reduction",
             "memvir-seen": "the memory with seen labels (searched)"}


def _strata(rng: np.random.Generator, count: int) -> np.ndarray:
    """A Latin-hypercube column: `count` points in [0, 1), one in each of `count` equal strata, in random order."""
    return (rng.permutation(count) + rng.uniform(size=count)) / count


def _spread_choice(rng: np.random.Generator, values: tuple, count: int) -> list:
    """`count` picks that use every value about equally often, in random order: with a handful of trials a plain
    random draw may leave out a value (in one draw of five, four of the five Adam eps were 1e-2)."""
    repeated = [values[i % len(values)] for i in range(count)]
    return [repeated[i] for i in rng.permutation(count)]


def _log_scale(unit: float, low: float, high: float) -> float:
    return float(np.exp(np.log(low) + unit * (np.log(high) - np.log(low))))


def trial_setting(arm: str, trial: int, trials: int, box: SearchBox = BOXES["first"],
                  multipliers: tuple[float, ...] = ()) -> Setting:
    """Trial `trial` of `arm` in a search of `trials`: the arm's start for trial 0, else point `trial` of a Latin
    hypercube over the optimiser settings shared by all arms, and of one over N and M shared by the MemVir arms.
    With `multipliers`, the baseline's trials `trials`.. are its first `trials` again, each with one of them as its
    post-warm-up loss multiplier (every multiplier about equally often)."""
    if trial >= trials:
        if arm != "baseline" or not multipliers or trial >= 2 * trials:
            raise ValueError(f"{arm} has no trial {trial} in a search of {trials}")
        multiplier = _spread_choice(np.random.default_rng([SEARCH_SEED, trials, 2]), multipliers, trials)
        return replace(trial_setting(arm, trial - trials, trials, box),
                       loss_scale_after_warmup=float(multiplier[trial - trials]))
    if trial == 0:
        return ARMS[arm]
    count, row = trials - 1, trial - 1
    optimiser = np.random.default_rng([SEARCH_SEED, trials])
    lr, class_lr, scale = (_strata(optimiser, count) for _ in range(3))
    eps = _spread_choice(optimiser, ADAM_EPS, count)
    drawn = replace(ARMS[arm], lr=_log_scale(lr[row], *box.lr), class_lr=_log_scale(class_lr[row], *box.class_lr),
                    adam_eps=float(eps[row]), scale=round(box.scale[0] + scale[row] * np.ptp(box.scale), 1))
    if drawn.n == 0:
        return drawn
    memvir = np.random.default_rng([SEARCH_SEED, trials, 1])
    n, m = _spread_choice(memvir, MEMVIR_N, count), _spread_choice(memvir, MEMVIR_M, count)
    return replace(drawn, n=int(n[row]), m=int(m[row]))


def _balanced_schedule(chosen: dict[str, Setting]) -> dict:
    """The step-schedule control's change: no virtual row, the loss x (k+1) of balanced's chosen MemVir(N, M)."""
    balanced = chosen["memvir-balanced"]
    # in place of any post-warm-up multiplier the arm chose (the widened search's baseline may choose x2 or x5)
    return {"n": 0, "reduction": "official", "loss_scale_schedule": balanced.n, "m": balanced.m,
            "loss_scale_after_warmup": 1.0}


_balanced_schedule.reads = ("memvir-balanced",)


def _optimiser_of(arm: str):
    """A control's change: `arm`'s chosen optimiser (learning rates, Adam eps, the loss's scale)."""
    def change(chosen: dict[str, Setting]) -> dict:
        return {k: getattr(chosen[arm], k) for k in ("lr", "class_lr", "adam_eps", "scale")}
    change.reads = (arm,)
    return change


# Controls at the chosen settings: (name, label, the arm they start from, the change, what they isolate). A change
# maps settings to values, to "x2" (twice the arm's), or is a function of the chosen settings (it needs another arm's)
# that returns such a map; a control runs once every arm its change reads is chosen (`needs`).
CONTROLS = (
    ("baseline-loss-x2", "baseline, loss x2 after warm-up", "baseline", {"loss_scale_after_warmup": 2.0},
     "balanced MemVir(1, M)'s step size without a virtual class"),
    ("baseline-class-lr-x2", "baseline, class-weight lr x2", "baseline", {"class_lr": "x2"},
     "a larger step for the class weights alone"),
    ("balanced-eps-1e-8", "MemVir balanced, Adam eps 1e-8", "memvir-balanced", {"adam_eps": 1e-8},
     "balanced MemVir where Adam's step hardly depends on the loss's scale"),
    ("seen-labels", "the same memory with seen labels", "memvir-official", {"labels": "seen"},
     "the memory's embeddings as more instances of the seen classes, no stored weight (as XBM, BroadFace)"),
    ("baseline-memvir-optimiser", "baseline with MemVir's optimiser", "memvir-official", {"n": 0},
     "the MemVir arm's chosen optimiser without a virtual class (the regime's shares, where the arms' choices differ)"),
    ("baseline-memvir-optimiser-half", "baseline with MemVir's optimiser, loss x1/2 after warm-up", "memvir-official",
     {"n": 0, "loss_scale_after_warmup": 0.5},
     "the official reduction's cut of the live batch at N = 1 (its gradient / 2) without a virtual class"),
    ("schedule-balanced-optimiser", "baseline, balanced's step schedule and optimiser", "memvir-balanced",
     _balanced_schedule, "balanced MemVir's exact step schedule and optimiser without a virtual row"),
    ("baseline-balanced-optimiser", "baseline with balanced's optimiser", "memvir-balanced",
     {"n": 0, "reduction": "official"},
     "balanced MemVir's chosen optimiser without a virtual row and without its step schedule"),
    ("schedule-baseline-optimiser", "baseline, balanced's step schedule", "baseline",
     _balanced_schedule, "the tuned baseline given balanced MemVir's exact step schedule"),
    ("baseline-official-optimiser", "baseline with official's optimiser", "baseline",
     _optimiser_of("memvir-official"), "the official MemVir arm's chosen optimiser without a virtual class"),
)
# The order in which the runs of a study without a search go: the groups in turn, each seed by seed, so that the
# pairs that decide the headline reach every seed first.
RUN_ORDER = (("baseline", "memvir-balanced", "schedule-balanced-optimiser"),
             ("baseline-balanced-optimiser", "schedule-baseline-optimiser"),
             ("memvir-official", "baseline-official-optimiser"))


def _run_order(job: Job) -> tuple:
    group = next((g for g, arms in enumerate(RUN_ORDER) if job.arm in arms), len(RUN_ORDER))
    position = RUN_ORDER[group].index(job.arm) if group < len(RUN_ORDER) else 0
    return group, job.seed, position
# (reference, other): each row of the comparisons table is other - reference, paired over seeds.
COMPARISONS = (
    ("baseline", "memvir-official"), ("baseline", "memvir-balanced"), ("memvir-official", "memvir-balanced"),
    ("baseline", "baseline-loss-x2"), ("baseline", "baseline-class-lr-x2"), ("baseline-loss-x2", "memvir-balanced"),
    ("memvir-balanced", "balanced-eps-1e-8"), ("seen-labels", "memvir-official"),
    ("baseline", "baseline-memvir-optimiser"), ("baseline-memvir-optimiser", "memvir-official"),
    ("baseline-memvir-optimiser-half", "memvir-official"),
    ("schedule-balanced-optimiser", "memvir-balanced"), ("baseline-balanced-optimiser", "schedule-balanced-optimiser"),
    ("baseline-balanced-optimiser", "memvir-balanced"), ("baseline", "schedule-baseline-optimiser"),
    ("schedule-baseline-optimiser", "memvir-balanced"), ("baseline-official-optimiser", "memvir-official"),
    ("memvir-seen", "memvir-official"),  # virtual against seen labels, each searched alike (the widened search)
)


def control_needs(control: str) -> set[str]:
    """The arms whose choices a control's setting reads."""
    _, _, arm, change, _ = next(c for c in CONTROLS if c[0] == control)
    return {arm, *getattr(change, "reads", ())}


def control_setting(control: str, chosen: dict[str, Setting]) -> Setting:
    _, _, arm, change, _ = next(c for c in CONTROLS if c[0] == control)
    if callable(change):
        change = change(chosen)
    values = {k: getattr(chosen[arm], k) * 2 if v == "x2" else v for k, v in change.items()}
    return replace(chosen[arm], **values)


# ------------------------------------------------------------------------------------------------------- results
class Results:
    """STUDY/results.json: one record per finished run, written whole after each (a stop loses no finished run)."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = json.loads(path.read_text()) if path.is_file() else []
        self._lock = threading.Lock()

    def find(self, **keys) -> dict | None:
        return next((r for r in self.records if all(r.get(k) == v for k, v in keys.items())), None)

    def add(self, record: dict) -> None:
        with self._lock:
            self.records.append(record)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(json.dumps(self.records, indent=1))
            temporary.replace(self.path)


def search_score(results: Results, profile: Profile, arm: str, trial: int) -> float | None:
    """The trial's validation MAP@R averaged over the profile's folds, once all are in."""
    scores = [r["metrics"][CHOICE_METRIC] for fold in range(profile.folds)
              if (r := results.find(profile=profile.name, phase="search", arm=arm, trial=trial, fold=fold))]
    return statistics.mean(scores) if len(scores) == profile.folds else None


def chosen_settings(results: Results, profile: Profile) -> dict[str, Setting]:
    """Each arm whose search is done: its chosen setting (arm_search)."""
    return {arm: search.chosen for arm in profile.arms if (search := arm_search(results, profile, arm)).chosen}


BOX_RANGES = ("lr", "class_lr", "scale")


def _edge_ends(setting: Setting, box: SearchBox) -> list[tuple[str, int]]:
    """(range, -1 for its low end or +1 for its high end) for each of the setting's values that lies within EDGE of
    a range's end (learning rates on their log scale, the loss's scale on its linear one, as the trials are drawn)."""
    ends = []
    for name in BOX_RANGES:
        value, (low, high) = getattr(setting, name), getattr(box, name)
        unit = ((np.log(value) - np.log(low)) / (np.log(high) - np.log(low)) if name != "scale"
                else (value - low) / (high - low))
        if unit <= EDGE:
            ends.append((name, -1))
        elif unit >= 1 - EDGE:
            ends.append((name, 1))
    return ends


def _edge_words(setting: Setting, box: SearchBox, ends: list[tuple[str, int]]) -> list[str]:
    return [f"{name} {getattr(setting, name):.3g} at the {'low' if end < 0 else 'high'} edge "
            f"({getattr(box, name)[end > 0]:.3g})" for name, end in ends]


def box_edges(setting: Setting, box: SearchBox) -> list[str]:
    """The chosen setting's values that lie on the box's edge, in words: where the box must grow and the search go
    on, since the optimum may lie outside it."""
    return _edge_words(setting, box, _edge_ends(setting, box))


def grown_box(box: SearchBox, ends: list[tuple[str, int]]) -> SearchBox:
    """`box` with each of `ends` moved past its end by GROWTH of the range's current width on a log scale (the
    loss's scale too, so that its low end stays above 0): the wide box's lr 5e-5 to 3e-3 grows to 1.28e-5 at its low
    end, and a second growth there to 1.28e-5 / (3e-3 / 1.28e-5) ** (1/3)."""
    ranges = {name: getattr(box, name) for name in BOX_RANGES}
    for name, end in ends:
        low, high = ranges[name]
        step = (high / low) ** GROWTH
        ranges[name] = (low / step, high) if end < 0 else (low, high * step)
    return SearchBox(**ranges)


def growth_trials(choice: Setting, ends: list[tuple[str, int]], box: SearchBox,
                  grown: SearchBox) -> list[tuple[Setting, tuple[str, int] | None]]:
    """The trials a growth adds: for each value of `choice` on an edge, `choice` with that value halfway (on a log
    scale) between the old end and the grown one, then at the grown end; its other values as they are. Each with the
    (range, end) it reaches where it is the one at the grown end (None for the halfway one)."""
    trials = []
    for name, end in ends:
        old, new = getattr(box, name)[end > 0], getattr(grown, name)[end > 0]
        for value, reaches in ((float(np.sqrt(old * new)), None), (new, (name, end))):
            rounded = round(value, 1) if name == "scale" else float(f"{value:.3g}")
            trials.append((replace(choice, **{name: rounded}), reaches))
    return trials


@dataclass(frozen=True)
class ArmSearch:
    """One arm's search as far as its results go: its trials in order (the profile's, then each growth's), the box
    its choice is judged in, its choice (None until every trial is in and the choice lies inside the box, or the
    box has grown GROWTHS times) and the ranges whose edge that choice lies on (empty for a choice inside)."""

    trials: list[Setting]
    box: SearchBox
    chosen: Setting | None
    growths: int
    edges: list[tuple[str, int]]


def arm_search(results: Results, profile: Profile, arm: str) -> ArmSearch:
    """The choice rule with the box's growth: the trial with the best mean validation MAP@R over the folds (ties: the
    earlier trial). In a profile that grows, a choice within EDGE of its box's end grows the box there (grown_box)
    and adds the trials beyond it (growth_trials); once they are in, the box grows again only past a range whose
    trial at the grown end is the best: a best trial halfway, or the old choice, lies inside what was searched. (The
    first rule would not do there: a grown range's end part is less than EDGE of its new width, so the halfway trial
    of a scale grown from 6 to 3.19 would count as on the edge.)"""
    trials = [profile.trial(arm, t) for t in range(profile.arm_trials(arm))]
    box = BOXES[profile.box]
    at_grown_end: dict[int, tuple[str, int]] = {}  # the last growth's trials at a grown end: index -> (range, end)
    for growths in range(GROWTHS + 1):
        scores = [search_score(results, profile, arm, t) for t in range(len(trials))]
        if None in scores:
            return ArmSearch(trials, box, None, growths, [])
        index = int(np.argmax(scores))  # argmax: the first of equal scores
        best = trials[index]
        ends = _edge_ends(best, box) if growths == 0 else [at_grown_end[index]] if index in at_grown_end else []
        if not profile.grows or not ends or growths == GROWTHS:
            return ArmSearch(trials, box, best, growths, ends)
        grown = grown_box(box, ends)
        added = growth_trials(best, ends, box, grown)
        at_grown_end = {len(trials) + i: reaches for i, (_, reaches) in enumerate(added) if reaches}
        trials = trials + [setting for setting, _ in added]
        box = grown
    raise AssertionError("unreachable: the loop returns at its last growth")


# ------------------------------------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Job:
    phase: str  # "search", "final" or "control"
    arm: str  # an arm of ARMS or a control of CONTROLS
    setting: Setting
    seed: int = 0
    trial: int | None = None
    fold: int | None = None

    @property
    def name(self) -> str:
        if self.phase == "search":
            return f"search-{self.arm}-t{self.trial}-f{self.fold}"
        return f"{self.phase}-{self.arm}-s{self.seed}"

    def args(self, profile: Profile) -> list[str]:
        args = self.setting.args(profile) + ["--seed", str(self.seed)]
        if self.phase == "search":
            return args + ["--val-classes", str(profile.fold_size), "--val-fold", str(self.fold), "--eval-every",
                           str(profile.search_eval_every)]
        if profile.held_out:
            args += ["--val-classes", str(profile.held_out), "--val-fold", "0"]
        return args + ["--eval-every", str(profile.final_eval_every)]

    def keys(self, profile: Profile) -> dict:
        return {"profile": profile.name, "phase": self.phase, "arm": self.arm, "seed": self.seed,
                "trial": self.trial, "fold": self.fold}


def pending_jobs(results: Results, profile: Profile) -> list[Job]:
    """What can run now and has no result: the search (with its grown boxes' trials); the finals once every arm's
    search is done; the controls once the arms they start from are chosen."""
    if profile.choose_from:
        jobs, chosen = [], chosen_settings(results, PROFILES[profile.choose_from])
    else:
        searches = {arm: arm_search(results, profile, arm) for arm in profile.arms}
        trials = {arm: search.trials for arm, search in searches.items()}
        jobs = [Job("search", arm, trials[arm][t], trial=t, fold=f)
                for t in range(max(map(len, trials.values()))) for arm in profile.arms
                for f in range(profile.folds) if t < len(trials[arm])]
        # no final before every arm's search is done, its box grown included
        done = all(search.chosen for search in searches.values())
        chosen = {arm: search.chosen for arm, search in searches.items()} if done else {}
    # Seed by seed, so that a study stopped part-way already has whole seeds to pair its arms over
    jobs += [Job("final", arm, setting, seed=s) for s in profile.seeds for arm, setting in chosen.items()
             if profile.finals is None or arm in profile.finals]
    jobs += [Job("control", name, control_setting(name, chosen), seed=s)
             for s in profile.seeds for name in profile.controls if control_needs(name) <= chosen.keys()]
    return [job for job in jobs if results.find(**job.keys(profile)) is None]


def read_run(run: Path, test: bool, curves: bool = True) -> dict:
    """The final evaluation's metrics (validation only where `test` is False), the evaluation curve (where `curves`),
    the training batches' mean cos(x, W_y) at each logged step (the paper's Fig. 5), and the mean share of Adam's
    parameters whose step grows with the gradient after the warm-up (memvir.train.adam_regime)."""
    from memvir.checkpoint import RunFolder

    records = RunFolder(run).records()
    evals = [r for r in records if r["type"] == "eval"]
    steps = [r for r in records if r["type"] == "step"]
    keep = [*METRICS, *(f"val_{m}" for m in METRICS)] if test else [f"val_{m}" for m in METRICS]
    keep = [k for k in keep if k in evals[-1]]
    metrics = {k: evals[-1][k] for k in keep}
    curve = [[r["step"]] + [r.get(k) for k in keep] for r in evals] if curves else []
    cosine = [[r["step"], round(r["mean_target_cosine"], 4)] for r in steps if "mean_target_cosine" in r]
    after = [r for r in steps if not r["warmup"] and "adam_eps_share" in r]
    shares = {name: statistics.mean(r[name] for r in after) if after else None
              for name in ("adam_eps_share", "adam_eps_share_class")}
    return {"metrics": metrics, "curve_columns": ["step", *keep] if curves else [], "curve": curve,
            "target_cosine": cosine if curves else [], **shares}


def per_query(run: Path, profile: Profile, job: Job, env: dict, output: Path) -> str:
    """Each test query's Recall@1 and AP@R, saved compactly beside results.json (for the class bootstrap)."""
    raw = run / "test_per_query.npz"
    subprocess.run([sys.executable, "-m", "memvir", "eval", str(run), "--per-query", str(raw)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    values = np.load(raw)
    target = output / "per_query" / f"{profile.name}-{job.name}.npz"
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(target, label=values["label"].astype(np.int16), recall_at_1=values["recall@1"],
                        map_at_r=values["map@r"].astype(np.float32))
    return str(target.relative_to(output))


def shown_command(args: list[str], job: Job, profile: Profile) -> str:
    """The command as a reader reruns it: its run folder where the default --runs puts it (where it was written
    changes nothing it computes, and a machine's own paths do not belong in the results)."""
    at = args.index("--out")
    return "python " + " ".join([*args[:at], "--out", f"runs/fair/{profile.name}/{job.name}", *args[at + 2:]])


def _commit() -> str | None:
    """The commit the runs train on (a comparison pairs runs of one commit: the float32 results move in their last
    digits when the loss's arithmetic is reordered); None outside a git checkout."""
    found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "memvir"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return None if found.returncode else found.stdout.strip() + ("+changes" if dirty else "")


def _twin_keys(job: Job) -> tuple | None:
    """What makes two finals or controls the same run: one seed of one setting (a search trial is its arm's own)."""
    return None if job.phase == "search" else (job.seed, job.setting)


def recorded_twin(job: Job, profile: Profile, results: Results, device: str) -> dict | None:
    """A recorded final or control of this profile that trained exactly this job's command on this commit and device:
    two arms whose choices coincide (the widened search's baseline and balanced MemVir chose one optimiser, so both
    step-schedule controls are one command). Training on a CPU is deterministic, so its rerun would only repeat the
    same bits (seeds 0 and 1 of the wide profile's two controls were trained twice and matched to every digit)."""
    if _twin_keys(job) is None:
        return None
    commit = _commit()
    return next((record for record in results.records
                 if record["profile"] == profile.name and record["phase"] != "search" and record["seed"] == job.seed
                 and record["setting"] == asdict(job.setting) and record["device"] == device
                 and record["commit"] == commit), None)


def run_job(job: Job, profile: Profile, results: Results, runs: Path, threads: int, device: str) -> None:
    output = results.path.parent
    from memvir.checkpoint import RunFolder

    twin = recorded_twin(job, profile, results, device)
    if twin is not None:
        print(f"[{job.phase}] {job.name}: the same run as {twin['phase']}-{twin['arm']}-s{twin['seed']}", flush=True)
        results.add({**twin, **job.keys(profile), "same_as": f"{twin['phase']}-{twin['arm']}-s{twin['seed']}"})
        return

    out = runs / profile.name / job.name
    args = job.args(profile) + ["--out", str(out)]
    if device != "cpu":
        args += ["--device", device, "--num-workers", str(max(1, threads - 1))]
    resume = ["--resume"] if RunFolder(out).state_file.exists() else []
    print(f"[{job.phase}] {job.name}: {job.setting.describe()}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TQDM_DISABLE": "1"}
    log = runs / profile.name / "logs" / f"{job.name}.log"  # beside the run: a new run's folder must be empty
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as stderr:
        finished = subprocess.run([sys.executable, *args, *resume], cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=stderr, env=env)
    if finished.returncode:
        raise RuntimeError(f"{job.name} failed (exit {finished.returncode}); its output is in {log}")
    record = {**job.keys(profile), "setting": asdict(job.setting), "device": device, "commit": _commit(),
              "command": shown_command(args, job, profile),
              **read_run(out, test=job.phase != "search",
                         curves=job.phase != "search" or profile.search_eval_every > 0)}
    if job.phase != "search":
        record["per_query"] = per_query(out, profile, job, env, output)
    results.add(record)


def next_batch(todo: list[Job], profile: Profile, runs: Path) -> list[Job]:
    """The runs to start now, in order: a profile's search first (its grown boxes' trials come in a later batch, once
    the choices they follow are in), then its finals and controls together, seed by seed, so that a study stopped
    part-way has whole seeds to pair its arms over; a profile without a search, the headline's pairs first. Stopped
    runs before all, so that a restarted study finishes what it had started."""
    if profile.choose_from:
        todo = sorted(todo, key=_run_order)
    else:
        todo = sorted(todo, key=lambda job: (job.phase != "search", job.seed))
    todo.sort(key=lambda job: not (runs / profile.name / job.name / "trainer_state.pt").exists())
    searching = any(job.phase == "search" for job in todo)
    batch, seen = [], set()
    for job in todo:
        if (job.phase == "search") == searching:
            # a job whose twin is in this batch waits for the next, where it is recorded from its twin's run
            twin = _twin_keys(job)
            if twin is None or twin not in seen:
                batch.append(job)
                seen.add(twin)
    return batch


def run_study(profile: Profile, jobs: int, device: str, runs: Path, output: Path, threads: int | None = None) -> None:
    results = Results(output / "results.json")
    threads = threads or max(1, (os.cpu_count() or 1) // jobs)
    while todo := pending_jobs(results, profile):
        with ThreadPoolExecutor(jobs) as pool:
            batch = next_batch(todo, profile, runs)
            for future in [pool.submit(run_job, job, profile, results, runs, threads, device) for job in batch]:
                future.result()


# ------------------------------------------------------------------------------------------------------- report
def plan(profile: Profile) -> str:
    box = BOXES[profile.box]
    trials = ", ".join(f"{ARM_NAMES[a]} {profile.arm_trials(a)}" for a in profile.arms)
    lines = [f"profile {profile.name}: trials ({trials}) x {profile.folds} folds of {profile.fold_size} validation "
             f"classes, then {len(profile.seeds)} seeds; {profile.epochs} epochs, warm-up {profile.warmup:g}; box: "
             f"lr {box.lr[0]:g} to {box.lr[1]:g}, class lr {box.class_lr[0]:g} to {box.class_lr[1]:g}, scale "
             f"{box.scale[0]:g} to {box.scale[1]:g}", "",
             *([f"A choice within {EDGE:g} of a range's end grows that arm's box past it by {GROWTH:.3g} of the "
                f"box's current width (log scale) with two trials per range, halfway and at the new end; again past a "
                f"new end whose trial is the best, up to {GROWTHS} times.", ""]
               if profile.grows else []),
             "| trial | " + " | ".join(ARM_NAMES[a] for a in profile.arms) + " |",
             "|---:|" + "---|" * len(profile.arms)]
    for t in range(max(map(profile.arm_trials, profile.arms))):
        lines.append(f"| {t} | " + " | ".join(profile.trial(a, t).describe() if t < profile.arm_trials(a) else ""
                                              for a in profile.arms) + " |")
    return "\n".join(lines)


def _box_words(box: SearchBox) -> str:
    return ", ".join(f"{name.replace('_', ' ')} {low:.3g} to {high:.3g}" for name in BOX_RANGES
                     for low, high in [getattr(box, name)])


def search_table(results: Results, profile: Profile) -> str:
    lines = ["| arm | trial | setting | " + " | ".join(f"fold {f}" for f in range(profile.folds))
             + " | mean validation MAP@R |", "|---|---:|---|" + "---:|" * (profile.folds + 1)]
    searches = {arm: arm_search(results, profile, arm) for arm in profile.arms}
    for arm, search in searches.items():
        for t, setting in enumerate(search.trials):
            folds = [results.find(profile=profile.name, phase="search", arm=arm, trial=t, fold=f)
                     for f in range(profile.folds)]
            cells = [f"{100 * r['metrics'][CHOICE_METRIC]:.2f}" if r else "" for r in folds]
            score = search_score(results, profile, arm, t)
            mark = " (chosen)" if search.chosen == setting and score is not None else ""
            mean = f"{100 * score:.2f}{mark}" if score is not None else ""
            grown = " (grown box)" if t >= profile.arm_trials(arm) else ""
            lines.append(f"| {ARM_NAMES[arm]} | {t}{grown} | {setting.describe()} | " + " | ".join(cells)
                         + f" | {mean} |")
    if profile.grows:
        grew = [f"- {ARM_NAMES[arm]}: {search.growths} time{'s' * (search.growths != 1)}, to {_box_words(search.box)}"
                + ("" if search.chosen else " (its trials there still to run)")
                for arm, search in searches.items() if search.growths]
        if grew:
            lines += ["", "Boxes grown past a chosen value on their edge (the search went on there):", *grew]
        edges = [f"- {ARM_NAMES[arm]}: " + "; ".join(_edge_words(search.chosen, search.box, search.edges))
                 for arm, search in searches.items() if search.chosen and search.edges]
        if edges:
            lines += ["", f"Still on the box's edge after {GROWTHS} growths (taken as it is):", *edges]
    else:
        edges = [f"- {ARM_NAMES[arm]}: " + "; ".join(_edge_words(search.chosen, search.box, search.edges))
                 for arm, search in searches.items() if search.chosen and search.edges]
        if edges:
            lines += ["", "Chosen on the box's edge (the box grows and the search goes on):", *edges]
    return "\n".join(lines)


def _group(results: Results, profile: Profile, name: str) -> list[dict]:
    phase = "final" if name in ARMS else "control"
    return sorted((r for r in results.records if (r["profile"], r["phase"], r["arm"]) == (profile.name, phase, name)),
                  key=lambda r: r["seed"])


def _label(name: str) -> str:
    return ARM_NAMES.get(name) or next(c[1] for c in CONTROLS if c[0] == name)


def _seed_mean_per_query(group: list[dict], output: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(query labels, {metric: per-query value averaged over the group's seeds}) from the saved per-query files."""
    files = [np.load(output / r["per_query"]) for r in group]
    labels = files[0]["label"]
    if any(not np.array_equal(f["label"], labels) for f in files):
        raise ValueError("the runs' per-query files do not list the same test queries")
    return labels, {"recall@1": np.mean([f["recall_at_1"] for f in files], axis=0),
                    "map@r": np.mean([f["map_at_r"].astype(np.float64) for f in files], axis=0)}


def final_table(results: Results, profile: Profile) -> str:
    import fair_stats  # scipy: only the report needs it (a GPU image may have none)

    names = [*ARMS, *(c[0] for c in CONTROLS)]
    lines = ["| run | setting | seeds | Recall@1 | R-Precision | MAP@R | MAP@R 95% CI over classes | Adam eps share "
             "(network / class weights) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        group = _group(results, profile, name)
        if not group:
            continue
        cells = []
        for metric in METRICS:
            values = [100 * r["metrics"][metric] for r in group]
            # one seed has no spread to give: its value alone, not a standard deviation of 0
            spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
            cells.append(f"{statistics.mean(values):.2f}{spread}")
        labels, per_query = _seed_mean_per_query(group, results.path.parent)
        low, high = fair_stats.class_bootstrap_ci(per_query["map@r"], labels)
        shares = [r["adam_eps_share"] for r in group if r["adam_eps_share"] is not None]
        shares_class = [r["adam_eps_share_class"] for r in group if r["adam_eps_share_class"] is not None]
        share = (f"{100 * statistics.mean(shares):.0f} % / {100 * statistics.mean(shares_class):.0f} %"
                 if shares else "")
        setting = Setting(**group[0]["setting"]).describe()
        # a group still training says how far it is: its mean moves as its seeds come in
        missing = set(profile.seeds) - {r["seed"] for r in group}
        seeds = f"{len(group)} of {len(profile.seeds)}, running" if missing else f"{len(group)}"
        lines.append(f"| {_label(name)} | {setting} | {seeds} | " + " | ".join(cells)
                     + f" | {100 * low:.2f} to {100 * high:.2f} | {share} |")
    return "\n".join(lines)


def comparisons(results: Results, profile: Profile) -> list[dict]:
    """Every comparison x metric whose two groups are in at every seed of the profile: the paired tests and
    intervals, and Holm's adjusted p over the whole table. A comparison enters the table (and Holm's family) once it
    is complete, so that the verdicts of a study still running do not move with half-finished pairs."""
    import fair_stats  # scipy: only the report needs it (a GPU image may have none)

    rows, tested = [], {}
    for reference, other in COMPARISONS:
        first, second = _group(results, profile, reference), _group(results, profile, other)
        seeds = sorted({r["seed"] for r in first} & {r["seed"] for r in second})
        if len(seeds) < 2 or not set(profile.seeds) <= set(seeds):
            continue
        first = [r for r in first if r["seed"] in seeds]
        second = [r for r in second if r["seed"] in seeds]
        # Two controls of one command (recorded_twin) make two comparisons of the same runs: one test, and one row
        # that names both, so that Holm's family does not count it twice
        runs = tuple(tuple((r["seed"], json.dumps(r.get("setting", r["arm"]), sort_keys=True)) for r in group)
                     for group in (first, second))
        if runs in tested:
            for row in tested[runs]:
                row["also"].append((reference, other))
            continue
        tested[runs] = []
        labels, first_query = _seed_mean_per_query(first, results.path.parent)
        _, second_query = _seed_mean_per_query(second, results.path.parent)
        for metric in METRICS:
            a = [100 * r["metrics"][metric] for r in second]
            b = [100 * r["metrics"][metric] for r in first]
            row = {"reference": reference, "other": other, "metric": metric, "seeds": len(seeds),
                   "t": fair_stats.paired_t(a, b), "wilcoxon": fair_stats.wilcoxon_signed_rank(a, b),
                   "seed_ci": fair_stats.paired_bootstrap_ci(a, b), "also": []}
            tested[runs].append(row)
            row["per_seed"] = [(seed, x - y) for x, y, seed in zip(a, b, seeds, strict=True)]
            if len(seeds) >= SEARCH_SEED_APART:
                # every search trial trained at seed 0, so a choice fits that seed's batches best: the difference
                # over the other seeds says whether the verdict leans on it
                row["without_search_seed"] = statistics.mean(
                    x - y for x, y, seed in zip(a, b, seeds, strict=True) if seed != 0)
            if metric in first_query:
                low, high = fair_stats.paired_class_bootstrap_ci(second_query[metric], first_query[metric], labels)
                row["class_ci"] = (100 * low, 100 * high)
            rows.append(row)
    for row, adjusted in zip(rows, fair_stats.holm([row["t"].p for row in rows]), strict=True):
        row["holm"] = adjusted
    return rows


def comparison_table(rows: list[dict]) -> str:
    import fair_stats  # scipy: only the report needs it (a GPU image may have none)

    apart = any("without_search_seed" in row for row in rows)  # a column of its own where a row has it
    lines = ["| comparison | metric | seeds | difference | " + ("without seed 0 (the search's) | " if apart else "")
             + "95% CI (seeds) | 95% CI (classes) | paired t | Wilcoxon | Holm | verdict |",
             "|---|---|---:|---:|" + ("---:|" if apart else "") + "---:|---:|---:|---:|---:|---|"]
    for row in rows:
        class_ci = "{:+.2f} to {:+.2f}".format(*row["class_ci"]) if "class_ci" in row else ""
        rest = f"{row['without_search_seed']:+.2f} | " if "without_search_seed" in row else "| " if apart else ""
        same = "".join(f" (the same runs as {_label(other)} − {_label(reference)})"
                       for reference, other in row.get("also", ()))
        lines.append(
            f"| {_label(row['other'])} − {_label(row['reference'])}{same} | {row['metric']} | {row['seeds']} | "
            f"{row['t'].mean_diff:+.2f} | {rest}{row['seed_ci'][0]:+.2f} to {row['seed_ci'][1]:+.2f} | {class_ci} | "
            f"t {row['t'].t:.1f}, {fair_stats.format_p(row['t'].p)} | {fair_stats.format_p(row['wilcoxon'].p)} | "
            f"{fair_stats.format_p(row['holm'])} | {fair_stats.verdict(row['t'].mean_diff, row['holm'])} |")
    return "\n".join(lines)


COLOURS = {"baseline": "#7f7f7f", "memvir-official": "#d62728", "memvir-balanced": "#1f77b4",
           "memvir-seen": "#2ca02c"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    return plt


def plot_search(results: Results, profile: Profile, path: Path) -> Path | None:
    """The search's landscape once every arm has chosen: each trial's mean validation MAP@R against its learning rate,
    class-weight learning rate and loss scale, one colour per arm (triangles: the trials of a grown box; hollow: the
    baseline's trials with a post-warm-up loss multiplier), each arm's choice ringed, the box's ends dotted and a
    grown box's ends dashed. None before every arm has chosen."""
    searches = {arm: arm_search(results, profile, arm) for arm in profile.arms}
    if not all(search.chosen for search in searches.values()):
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(BOX_RANGES), figsize=(15, 4.4))
    box = BOXES[profile.box]
    for axis, name in zip(axes, BOX_RANGES, strict=True):
        for arm, search in searches.items():
            for t, setting in enumerate(search.trials):
                value, score = getattr(setting, name), 100 * search_score(results, profile, arm, t)
                hollow = setting.loss_scale_after_warmup != 1.0
                axis.scatter(value, score, marker="^" if t >= profile.arm_trials(arm) else "o", s=36,
                             facecolors="none" if hollow else COLOURS[arm], edgecolors=COLOURS[arm],
                             label=ARM_NAMES[arm] if t == 0 else None)
                if setting == search.chosen:
                    axis.scatter(value, score, s=200, facecolors="none", edgecolors="black", linewidths=1.2,
                                 label="chosen" if arm == profile.arms[0] else None)
            for end in getattr(search.box, name):
                if end not in getattr(box, name):
                    axis.axvline(end, color=COLOURS[arm], linestyle="--", linewidth=1)
        for end in getattr(box, name):
            axis.axvline(end, color="#999999", linestyle=":", linewidth=1)
        if name != "scale":
            axis.set_xscale("log")
        axis.set_xlabel({"lr": "learning rate", "class_lr": "class-weight learning rate", "scale": "loss scale"}[name])
        axis.set_ylabel("validation MAP@R (%, folds' mean)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(f"The {profile.name} search: every trial at seed 0 (dotted: the box; dashed: a grown box; "
                    "hollow: the baseline's loss multiplied after the warm-up)", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_seeds(rows: list[dict], path: Path) -> Path | None:
    """Each comparison's MAP@R difference seed by seed (rings: seed 0, the seed every search trial trained at), its
    mean as a bar and the seeds' bootstrap 95% interval as a line. None without a MAP@R row."""
    rows = [row for row in rows if row["metric"] == "map@r"]
    if not rows:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(11, 1.3 + 0.55 * len(rows)))
    for y, row in enumerate(reversed(rows)):
        axis.barh(y, row["t"].mean_diff, color="#c6dbef", height=0.6)
        axis.plot(row["seed_ci"], (y, y), color="#08519c", linewidth=2)
        others = [difference for seed, difference in row["per_seed"] if seed != 0]
        axis.scatter(others, [y] * len(others), color="#08519c", s=14, zorder=3)
        search_seed = [difference for seed, difference in row["per_seed"] if seed == 0]
        axis.scatter(search_seed, [y] * len(search_seed), s=60, facecolors="none", edgecolors="#d62728", zorder=4)
    axis.axvline(0, color="black", linewidth=0.8)
    axis.set_yticks(range(len(rows)),
                    [f"{_label(row['other'])} − {_label(row['reference'])}" for row in reversed(rows)], fontsize=8)
    axis.set_xlabel("test MAP@R difference (points)")
    axis.set_title("Seed by seed (dots; red ring: seed 0, the seed the search trained at), the mean (bar) and the "
                   "seeds' 95% bootstrap interval (line)", fontsize=9)
    axis.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def doc_figures(results: Results, profile: Profile, doc: Path, draw: bool = True,
                rows: list[dict] | None = None) -> list[str]:
    """The figures a profile's block of `doc` shows, as markdown image lines (drawn beside results.json where
    `draw`): its search's landscape once every arm has chosen, and its comparisons (`rows`, computed here when not
    given) seed by seed once any is in."""
    output = results.path.parent
    figures = []
    if not profile.choose_from and len(chosen_settings(results, profile)) == len(profile.arms):
        figures.append((f"{profile.name}-search.png", lambda path: plot_search(results, profile, path)))
    if rows is None:  # comparisons need scipy (fair_stats): not during a search
        rows = comparisons(results, profile) if any(
            r["profile"] == profile.name and r["phase"] != "search" for r in results.records) else []
    if any(row["metric"] == "map@r" for row in rows):
        figures.append((f"{profile.name}-seeds.png", lambda path: plot_seeds(rows, path)))
    lines = []
    for name, plot in figures:
        if draw:
            plot(output / name)
        lines.append(f"![{name[:-4]}]({os.path.relpath(output / name, doc.parent)})")
    return lines


def _curve_mean(records: list[dict], column: str, key: str = "curve") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, sd) over `records` of one curve column (`key` "curve", or "target_cosine" with column None),
    at the steps every record has."""
    if key == "target_cosine":
        series = [dict((step, value) for step, value in r[key]) for r in records]
    else:
        at = records[0]["curve_columns"].index(column)
        series = [{row[0]: row[at] for row in r[key]} for r in records]
    steps = sorted(set.intersection(*(set(one) for one in series)))
    values = np.array([[one[step] for step in steps] for one in series], dtype=float)
    return np.array(steps), values.mean(axis=0), values.std(axis=0, ddof=1) if len(values) > 1 else 0 * values[0]


def overfit_table(results: Results, profile: Profile) -> str:
    """Each arm's finals: test MAP@R at the start (the pretrained backbone), at its best evaluation and at the end
    (means over seeds), and the training batches' mean cos(x, W_y) at the end (the paper's Fig. 5)."""
    lines = ["| arm | seeds | MAP@R at step 0 | best MAP@R (step) | final MAP@R | final − best | cos(x, W_y) at the "
             "end |", "|---|---:|---:|---:|---:|---:|---:|"]
    for arm in profile.arms:
        group = _group(results, profile, arm)
        if not group:
            continue
        steps, mean, _ = _curve_mean(group, "map@r")
        best = int(np.argmax(mean))
        cosine = statistics.mean(r["target_cosine"][-1][1] for r in group)
        lines.append(f"| {ARM_NAMES[arm]} | {len(group)} | {100 * mean[0]:.2f} | {100 * mean[best]:.2f} "
                     f"({int(steps[best])}) | {100 * mean[-1]:.2f} | {100 * (mean[-1] - mean[best]):+.2f} | "
                     f"{cosine:.3f} |")
    return "\n".join(lines)


def share_table(results: Results, names: tuple[str, ...]) -> str:
    """The paper's Table 1b for the regime: for each profile (a share of the training classes), the baseline's test
    MAP@R and Recall@1, and each MemVir arm's paired difference with its Holm-adjusted p (Holm over that profile's
    own comparisons table, as its report gives it)."""
    import fair_stats  # scipy: only the report needs it

    lines = ["| training classes | seeds | baseline MAP@R | baseline Recall@1 | official − baseline, MAP@R | "
             "balanced − baseline, MAP@R | official − baseline, Recall@1 | balanced − baseline, Recall@1 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        profile = PROFILES[name]
        group = _group(results, profile, "baseline")
        rows = {(r["other"], r["metric"]): r for r in comparisons(results, profile) if r["reference"] == "baseline"}
        if not group or not rows:
            continue
        trained = FEW_CLASSES - profile.held_out

        def cell(arm, metric, rows=rows):
            row = rows.get((arm, metric))
            if row is None:
                return ""
            word = fair_stats.verdict(row["t"].mean_diff, row["holm"])
            shown = f"{row['t'].mean_diff:+.2f} (Holm {fair_stats.format_p(row['holm'])})"
            return f"**{shown}**" if word != "no difference shown" else shown

        values = {metric: [100 * r["metrics"][metric] for r in group] for metric in ("map@r", "recall@1")}
        spread = {metric: statistics.stdev(v) if len(v) > 1 else 0.0 for metric, v in values.items()}
        lines.append(f"| {trained} of {FEW_CLASSES} ({round(100 * trained / FEW_CLASSES)} %) | {len(group)} | "
                     f"{statistics.mean(values['map@r']):.2f} ± {spread['map@r']:.2f} | "
                     f"{statistics.mean(values['recall@1']):.2f} ± {spread['recall@1']:.2f} | "
                     f"{cell('memvir-official', 'map@r')} | {cell('memvir-balanced', 'map@r')} | "
                     f"{cell('memvir-official', 'recall@1')} | {cell('memvir-balanced', 'recall@1')} |")
    return "\n".join(lines)


def early_stop_table(results: Results, names: tuple[str, ...]) -> str:
    """For the shares that hold training classes out as validation: each arm's test MAP@R at step 0 (the pretrained
    backbone, before any fine-tuning), at the end, and at a validation-chosen early stop (each run's evaluation with
    the best validation MAP@R, the earliest of equals; means over seeds, the chosen steps listed)."""
    lines = ["| training classes | run | seeds | MAP@R of the backbone (step 0) | final MAP@R | MAP@R at the "
             "validation-chosen stop | steps chosen |", "|---|---|---:|---:|---:|---:|---|"]
    for name in names:
        profile = PROFILES[name]
        if not profile.held_out:
            continue
        trained = FEW_CLASSES - profile.held_out
        for arm in [*profile.arms, *profile.controls]:
            group = _group(results, profile, arm)
            if not group:
                continue
            columns = group[0]["curve_columns"]
            test, validation = columns.index("map@r"), columns.index("val_map@r")
            stops = [max(r["curve"], key=lambda row: row[validation]) for r in group]  # max keeps the first of equals
            backbone = statistics.mean(100 * r["curve"][0][test] for r in group if r["curve"][0][0] == 0)
            final = statistics.mean(100 * r["metrics"]["map@r"] for r in group)
            stopped = statistics.mean(100 * row[test] for row in stops)
            lines.append(f"| {trained} of {FEW_CLASSES} | {_label(arm)} | {len(group)} | {backbone:.2f} | "
                         f"{final:.2f} | {stopped:.2f} | {', '.join(str(row[0]) for row in stops)} |")
    return "\n".join(lines)


REGIME_SHARES = ("regime-10", "regime-30", "regime-70", "regime")


def plot_regime(results: Results, profile: Profile, path: Path) -> Path | None:
    """The regime's curves: validation MAP@R of each arm's chosen trial (its search runs, the folds' mean), the
    finals' test MAP@R and their training batches' mean cos(x, W_y) (seeds' mean, sd as a band); None before any
    final."""
    plt = _pyplot()
    chosen = chosen_settings(results, profile)
    if not any(_group(results, profile, arm) for arm in profile.arms):
        return None
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    last_step = [0, 0, 0]  # each panel's last step: the warm-up ends at warmup / epochs of it
    for arm in profile.arms:
        colour = COLOURS[arm]
        if arm in chosen:
            trial = arm_search(results, profile, arm).trials.index(chosen[arm])
            folds = [results.find(profile=profile.name, phase="search", arm=arm, trial=trial, fold=f)
                     for f in range(profile.folds)]
            steps, mean, _ = _curve_mean(folds, "val_map@r")
            axes[0].plot(steps, 100 * mean, color=colour, label=f"{ARM_NAMES[arm]} (trial {trial})")
            last_step[0] = max(last_step[0], int(steps[-1]))
        group = _group(results, profile, arm)
        if group:
            for panel, key, column, scale in ((1, "curve", "map@r", 100), (2, "target_cosine", None, 1)):
                axis = axes[panel]
                steps, mean, spread = _curve_mean(group, column, key)
                last_step[panel] = max(last_step[panel], int(steps[-1]))
                axis.plot(steps, scale * mean, color=colour, label=f"{ARM_NAMES[arm]} ({len(group)} seeds)")
                axis.fill_between(steps, scale * (mean - spread), scale * (mean + spread), color=colour, alpha=0.15)
    titles = (("validation MAP@R, chosen trials (seed 0, folds' mean)", "MAP@R (%)"),
              ("test MAP@R, finals (mean ± sd over seeds)", "MAP@R (%)"),
              ("mean cos(x, W_y) of the training batches (paper Fig. 5)", "cos(x, W_y)"))
    for axis, (title, label), last in zip(axes, titles, last_step, strict=True):
        axis.axvline(last * profile.warmup / profile.epochs, color="#999999", linestyle=":", linewidth=1)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("step (dotted: the warm-up's end)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"The paper's regime: {profile.dataset} fine-tuned from the pretrained backbone "
                    f"({profile.epochs} epochs, warm-up {profile.warmup:g})", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def chosen_table(results: Results, profile: Profile) -> str:
    """A profile without a search of its own: the settings its source profile's search chose."""
    source = PROFILES[profile.choose_from]
    lines = [f"Settings chosen by the `{source.name}` profile's search (its validation folds):", "",
             "| arm | setting |", "|---|---|"]
    lines += [f"| {ARM_NAMES[arm]} | {setting.describe()} |"
              for arm, setting in chosen_settings(results, source).items()]
    return "\n".join(lines)


def report(profile: Profile, output: Path) -> str:
    results = Results(output / "results.json")
    if profile.choose_from:
        parts = [chosen_table(results, profile)]
    else:
        parts = [plan(profile), "## Search (validation MAP@R, seed 0)", search_table(results, profile)]
    if any(r["phase"] != "search" for r in results.records):
        parts += ["## Chosen settings at every seed (test classes)", final_table(results, profile),
                  "## Paired comparisons (points; Holm over the table's rows)",
                  comparison_table(comparisons(results, profile))]
        if profile.study == "regime":  # does the baseline over-fit; does MemVir change that?
            parts += ["## Over-fitting: the finals' test curves", overfit_table(results, profile)]
            if profile.name in REGIME_SHARES:
                parts += ["## The shares of the training classes (the paper's Table 1b)",
                          share_table(results, REGIME_SHARES)]
            if plot_regime(results, profile, output / f"{profile.name}.png"):
                parts.append(f"![{profile.name}]({output.name}/{profile.name}.png)")
    return "\n\n".join(parts)


def update_doc(doc: Path, profile: Profile, output: Path) -> bool:
    """Rewrite the tables between `<!-- NAME tables -->` and `<!-- /NAME tables -->` in `doc` (NAME: the profile's)
    with the report's, recomputed from results.json: a profile's own search first, if it has one, then the finals
    and comparisons once any is in (always for a profile without a search), and for a profile that holds classes out
    as validation the backbone's and the validation-chosen early stop's MAP@R beside the finals'; then its figures
    (doc_figures), drawn again; False where `doc` has no such block."""
    results = Results(output / "results.json")
    start, end = f"<!-- {profile.name} tables -->", f"<!-- /{profile.name} tables -->"
    text = doc.read_text()
    if start not in text or end not in text:
        return False
    parts = [] if profile.choose_from else [search_table(results, profile)]
    rows = []  # the comparisons, computed once for the table and the figure (seconds of bootstraps each time)
    if profile.choose_from or results.find(profile=profile.name, phase="final") is not None:
        rows = comparisons(results, profile)
        parts += [final_table(results, profile), comparison_table(rows)]
        if profile.held_out:
            parts.append(early_stop_table(results, (profile.name,)))
    parts += doc_figures(results, profile, doc, rows=rows)
    tables = "\n\n".join(parts)
    before, rest = text.split(start, 1)
    doc.write_text(before + start + "\n" + tables + "\n" + end + rest.split(end, 1)[1])
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("plan", "run", "report"))
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each gets cpu_count / jobs threads)")
    parser.add_argument("--threads", type=int, help="torch threads of each run (default: cpu_count / jobs)")
    parser.add_argument("--controls", help="comma-separated: run only these of the profile's controls (in this "
                        "order of priority: each at every seed before the next)")
    parser.add_argument("--seeds", help="comma-separated seeds of the finals and controls (default: the profile's)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (every run of the study on that device)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "fair", help="where the run folders go")
    parser.add_argument("--output", type=Path, help="where results.json and per_query/ go (default: "
                        "docs/reproduction/STUDY, the profile's study)")
    parser.add_argument("--doc", type=Path, help="report: also rewrite this document's block of the profile's tables "
                        "(between <!-- NAME tables --> and <!-- /NAME tables -->)")
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    if args.seeds:
        profile = replace(profile, seeds=tuple(int(s) for s in args.seeds.split(",")))
    args.output = args.output or REPRODUCTION / profile.study
    if args.command == "run" and args.controls:
        wanted = args.controls.split(",")
        unknown = sorted(set(wanted) - set(profile.controls))
        if unknown:
            parser.error(f"--controls: {', '.join(unknown)} not among profile {profile.name}'s controls "
                         f"({', '.join(profile.controls)})")
        for name in wanted:  # one control at every seed, then the next
            run_study(replace(profile, controls=(name,)), args.jobs, args.device, args.runs, args.output,
                      args.threads)
    elif args.command == "run":
        run_study(profile, args.jobs, args.device, args.runs, args.output, args.threads)
    if args.command == "report" and args.doc and not update_doc(args.doc, profile, args.output):
        parser.error(f"--doc: {args.doc} has no <!-- {profile.name} tables --> ... <!-- /{profile.name} tables --> "
                     "block to rewrite")
    print(plan(profile) if args.command == "plan" else report(profile, args.output))


if __name__ == "__main__":
    main()
