"""PNG plots of the reproduction study (docs/reproduction/*.png), drawn from the records of results.json.

Each plot shows the mean over seeds with the sample standard deviation as error bars or a band, as the tables do.
`draw_all(records, folder)` draws every plot whose study has records and returns the paths it wrote.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on these machines or on a Space
import matplotlib.pyplot as plt  # noqa: E402
import studies  # noqa: E402  (bench/ is on sys.path: run from studies.py and the tests)

BASELINE, MEMVIR = "#7f7f7f", "#d62728"
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
METRIC_NAMES = {"recall@1": "Recall@1", "r_precision": "R-Precision", "map@r": "MAP@R"}


mean_std = studies.summary  # the tables' mean ± sd, in percent


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _baseline_band(axis, group: list[dict], key: str, label: str = "baseline") -> None:
    mean, std = mean_std(group, key)
    axis.axhspan(mean - std, mean + std, color=BASELINE, alpha=0.2)
    axis.axhline(mean, color=BASELINE, linestyle="--", label=f"{label} (mean ± sd)")


def plot_losses(records: list[dict], path: Path) -> Path:
    """Paired bars per loss, baseline and MemVir, for each metric (paper Table 4)."""
    names = [name for name, _ in studies.LOSS_NAMES]
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    for axis, key in zip(axes, studies.METRICS, strict=True):
        values = []
        for i, name in enumerate(names):
            for offset, (label, colour) in ((-0.2, (name, BASELINE)), (0.2, (f"{name} + MemVir(2, 50)", MEMVIR))):
                group = studies.rows_of(records, "losses", label)
                if group:
                    mean, std = mean_std(group, key)
                    axis.bar(i + offset, mean, width=0.4, yerr=std, capsize=3, color=colour)
                    values.append(mean)
        axis.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        if values:
            axis.set_ylim(min(values) - 4, max(values) + 2)
        axis.set_title(f"test {METRIC_NAMES[key]} (%)", fontsize=10)
    axes[0].legend(handles=[plt.Rectangle((0, 0), 1, 1, color=BASELINE), plt.Rectangle((0, 0), 1, 1, color=MEMVIR)],
                   labels=["baseline", "+ MemVir(2, 50)"], fontsize=8)
    figure.suptitle("Losses with and without MemVir on glyphs (3 seeds, 8 epochs, warm-up 2)", fontsize=10)
    return _save(figure, path)


def plot_grid(records: list[dict], path: Path) -> Path:
    """Recall@1 against N, one line per M, over the baseline's band (paper Fig. 8): test and validation."""
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    baseline = studies.rows_of(records, "grid", "baseline")
    for axis, key, title in zip(axes, ("recall@1", studies.CHOICE_METRIC),
                                ("test Recall@1 (reported)", "validation MAP@R (the choice is made on it)"),
                                strict=True):
        if baseline:
            _baseline_band(axis, baseline, key)
        for colour, m in zip(COLOURS, studies.GRID_M, strict=False):
            points = [(n, mean_std(g, key)) for n in studies.GRID_N
                      if (g := studies.rows_of(records, "grid", studies.memvir_label(n, m)))]
            if points:
                axis.errorbar([n for n, _ in points], [s[0] for _, s in points], yerr=[s[1] for _, s in points],
                              marker="o", capsize=4, color=colour, label=f"MemVir, M = {m}")
        axis.set_xticks(studies.GRID_N)
        axis.set_xlabel("N (past steps used)")
        axis.set_ylabel("%")
        axis.set_title(title, fontsize=9)
        axis.legend(fontsize=7)
    figure.suptitle("Effect of N and M (warm-up 2 of 8 epochs, 3 seeds)", fontsize=10)
    return _save(figure, path)


