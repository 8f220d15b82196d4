"""The paper's claims measured on the embedded glyphs: each configuration trained with several seeds by the CLI.

    .venv/bin/python bench/reproduce.py losses [--seeds 0 1 2 --epochs 8]   # runs, then prints the table
    .venv/bin/python bench/reproduce.py table                              # only prints the table

Every run is `python -m memvir train ...` (the command is stored with its result), so a GPU user can rerun any row
at full scale on CUB200, CARS196 or SOP by changing --dataset/--data-root/--backbone. Finished runs are kept in
runs/reproduction/ and skipped when the study is run again; their final test metrics are collected in
docs/reproduction/results.json; docs/reproduction.md presents them. No choice is made on these numbers.
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "reproduction" / "results.json"
RUNS = ROOT / "runs" / "reproduction"

# study -> list of (label, loss, N, M, warm-up epochs); N = 0 is the baseline
STUDIES = {
    "losses": [
        ("Norm-softmax", "norm-softmax", 0, 0, 0),
        ("Norm-softmax + MemVir(2, 50)", "norm-softmax", 2, 50, 2),
        ("Proxy-NCA", "proxy-nca", 0, 0, 0),
        ("Proxy-NCA + MemVir(2, 50)", "proxy-nca", 2, 50, 2),
    ],
}
METRICS = ("recall@1", "r_precision", "map@r")


def command(loss, n, m, warmup, seed, epochs, out) -> list[str]:
    return ["-m", "memvir", "train", "--dataset", "glyphs", "--loss", loss, "--memvir-n", str(n), "--memvir-m",
            str(m), "--warmup-epochs", str(warmup), "--epochs", str(epochs), "--batch-size", "128", "--seed",
            str(seed), "--out", str(out)]


def final_metrics(run: Path) -> dict:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r["type"] == "eval"][-1]
    return {k: last[k] for k in METRICS} | {"step": last["step"]}


def run_study(name: str, seeds: list[int], epochs: int) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    done = {(r["study"], r["label"], r["seed"], r["epochs"]) for r in results}
    for label, loss, n, m, warmup in STUDIES[name]:
        for seed in seeds:
            if (name, label, seed, epochs) in done:
                continue
            out = RUNS / f"{name}-{loss}-n{n}-m{m}-u{warmup}-e{epochs}-s{seed}"
            args = command(loss, n, m, warmup, seed, epochs, out)
            print(f"{label}, seed {seed}: python {' '.join(args)}", flush=True)
            subprocess.run([sys.executable, *args, "--resume"] if (out / "trainer_state.pt").exists()
                           else [sys.executable, *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            results.append({"study": name, "label": label, "seed": seed, "epochs": epochs,
                            "command": "python " + " ".join(str(a) for a in args).replace(str(ROOT) + "/", ""),
                            **final_metrics(out)})
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(results, indent=1))


def table(results: list[dict], study: str) -> str:
    rows = ["| configuration | epochs | seeds | " + " | ".join(METRICS) + " |",
            "|---|---:|---:|" + "---:|" * len(METRICS)]
    labels = [label for label, *_ in STUDIES[study]]
    for label in labels:
        for epochs in sorted({r["epochs"] for r in results if r["study"] == study and r["label"] == label}):
            group = [r for r in results if r["study"] == study and r["label"] == label and r["epochs"] == epochs]
            cells = []
            for key in METRICS:
                values = [100 * r[key] for r in group]
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"{statistics.mean(values):.2f} ± {spread:.2f}")
            rows.append(f"| {label} | {epochs} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=[*STUDIES, "table"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    if args.study != "table":
        run_study(args.study, args.seeds, args.epochs)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    print(table(results, "losses"))


if __name__ == "__main__":
    main()
