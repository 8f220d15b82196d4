"""The results table: once a run and its baseline ("Compare with baseline", N = 0) have both finished, their final
retrieval metrics side by side, and the difference, with each arm's settings and how they were chosen. Test classes
always; validation classes too where the run held some out of training (docs/method.md, "Validation": the ones to
choose settings on).

The figures are the last evaluation record of each run's metrics.jsonl, shown as percentages with two decimals.
`expectations` is the paragraph printed under the table: what the study measured for such a run, and why.
"""

from __future__ import annotations

from demo.runs import live_changes
from demo.train.presets import PRESETS, optimiser_of, tuned_baseline
from memvir.config import TrainConfig

# What to expect of the difference, from the studies' measured figures (docs/reproduction.md, sections 7 and 9, "A
# fair comparison" and "A converged search")
FAIR_ON_GLYPHS = ("These are the first fair comparison's choices (docs/reproduction.md, \"A fair comparison\"), "
                  "glyphs' preset before the widened search: MemVir and the baseline each chose their optimiser by "
                  "the same search of 6 trials on validation classes. On the test classes over 5 seeds this MemVir "
                  "led its tuned baseline by 1.44 Recall@1, 1.82 R-Precision and 2.35 MAP@R (paired over seeds, "
                  "Holm-corrected p 0.013, 0.043 and 0.039). "
                  "A baseline given this run's optimiser, with or without its exact step schedule, reaches its "
                  "Recall@1 (this MemVir trailed them by 0.21 and 0.62, neither established after Holm's "
                  "correction) but not its MAP@R (this MemVir led them by 2.86 and 2.27): on glyphs the Recall@1 gain "
                  "comes with MemVir's optimiser, and at that optimiser the MAP@R gain with the virtual classes. At "
                  "the tuned baseline's own optimiser the same step schedule alone adds 1.25 MAP@R, and this "
                  "MemVir's lead over it (1.13) is not established (\"The step schedule, controlled\"). The widened "
                  "search, with the budget matched, chose other settings (glyphs' preset now). One seed's run can "
                  "differ from these means.")
WIDE_ON_GLYPHS = ("These are the widened fair comparison's choices (docs/reproduction.md, \"A converged search\"): "
                  "MemVir and the baseline each chose its settings by the same search on validation classes, the "
                  "baseline with a loss multiplier after the warm-up as a searched setting (it chose x2). On the test "
                  "classes over 10 seeds this MemVir led its tuned baseline by 0.64 R-Precision and 0.58 MAP@R and "
                  "trailed it by 0.71 Recall@1 (paired over seeds, Holm-corrected p 0.001, 0.005 and < 0.001). A "
                  "baseline at the same optimiser given this run's exact step schedule (its loss times k+1 as the "
                  "virtual sets arrive, no virtual class; the command line's --memvir-n 0 --loss-scale-schedule 4) "
                  "reaches that gain: this MemVir led it by 0.13 MAP@R (Holm 0.46, not established) and trailed it "
                  "by 1.05 Recall@1 (Holm < 0.001). On glyphs, MemVir's gain is matched by a baseline given the same "
                  "step schedule, and at that step the virtual classes cost Recall@1. One seed's run can differ from "
                  "these means.")
BALANCED_ON_GLYPHS = ("On glyphs at 12 epochs (921 training classes, 100 held out, trained on a GPU in bfloat16), "
                      "MemVir(2, 50) with the balanced reduction led its baseline by 2.66 test MAP@R and 2.49 "
                      "R-Precision over three seeds, with Recall@1 level (+0.16; seeds differ by about 0.4), against a "
                      "baseline whose optimiser was not tuned; balanced is the official loss times k+1, a larger step "
                      "(docs/reproduction.md, section 9, and its fair comparison).")
OFFICIAL = ("With the official reduction the live batch gets 1/(k+1) of the gradient once k virtual sets are in use: "
            "on glyphs at 12 epochs (921 training classes, on a GPU) MemVir(1, 50) official trailed its baseline by "
            "0.92 Recall@1 and 0.84 MAP@R over three seeds (section 9, Holm p 0.11 and 0.28), and in section 7 a "
            "baseline whose loss was halved after the warm-up trailed its own by 1.12 Recall@1 (Holm p 0.42); none "
            "of the three is established over three seeds (docs/reproduction.md).")
UNMEASURED = ("No study matches these settings (dataset, classes, loss, N, M, warm-up, reduction, optimiser, epochs): "
              "docs/reproduction.md measured other runs, so there is no measured expectation for this one.")
NOISE = ("One run against one baseline is one seed each: differences of a few tenths of a point are within what "
         "changing the seed does.")
# The settings a run's expectation is matched on: everything that changes what it computes.
MATCHED = ("dataset", "val_classes", "val_fold", "augment", "backbone", "pretrained", "embedding_dim", "loss",
           "loss_params", "memvir_n", "memvir_m", "warmup_epochs", "memvir_schedule", "memvir_reduction",
           "memvir_labels", "loss_scale_after_warmup", "loss_scale_schedule", "epochs", "batch_size", "sampler", "lr",
           "class_lr", "weight_decay", "adam_eps", "lr_decay", "freeze_bn")
