"""Per class: Recall@1, R-Precision and MAP@R of each class of a gallery for one checkpoint, or for two with their
difference, the most-confused pairs of classes, and the table as a CSV to download.

The figures are memvir.retrieval.diagnosis.per_class' over RetrievalService.rankings; this module names the columns and
writes the file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from demo.retrieve.galleries import Gallery

# memvir.retrieval.diagnosis.per_class metric -> column name.
COLUMNS = {"recall@1": "Recall@1", "r_precision": "R-Precision", "map@r": "MAP@R"}
CONFUSED_PAIRS = 15
# Two checkpoints' columns are headed by these letters on the page (the summary names them; their names are long),
# and by the checkpoints' names in the CSV.
LETTERS = ("A", "B")
DIGITS = 4
DIFFERENCE = "Δ"
DIFFERENCE_MEANS = "(A − B, points)"  # a difference column's header after its metric: which way, in what unit


def _class_names(gallery: Gallery, labels) -> list[str]:
    return [gallery.class_names[int(label)] for label in labels]


def table(gallery: Gallery, names: list[str], per_class: list, difference: dict | None) -> pd.DataFrame:
    """One row per class, the first checkpoint's worst MAP@R first: its queries, then each metric for each
    checkpoint (columns named after `names`) and, for two, first minus second in percentage points."""
    first = per_class[0]
    frame = {"class": _class_names(gallery, first.classes), "queries": first.queries.tolist()}
    for metric, column in COLUMNS.items():
        if len(per_class) == 1:
            frame[column] = first.values[metric].round(DIGITS)
            continue
        for name, one in zip(names, per_class, strict=True):
            frame[f"{column} {name}"] = one.values[metric].round(DIGITS)
        # first minus second in percentage points, as the Train tab's results table gives MemVir minus its baseline
        # (A is the page's MemVir checkpoint, B its baseline, unless the visitor picks otherwise)
        frame[f"{DIFFERENCE} {column} {DIFFERENCE_MEANS}"] = (-difference[metric] * 100).round(DIGITS - 2)
    worst_first = np.lexsort((np.arange(len(first.classes)), first.values["map@r"]))
    return pd.DataFrame(frame).iloc[worst_first].reset_index(drop=True)


def confusions_table(gallery: Gallery, pairs) -> pd.DataFrame:
    """The most-confused pairs: the two classes, the confusions among their queries' first R, and their rate."""
    return pd.DataFrame({"class": _class_names(gallery, [pair.first for pair in pairs]),
                         "confused with": _class_names(gallery, [pair.second for pair in pairs]),
                         "confusions": [pair.count for pair in pairs],
                         "rate": [round(pair.rate, DIGITS) for pair in pairs]},
                        columns=["class", "confused with", "confusions", "rate"])


def write_csv(frame: pd.DataFrame, downloads_dir: Path, keys: tuple[str, ...], name: str) -> Path:
    """The table as `<downloads>/tables/<digest of what it was computed from>/<name>.csv`: the same checkpoints and
    gallery rewrite the same file, so the folder holds one file per pair asked for."""
    digest = hashlib.sha256("\0".join(keys).encode()).hexdigest()[:24]
    path = downloads_dir / "tables" / digest / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    frame.to_csv(partial, index=False)
    partial.replace(path)
    return path