def plot_batch(records: list[dict], path: Path) -> Path:
    """Test Recall@1 against batch size, baseline and MemVir (paper Table 1a): left at 8 epochs each (M fixed, and
    M scaled with the steps an epoch takes), right at the same number of steps each."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    batches = studies.BATCHES

    def suffix(b: int) -> str:  # the equal-steps rows' label ending; batch 128's are the 8-epoch rows
        epochs = studies.equal_steps(b)[0]
        return "" if epochs == studies.REFERENCE_EPOCHS else f", {epochs} epochs"

    # (axis, colour, legend, the row label at batch b)
    lines = ((left, BASELINE, "baseline", lambda b: f"baseline, batch {b}"),
             (left, MEMVIR, "MemVir(2, 50)", lambda b: f"MemVir(2, 50), batch {b}"),
             (left, COLOURS[0], "MemVir(2, 50·128/batch)", lambda b: f"MemVir(2, {studies.m_scaled(b)}), batch {b}"),
             (right, BASELINE, "baseline", lambda b: f"baseline, batch {b}{suffix(b)}"),
             (right, MEMVIR, "MemVir(2, 50)", lambda b: f"MemVir(2, 50), batch {b}{suffix(b)}"))
    for axis, colour, legend, label in lines:
        points = [(b, mean_std(g, "recall@1")) for b in batches if (g := studies.rows_of(records, "batch", label(b)))]
        if len(points) > 1:
            axis.errorbar([b for b, _ in points], [s[0] for _, s in points], yerr=[s[1] for _, s in points],
                          marker="o", capsize=4, color=colour, label=legend)
    equal_epochs = ", ".join(str(studies.equal_steps(b)[0]) for b in batches)
    for axis, title in ((left, "8 epochs each"),
                        (right, f"as many steps each as 8 epochs at batch 128 ({equal_epochs} epochs)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(batches, [str(b) for b in batches])
        axis.set_xlabel("batch size")
        axis.set_title(title, fontsize=9)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    left.set_ylabel("test Recall@1 (%)")
    figure.suptitle("Batch size (3 seeds)", fontsize=10)
    return _save(figure, path)


def plot_schedule(records: list[dict], path: Path) -> Path:
    """Left: the class count s(i) of each schedule (paper Fig. 3, seed 0); right: test Recall@1 of each."""
    rows = studies.study_rows("schedule", records)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    for i, (colour, row) in enumerate(zip(COLOURS, rows, strict=False)):
        group = studies.rows_of(records, "schedule", row.label)
        if not group:
            continue
        seed0 = min(group, key=lambda r: r["seed"])
        steps, classes = zip(*seed0["classes"], strict=True)
        left.step(steps, classes, where="post", color=colour, label=row.label)
        mean, std = mean_std(group, "recall@1")
        right.bar(i, mean, yerr=std, capsize=4, color=colour)
    baseline = studies.rows_of(records, "grid", "baseline")
    values = [mean_std(g, "recall@1")[0] for g in (studies.rows_of(records, "schedule", r.label) for r in rows) if g]
    if baseline:
        _baseline_band(right, baseline, "recall@1")
        right.legend(fontsize=7, loc="lower right")
        values.append(mean_std(baseline, "recall@1")[0])
    left.set_xlabel("step")
    left.set_ylabel("classes in the loss, s(i)")
    left.legend(fontsize=7)
    left.set_title("class count over training", fontsize=9)
    right.set_xticks(range(len(rows)), [r.label.replace(" (", "\n(") for r in rows], fontsize=7)
    if values:
        right.set_ylim(min(values) - 4, max(values) + 2)
    right.set_ylabel("test Recall@1 (%)")
    right.set_title("MemVir(2, 50), 3 seeds", fontsize=9)
    figure.suptitle("Schedule ablation (paper Fig. 3)", fontsize=10)
    return _save(figure, path)


def _curve_band(axis, group: list[dict], column: str, colour: str, label: str, style: str = "-") -> list[float]:
    """Mean and sd over seeds of an evaluation curve (all seeds evaluate at the same steps); returns the band's
    edges over the last three quarters of training, where the differences are, for zooming in on them."""
    steps = group[0]["curve"]["step"]
    values = [[100 * r["curve"][column][i] for r in group] for i in range(len(steps))]
    means = [statistics.mean(v) for v in values]
    stds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
    axis.plot(steps, means, style, color=colour, label=label)
    axis.fill_between(steps, [m - s for m, s in zip(means, stds, strict=True)],
                      [m + s for m, s in zip(means, stds, strict=True)], color=colour, alpha=0.2)
    late = [i for i, step in enumerate(steps) if step >= steps[-1] / 4]
    return [means[i] - stds[i] for i in late] + [means[i] + stds[i] for i in late]


def _draw_curves(axes, records: list[dict], study: str) -> None:
    """On three axes: test Recall@1, test MAP@R and validation MAP@R over training, each configuration a band over
    seeds, the end of the warm-up marked, y zoomed on the last three quarters of training."""
    rows = studies.study_rows(study, records)
    colours = (BASELINE, MEMVIR, *COLOURS)
    for axis, column, name in zip(axes, ("recall@1", "map@r", "val_map@r"),
                                  ("test Recall@1", "test MAP@R", "validation MAP@R"), strict=True):
        edges = []
        for row, colour in zip(rows, colours, strict=False):
            group = studies.rows_of(records, study, row.label)
            if group:
                edges += _curve_band(axis, group, column, colour, row.label)
        if edges:  # the early climb is the same for all; zoom on where they part
            axis.set_ylim(min(edges) - 1, max(edges) + 1)
        warmups = {row.warmup for row in rows if row.n or row.loss_scale != 1.0}
        for warmup in warmups:
            axis.axvline(warmup * _steps_per_epoch(records, study), color=MEMVIR, linestyle=":",
                         label="end of warm-up")
        axis.set_xlabel("step")
        axis.set_ylabel("%")
        axis.set_title(name, fontsize=9)
        axis.legend(fontsize=7)


def plot_curves(records: list[dict], study: str, path: Path, title: str) -> Path:
    """Test Recall@1, test MAP@R and validation MAP@R over training, each configuration a band over seeds, with
    the end of the MemVir warm-up marked."""
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    _draw_curves(axes, records, study)
    figure.suptitle(title + "; y zoomed on the last three quarters", fontsize=10)
    return _save(figure, path)


def plot_dilution(records: list[dict], path: Path) -> Path:
    """The dilution ablation: the curves over training (top) and the final metrics of each row (bottom)."""
    figure, axes = plt.subplots(2, 3, figsize=(14, 8.5))
    _draw_curves(axes[0], records, "dilution")
    rows = [row for row in studies.study_rows("dilution", records) if studies.rows_of(records, "dilution", row.label)]
    colours = (BASELINE, MEMVIR, *COLOURS)
    for axis, key, name in zip(axes[1], ("recall@1", "map@r", "val_map@r"),
                               ("test Recall@1", "test MAP@R", "validation MAP@R"), strict=True):
        means = []
        for i, (row, colour) in enumerate(zip(rows, colours, strict=False)):
            mean, std = mean_std(studies.rows_of(records, "dilution", row.label), key)
            axis.barh(i, mean, xerr=std, capsize=3, color=colour)
            means.append((mean, std))
        axis.set_yticks(range(len(rows)), [row.label for row in rows], fontsize=7)
        axis.invert_yaxis()
        if means:
            axis.set_xlim(min(m - s for m, s in means) - 1, max(m + s for m, s in means) + 0.5)
        axis.set_xlabel("%")
        axis.set_title(f"{name} after 24 epochs (mean ± sd)", fontsize=9)
    figure.suptitle("MemVir apart from gradient dilution: 24 epochs, warm-up 8, 3 seeds (curves zoomed on the last "
                    "three quarters)", fontsize=10)
    return _save(figure, path)


def plot_overfit_probe(records: list[dict], path: Path) -> Path:
    """Looking for over-fitting from the baseline alone: validation and test MAP@R over training, and the training
    loss, for each probed setting."""
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    rows = [row for row in studies.study_rows("overfit-probe", records)
            if studies.rows_of(records, "overfit-probe", row.label)]
    for row, colour in zip(rows, COLOURS, strict=False):
        group = studies.rows_of(records, "overfit-probe", row.label)
        _curve_band(axes[0], group, "val_map@r", colour, row.label)
        _curve_band(axes[1], group, "map@r", colour, row.label)
        steps, losses = zip(*group[0]["loss"], strict=True)
        axes[2].plot([s / _run_steps_per_epoch(group[0]) for s in steps], losses, color=colour, label=row.label)
    for axis, title in zip(axes[:2], ("validation MAP@R (the other training classes)", "test MAP@R"), strict=True):
        axis.set_xlabel("step")
        axis.set_ylabel("%")
        axis.set_title(title, fontsize=9)
    axes[2].set_xlabel("epoch")
    axes[2].set_yscale("log")
    axes[2].set_title("training loss (seed 0)", fontsize=9)
    for axis in axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    figure.suptitle("Where does the baseline over-fit? No augmentation, few training classes (seed 0)", fontsize=10)
    return _save(figure, path)


def plot_overfit(records: list[dict], path: Path) -> Path:
    """100 classes without augmentation, where the baseline over-fits: MemVir under both reductions."""
    return plot_curves(records, "overfit", path, "100 training classes, no augmentation, 60 epochs, MemVir warm-up 20 "
                       "(3 seeds; validation: the other 921)")


def plot_preset(records: list[dict], path: Path) -> Path:
    """The candidates for the app's default run against their baseline."""
    return plot_curves(records, "preset", path, "The app's preset: 12 epochs, MemVir warm-up 2 (3 seeds)")


