"""RunFolder: what `memvir train --out DIR` leaves in DIR, read back by the app, the CLI and the benchmarks.

A run folder holds the model's Hub files (config.json, model.safetensors, README.md), the run's config
(train_config.json), its records (metrics.jsonl: one JSON object per logged step, evaluation, live change or status)
and the trainer state a resume needs (trainer_state.pt). The file names live in memvir.checkpoint, which writes
them; this class reads them, tolerantly: a records line cut off by a crash is skipped, not fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memvir.checkpoint import METRICS_LOG, MODEL_FILES, RUN_MARKERS, TRAIN_CONFIG, TRAINER_STATE, CheckpointError


@dataclass(frozen=True)
class RunFolder:
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def records_file(self) -> Path:
        return self.path / METRICS_LOG

    @property
    def state_file(self) -> Path:
        return self.path / TRAINER_STATE

    def is_run(self) -> bool:
        """Whether `memvir train` wrote here (a file only it writes is present)."""
        return any((self.path / marker).exists() for marker in RUN_MARKERS)

    def has_model(self) -> bool:
        """Whether the folder holds a model that loads (config.json and model.safetensors)."""
        return all((self.path / name).is_file() for name in MODEL_FILES)

    def config(self):
        """The run's TrainConfig, from train_config.json; CheckpointError when it is missing or unreadable."""
        from memvir.config import TrainConfig

        path = self.path / TRAIN_CONFIG
        try:
            return TrainConfig.from_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError) as error:
            raise CheckpointError(f"{path} holds no readable run config ({error})") from error

    def records(self) -> list[dict]:
        """The records of metrics.jsonl, oldest first; none when it is missing. A line a crash cut off is skipped."""
        if not self.records_file.is_file():
            return []
        records = []
        for line in self.records_file.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def state(self) -> str | None:
        """The run's last status ('running', 'stopped', 'finished', 'failed'...), None before any."""
        statuses = [r for r in self.records() if r.get("type") == "status"]
        return statuses[-1].get("state") if statuses else None

    def is_finished(self) -> bool:
        return self.state() == "finished"

    def final_metrics(self) -> dict:
        """The metrics of the run's last evaluation (test, and val_* where validation classes were held out)."""
        evaluations = [r for r in self.records() if r.get("type") == "eval"]
        if not evaluations:
            return {}
        return {k: v for k, v in evaluations[-1].items() if k not in ("type", "step", "epoch")}
