"""The paper's claims measured on the embedded glyphs: each configuration trained with several seeds by the CLI.

    .venv/bin/python bench/reproduce.py grid schedule budget batch --jobs 2   # runs, then writes tables and plots
    .venv/bin/python bench/reproduce.py report                                # only the tables and plots

Every run is `python -m memvir train ...` (the command is stored with its result), so a GPU user can rerun any row
at full scale on CUB200, CARS196 or SOP by changing --dataset/--data-root/--backbone. Finished runs are kept in
runs/reproduction/ and skipped when a study is run again; their final metrics and their evaluation curves are
collected in docs/reproduction/results.json, from which `report` draws docs/reproduction/*.png and prints the tables
that docs/reproduction.md presents.

Choices are made on validation classes only: every study after "losses" holds out 100 of the 1,021 training
classes (`--val-classes 100`), and the "budget" study takes its MemVir setting from the grid's best mean validation
MAP@R. Test metrics are reported, never used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
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
    """One configuration of a study; N = 0 is the baseline."""

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
        return args

    def folder(self, study: str, seed: int) -> Path:
        name = f"{study}-{self.loss}-n{self.n}-m{self.m}-u{self.warmup:g}-b{self.batch}-e{self.epochs}"
        if self.schedule != "curriculum":
            name += f"-{self.schedule}"
        if study == "losses":  # the first slice's folders, named before batch size became a study
            name = f"{study}-{self.loss}-n{self.n}-m{self.m}-u{self.warmup:g}-e{self.epochs}"
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
    raise ValueError(study)


STUDIES = ("losses", "grid", "schedule", "batch", "budget", "long", "few-classes")
# A study whose runs extend another's: each starts from the other's checkpoint with --resume, which continues a run
# exactly as if it had never stopped (tests/test_train.py), so the result is that of the stored plain command.
CONTINUES = {"long": "budget"}
# Rows another study already ran with the same command: the grid's baseline and MemVir(2, 50) at batch 128 are the
# schedule study's step pacing and the batch study's batch 128.
SHARED = {("schedule", "step pacing (the paper's)"): ("grid", memvir_label(2, 50)),
          ("batch", "baseline, batch 128"): ("grid", "baseline"),
          ("batch", "MemVir(2, 50), batch 128"): ("grid", memvir_label(2, 50))}


CURVE = ("step", "recall@1", "map@r", "val_recall@1", "val_map@r")


def read_run(run: Path) -> dict:
    """The final evaluation's metrics, the curve of every evaluation (CURVE's columns; None where a run has no
    validation classes) and the class count s(i) of the logged steps."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["type"] == "eval"]
    last = evals[-1]
    final = {k: v for k, v in last.items() if k.removeprefix("val_") in METRICS}
    curve = {column: [r.get(column) for r in evals] for column in CURVE}
    classes = [[r["step"], r["num_classes"]] for r in records if r["type"] == "step"]
    return final | {"step": last["step"], "curve": curve, "classes": classes}


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
            if not isinstance(record.get("curve"), dict) and (run / "metrics.jsonl").is_file():
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
    if (source / "trainer_state.pt").is_file():
        shutil.copytree(source, out)


def run_one(study: str, row: Row, seed: int, results: Results, threads: int) -> None:
    out = row.folder(study, seed)
    continue_from(study, row, seed, out, results.records)
    args = row.args(seed) + ["--out", str(out)]
    resume = ["--resume"] if (out / "trainer_state.pt").exists() else []
    print(f"[{study}] {row.label}, seed {seed}: python {' '.join(args)}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, *args, *resume], cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
    command = "python " + " ".join(args).replace(str(ROOT) + "/", "")
    results.add({"study": study, "label": row.label, "seed": seed, "epochs": row.epochs, "batch": row.batch,
                 "command": command, **read_run(out)})


def run_studies(studies: list[str], jobs: int) -> None:
    results = Results()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    for study in studies:
        todo = [(row, seed) for row in study_rows(study, results.records) for seed in SEEDS
                if not results.has(study, row.label, seed) and (study, row.label) not in SHARED]
        with ThreadPoolExecutor(jobs) as pool:
            for future in [pool.submit(run_one, study, row, seed, results, threads) for row, seed in todo]:
                future.result()


def rows_of(results: list[dict], study: str, label: str) -> list[dict]:
    study, label = SHARED.get((study, label), (study, label))
    return [r for r in results if r["study"] == study and r["label"] == label]


def summary(group: list[dict], key: str) -> tuple[float, float]:
    values = [100 * r[key] for r in group]
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def table(results: list[dict], study: str) -> str:
    with_val = study != "losses"
    keys = [*METRICS] + ([CHOICE_METRIC] if with_val else [])
    rows = ["| configuration | batch | epochs | seeds | " + " | ".join(k.replace("val_", "validation ") for k in keys)
            + " |", "|---|---:|---:|---:|" + "---:|" * len(keys)]
    for row in study_rows(study, results):
        group = rows_of(results, study, row.label)
        if not group:
            continue
        cells = ["{:.2f} ± {:.2f}".format(*summary(group, key)) for key in keys]
        rows.append(f"| {row.label} | {row.batch} | {row.epochs} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report(results: list[dict]) -> None:
    from reproduction_plots import draw_all  # matplotlib, a development requirement; runs need none

    for study in STUDIES:
        if any(r["study"] == study for r in results):
            print(f"\n## {study}\n\n{table(results, study)}")
    if chosen_on_validation(results):
        print("\nchosen on validation for the budget study: N={}, M={}".format(*chosen_on_validation(results)))
    for path in draw_all(results, PLOTS):
        print(f"wrote {path.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", choices=[*STUDIES, "report"])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each gets cpu_count / jobs threads)")
    args = parser.parse_args()
    studies = [s for s in args.studies if s != "report"]
    run_studies(studies, args.jobs)
    report(Results().records)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
