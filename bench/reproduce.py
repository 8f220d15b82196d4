"""The paper's claims measured on the embedded glyphs: each configuration trained with several seeds by the CLI.

    .venv/bin/python bench/reproduce.py grid schedule budget batch --jobs 2   # runs, then writes tables and plots
    .venv/bin/python bench/reproduce.py report                                # only the tables and plots

Every run is `python -m memvir train ...` (the command is stored with its result), so a GPU user can rerun any row
at full scale on CUB200, CARS196 or SOP by changing --dataset/--data-root/--backbone. Finished runs are kept in
runs/reproduction/ and skipped when a study is run again, and a run stopped half-way continues from its checkpoint;
their final metrics and their evaluation curves are collected in docs/reproduction/results.json, from which
`report` draws docs/reproduction/*.png and prints the tables that docs/reproduction.md presents. The studies
themselves are defined in studies.py.

Choices are made on validation classes only: every study after "losses" holds out training classes
(`--val-classes`), and the "budget" study takes its MemVir setting from the grid's best mean validation MAP@R.
Test metrics are reported, never used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install

from studies import (  # noqa: E402
    CHOICE_METRIC,
    COMPARISONS,
    CONTINUES,
    METRICS,
    PLOTS,
    RESULTS,
    ROOT,
    SHARED,
    STUDIES,
    Row,
    chosen_on_validation,
    paired,
    rows_of,
    study_rows,
    summary,
)

from memvir.checkpoint import RunFolder  # noqa: E402

CURVE = ("step", "recall@1", "map@r", "val_recall@1", "val_map@r")


def read_run(run: Path) -> dict:
    """The final evaluation's metrics, the curve of every evaluation (CURVE's columns; None where a run has no
    validation classes), and the class count s(i) and training loss of the logged steps."""
    records = RunFolder(run).records()
    evals = [r for r in records if r["type"] == "eval"]
    last = evals[-1]
    final = {k: v for k, v in last.items() if k.removeprefix("val_") in METRICS}
    curve = {column: [r.get(column) for r in evals] for column in CURVE}
    steps = [r for r in records if r["type"] == "step"]
    classes = [[r["step"], r["num_classes"]] for r in steps]
    loss = [[r["step"], round(r["loss"], 5)] for r in steps]
    return final | {"step": last["step"], "curve": curve, "classes": classes, "loss": loss}


class Results:
    """docs/reproduction/results.json, appended to by several worker threads."""

    def __init__(self):
        self.records = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
        self._lock = threading.Lock()
        self._complete_old_records()

    def _complete_old_records(self) -> None:
        """Records older than this runner's curves (the first slice's, also without batch sizes): their curves and
        class counts read again from their run folders, when kept."""
        changed = False
        for record in self.records:
            run = ROOT / record["command"].split("--out ")[1]
            if not isinstance(record.get("curve"), dict) and RunFolder(run).records_file.is_file():
                record.setdefault("batch", 128)
                record.update(read_run(run))
                changed = True
        if changed:
            RESULTS.write_text(json.dumps(self.records, indent=1))

    def has(self, study: str, label: str, seed: int) -> bool:
        return any((r["study"], r["label"], r["seed"]) == (study, label, seed) for r in self.records)

    def add(self, record: dict) -> None:
        with self._lock:
            self.records.append(record)
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(self.records, indent=1))


def continue_from(study: str, row: Row, seed: int, out: Path, results: list[dict]) -> None:
    """Seed `out` with the checkpoint of the run it extends (CONTINUES), when that run is kept and `out` is new."""
    if study not in CONTINUES or out.exists():
        return
    shorter = next(r for r in study_rows(CONTINUES[study], results) if r.label == row.label)
    source = shorter.folder(CONTINUES[study], seed)
    if RunFolder(source).state_file.is_file():
        shutil.copytree(source, out)


def run_one(study: str, row: Row, seed: int, results: Results, threads: int, device: str) -> None:
    out = row.folder(study, seed)
    continue_from(study, row, seed, out, results.records)
    args = row.args(seed) + ["--out", str(out)]
    if device != "cpu":  # a GPU's steps outrun one process's augmentation: loader workers feed it
        args += ["--device", device, "--num-workers", str(max(1, threads - 1))]
    resume = ["--resume"] if RunFolder(out).state_file.exists() else []
    print(f"[{study}] {row.label}, seed {seed}: python {' '.join(args)}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TQDM_DISABLE": "1"}
    subprocess.run([sys.executable, *args, *resume], cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
    command = "python " + " ".join(args).replace(str(ROOT) + "/", "")
    results.add({"study": study, "label": row.label, "seed": seed, "epochs": row.epochs, "batch": row.batch,
                 "device": device, "command": command, **read_run(out)})


def run_studies(studies: list[str], jobs: int, device: str = "cpu") -> None:
    results = Results()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    for study in studies:
        todo = [(row, seed) for row in study_rows(study, results.records) for seed in row.seeds
                if not results.has(study, row.label, seed) and (study, row.label) not in SHARED]
        # runs stopped half-way first, so that a restarted runner finishes what it had started
        todo.sort(key=lambda job: not RunFolder(job[0].folder(study, job[1])).state_file.exists())
        with ThreadPoolExecutor(jobs) as pool:
            for future in [pool.submit(run_one, study, row, seed, results, threads, device) for row, seed in todo]:
                future.result()


def table(results: list[dict], study: str) -> str:
    with_val = study != "losses"
    keys = [*METRICS] + (["val_recall@1", CHOICE_METRIC] if with_val else [])
    rows = ["| configuration | batch | epochs | seeds | " + " | ".join(k.replace("val_", "validation ") for k in keys)
            + " |", "|---|---:|---:|---:|" + "---:|" * len(keys)]
    for row in study_rows(study, results):
        group = rows_of(results, study, row.label)
        if not group:
            continue
        cells = ["{:.2f} ± {:.2f}".format(*summary(group, key)) for key in keys]
        rows.append(f"| {row.label} | {row.batch} | {row.epochs} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def differences(results: list[dict], study: str) -> str:
    """For each of the study's COMPARISONS, per metric: the mean paired difference (points) with the paired t and
    its p over the seeds, and Holm's correction over every test in the table (docs/reproduction.md, "Protocol");
    a difference whose adjusted p is below 0.05 is set in bold."""
    import fair_stats  # scipy: only the report needs it

    keys = [*METRICS, "val_recall@1", CHOICE_METRIC]
    tests = {}
    for reference, other in COMPARISONS.get(study, ()):
        first, second = rows_of(results, study, reference), rows_of(results, study, other)
        if first and second:
            tests[reference, other] = {key: paired(first, second, key) for key in keys}
    found = [(pair, key) for pair, row in tests.items() for key, test in row.items() if test is not None]
    adjusted = dict(zip(found, fair_stats.holm([tests[pair][key].p for pair, key in found]), strict=True))
    rows = ["| comparison | " + " | ".join(k.replace("val_", "validation ") for k in keys) + " |",
            "|---|" + "---:|" * len(keys)]
    for (reference, other), row in tests.items():
        cells = []
        for key, test in row.items():
            if test is None:
                cells.append("")
                continue
            holm = adjusted[(reference, other), key]
            difference = f"{test.mean_diff:+.2f}"
            if fair_stats.verdict(test.mean_diff, holm) != "no difference shown":
                difference = f"**{difference}**"  # a gain or a loss: Holm-adjusted p below 0.05
            cells.append(f"{difference} (t {test.t:.1f}, {fair_stats.format_p(test.p)}; "
                         f"Holm {fair_stats.format_p(holm).removeprefix('p ')})")
        rows.append(f"| {other} − {reference} | " + " | ".join(cells) + " |")
    return "\n".join(rows) if len(rows) > 2 else ""


def report(results: list[dict]) -> None:
    from reproduction_plots import draw_all  # matplotlib, a development requirement; runs need none

    for study in STUDIES:
        if any(r["study"] == study for r in results) or any(
                rows_of(results, study, row.label) for row in study_rows(study, results)):
            print(f"\n## {study}\n\n{table(results, study)}")
            if compared := differences(results, study):
                print(f"\nPaired differences over the seeds (Holm over the table):\n\n{compared}")
    if chosen_on_validation(results):
        print("\nchosen on validation for the budget study: N={}, M={}".format(*chosen_on_validation(results)))
    for path in draw_all(results, PLOTS):
        print(f"wrote {path.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", choices=[*STUDIES, "report"])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each gets cpu_count / jobs threads)")
    parser.add_argument("--device", default="cpu",
                        help="cpu, or cuda: every run of these studies on the GPU (bfloat16 autocast, so a study's "
                             "rows are compared on one device only; each result records its device)")
    args = parser.parse_args()
    studies = [s for s in args.studies if s != "report"]
    run_studies(studies, args.jobs, args.device)
    report(Results().records)


if __name__ == "__main__":
    main()
