"""The results table: once a run and its baseline ("Compare with baseline", N = 0) have both finished, their final
retrieval metrics side by side, and the difference. Test classes always; validation classes too where the run held
some out of training (docs/method.md, "Validation": the ones to choose settings on).

The figures are the last evaluation record of each run's metrics.jsonl, shown as percentages with two decimals.
`EXPECTATIONS` is the paragraph printed under the table: what to expect of the difference at this budget.
"""

from __future__ import annotations

# ---- EXPECTATIONS: what to expect at this budget, and why. To be written from the study's measured figures
# (docs/reproduction.md); until then one neutral sentence that claims nothing unmeasured.
EXPECTATIONS = ("Single runs differ by a few tenths of a point between seeds, so one run against one baseline "
                "cannot settle a difference of that size.")

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


def results_markdown(run, baseline) -> str:
    """The table and the expectations as markdown, or "" until both runs (LiveRuns) have finished."""
    if run is None or baseline is None:
        return ""
    with run.lock:
        finished = run.state == "finished"
        final = final_metrics(run.records)
    with baseline.lock:
        finished = finished and baseline.state == "finished"
        base = final_metrics(baseline.records)
    if not finished or final is None or base is None:
        return ""
    rows = results_rows(final, base)
    lines = [f"**Final results** (step {final['step']:,}, %)", "",
             "| metric | this run | baseline (N = 0) | difference |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {mine} | {theirs} | {diff} |" for name, mine, theirs, diff in rows]
    return "\n".join(lines + ["", EXPECTATIONS])
