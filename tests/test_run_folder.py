"""RunFolder (memvir.checkpoint) reading files written here by hand: a records file with a line cut off by a crash, a
config (through TrainConfig.from_run_folder), markers."""

import json

import pytest

from memvir.checkpoint import CheckpointError, RunFolder
from memvir.config import TrainConfig


def test_records_skip_a_cut_line_and_give_the_state_and_final_metrics(tmp_path):
    lines = [{"type": "status", "state": "running", "step": 0},
             {"type": "eval", "step": 10, "epoch": 1, "recall@1": 0.5, "val_map@r": 0.25},
             {"type": "step", "step": 20, "loss": 1.5},
             {"type": "eval", "step": 20, "epoch": 2, "recall@1": 0.75, "val_map@r": 0.5},
             {"type": "status", "state": "finished", "step": 20}]
    text = "".join(json.dumps(r) + "\n" for r in lines[:3]) + '{"type": "eval", "ste\n' + "".join(
        json.dumps(r) + "\n" for r in lines[3:])
    (tmp_path / "metrics.jsonl").write_text(text)
    run = RunFolder(tmp_path)
    assert run.records() == lines
    assert run.status() == "finished" and run.is_finished()
    assert run.final_metrics() == {"recall@1": 0.75, "val_map@r": 0.5}


def test_a_folder_without_records_is_no_run_and_has_no_state(tmp_path):
    run = RunFolder(tmp_path / "nothing")
    assert run.records() == [] and run.status() is None and not run.is_finished() and run.final_metrics() == {}
    assert not run.is_run() and not run.has_model() and not run.has_state()


def test_config_round_trips_and_a_damaged_one_is_a_checkpoint_error(tmp_path):
    config = TrainConfig(dataset="glyphs-mini", memvir_n=3, memvir_reduction="balanced")
    (tmp_path / "train_config.json").write_text(config.to_json())
    run = RunFolder(tmp_path)
    assert run.is_run() and TrainConfig.from_run_folder(tmp_path) == config
    assert run.config_dict() == json.loads(config.to_json())
    (tmp_path / "train_config.json").write_text('{"memvir_n": -1}')
    with pytest.raises(CheckpointError, match="holds no readable run config"):
        TrainConfig.from_run_folder(tmp_path)
    (tmp_path / "train_config.json").write_text('{"memvir_n": 3, "lo')
    with pytest.raises(CheckpointError, match="holds no readable run config"):
        run.config_dict()
    (tmp_path / "train_config.json").unlink()
    with pytest.raises(CheckpointError, match="train_config.json holds no readable run config"):
        TrainConfig.from_run_folder(tmp_path)