def _run_steps_per_epoch(run: dict) -> float:
    return run["curve"]["step"][-1] / run["epochs"]


def plot_budget(records: list[dict], path: Path) -> Path:
    """A 24-epoch run, baseline against the MemVir setting chosen on validation."""
    return plot_curves(records, "budget", path, "A longer budget: 24 epochs, MemVir warm-up 8 (3 seeds)")


def plot_long(records: list[dict], path: Path) -> Path:
    """The budget study's runs carried on to 48 epochs."""
    return plot_curves(records, "long", path, "The 24-epoch runs carried on to 48 epochs, MemVir warm-up 8 (3 seeds)")


def plot_few_classes(records: list[dict], path: Path) -> Path:
    """100 training classes for 100 epochs, where the baseline may over-fit."""
    return plot_curves(records, "few-classes", path,
                       "100 training classes, 100 epochs, MemVir warm-up 40 (3 seeds; validation: the other 921)")


def _steps_per_epoch(records: list[dict], study: str) -> float:
    """From any run of the study (or of the rows it shares): the last evaluation's step over its epochs."""
    run = next(r for row in studies.study_rows(study, records) for r in studies.rows_of(records, study, row.label))
    return _run_steps_per_epoch(run)


PLOTTERS = {"losses": plot_losses, "grid": plot_grid, "batch": plot_batch, "schedule": plot_schedule,
            "budget": plot_budget, "long": plot_long, "few-classes": plot_few_classes, "dilution": plot_dilution,
            "overfit-probe": plot_overfit_probe, "overfit": plot_overfit, "preset": plot_preset}


def draw_all(records: list[dict], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [plotter(records, folder / f"{study}.png") for study, plotter in PLOTTERS.items()
            if any(r["study"] == study for r in records)]