# The study rows a run can match: (the study's command-line flags of the run, what it measured). The flags are those
# of the studies' commands in docs/reproduction/results.json, docs/reproduction/fair/results.json and
# docs/reproduction/wide/results.json (a test checks they agree); every other setting is the library's.
STUDY_ROWS = (
    ({"memvir_n": 2, "memvir_m": 50, "warmup_epochs": 2.0, "epochs": 12, "batch_size": 128, "val_classes": 100,
      "memvir_reduction": "balanced"}, BALANCED_ON_GLYPHS),
    ({"memvir_n": 1, "memvir_m": 50, "warmup_epochs": 2.0, "epochs": 12, "batch_size": 128, "val_classes": 100},
     OFFICIAL),
    ({"memvir_n": 4, "memvir_m": 10, "warmup_epochs": 2.0, "epochs": 12, "batch_size": 128,
      "memvir_reduction": "balanced", "lr": 0.00133, "class_lr": 0.00801, "adam_eps": 1e-4,
      "loss_params": {"scale": 21.1}}, FAIR_ON_GLYPHS),
    ({"memvir_n": 4, "memvir_m": 10, "warmup_epochs": 2.0, "epochs": 12, "batch_size": 128,
      "memvir_reduction": "balanced", "lr": 0.000702, "class_lr": 0.00287, "adam_eps": 1e-4,
      "loss_params": {"scale": 17.1}}, WIDE_ON_GLYPHS),
)


def expectations(config, changes: list | None = None) -> str:
    """The words under the table for a run of `config` (a TrainConfig, the settings it started with): what the
    study measured for a run of exactly these settings (MATCHED), or that no study matches them; a run changed
    while it trained (`changes`, demo.runs.live_changes.LiveChange) matches none."""
    if changes:
        return (f"This run changed its settings while it trained ({live_changes.story(changes)}); no study matches a "
                f"run changed mid-way, so there is no measured expectation for it. {NOISE}")
    settings = config.to_dict()
    for flags, text in STUDY_ROWS:
        studied = TrainConfig(**flags).to_dict()
        if all(settings[name] == studied[name] for name in MATCHED):
            return f"{text} {NOISE}"
    return f"{UNMEASURED} {NOISE}"


METRICS = (("recall@1", "Recall@1"), ("r_precision", "R-Precision"), ("map@r", "MAP@R"))
SPLITS = (("", "test"), ("val_", "validation"))


def final_metrics(records: list[dict] | None) -> dict | None:
    """The last evaluation record of a run, or None."""
    evals = [record for record in records or () if record.get("type") == "eval"]
    return evals[-1] if evals else None


def percent(value: float) -> str:
    """A fraction as the table shows it: 0.92819 -> '92.82'."""
    return f"{100 * value:.2f}"


def difference(run: float, baseline: float) -> str:
    """Run minus baseline in percentage points as the table shows it, from the shown figures, so that the columns
    add up: '+0.35', '-1.20', '0.00'."""
    points = round(float(percent(run)) - float(percent(baseline)), 2)
    return "0.00" if points == 0 else f"{points:+.2f}"


def results_rows(run: dict, baseline: dict) -> list[tuple[str, str, str, str]]:
    """(metric, run, baseline, difference) for every metric both final records hold, test first, then validation."""
    rows = []
    for prefix, split in SPLITS:
        for key, name in METRICS:
            if prefix + key in run and prefix + key in baseline:
                rows.append((f"{name} ({split})", percent(run[prefix + key]), percent(baseline[prefix + key]),
                             difference(run[prefix + key], baseline[prefix + key])))
    return rows


def results_key(run) -> tuple:
    """Changes when results_markdown(run, run.baseline) would: the table needs both runs finished, and a finished
    run's records no longer change (its last evaluation is kept before its finished status, in event order)."""
    baseline = run.baseline
    return run.id, run.state, None if baseline is None else (baseline.id, baseline.state)


def results_markdown(run, baseline) -> str:
    """The table and the expectations as markdown, or "" until both runs (LiveRuns) have finished."""
    if run is None or baseline is None:
        return ""
    with run.lock:
        finished = run.state == "finished"
        final = final_metrics(run.records)
        changes = live_changes.record_changes(run.records)
    with baseline.lock:
        finished = finished and baseline.state == "finished"
        base = final_metrics(baseline.records)
    if not finished or final is None or base is None:
        return ""
    rows = results_rows(final, base)
    lines = [f"**Final results** (step {final['step']:,}, %)", "",
             "| metric | this run | baseline | difference |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {mine} | {theirs} | {diff} |" for name, mine, theirs, diff in rows]
    return "\n".join(lines + ["", arms_text(run.config, baseline.config, changes), "",
                               expectations(run.config, changes)])


def arms_text(config, baseline_config, changes: list | None = None) -> str:
    """What each column trained: MemVir's N, M and reduction as the run started (and its live changes), each arm's
    optimiser, and the search that chose them (the fair comparison's, for a preset's tuned settings) or that
    nothing was tuned."""
    preset = PRESETS.get(config.dataset)
    tuned = tuned_baseline(config)
    mine, theirs = optimiser_of(config), optimiser_of(baseline_config)
    memvir = (f"MemVir(N = {config.memvir_n}, M = {config.memvir_m}), {config.memvir_reduction} reduction"
              if config.memvir_n else "N = 0")
    if changes:
        memvir += f" at the start, then {live_changes.story(changes)}"
    run_tuned = preset is not None and mine == preset.optimiser and tuned is not None
    baseline_tuned = tuned is not None and theirs == tuned
    if run_tuned and baseline_tuned:
        how = f"Both optimisers are the fair comparison's choices, {preset.tuning}."
    elif baseline_tuned:
        how = (f"The baseline's optimiser is its tuned one ({preset.tuning}); this run's was set by hand, without "
               "that search.")
    else:
        how = "Neither optimiser was tuned for these settings: the baseline trains this run's, with N = 0."
    return (f"**This run**: {memvir}; {mine.describe()}. **Baseline**: N = 0; {theirs.describe()}. {how}")
