"""`python -m memvir` end to end on glyphs-mini, and its error messages. The first command runs as a shell runs it,
the interpreter's start included; the others in processes forked with the imports done (tests/cli_process.py)."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from cli_process import run_memvir

from memvir.cli import train_config
from memvir.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def memvir_cli(*args, check=True, as_command=False):
    if as_command:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
        result = subprocess.run([sys.executable, "-m", "memvir", *map(str, args)], capture_output=True, text=True,
                                env=env, cwd=ROOT, timeout=600)
    else:
        result = run_memvir(*args)
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


@pytest.mark.slow
def test_train_resume_eval_and_index(tmp_path):
    run = tmp_path / "run"
    common = ["--dataset", "glyphs-mini", "--loss", "norm-softmax", "--memvir-n", "2", "--memvir-m", "1",
              "--warmup-epochs", "0.5", "--batch-size", "32", "--seed", "3", "--out", run]
    first = last_json(memvir_cli("train", *common, "--epochs", "1", as_command=True).stdout)
    assert first["step"] == 9 and 0 <= first["map@r"] <= 1
    for name in ("config.json", "model.safetensors", "README.md", "metrics.jsonl", "trainer_state.pt"):
        assert (run / name).is_file()
    card = (run / "README.md").read_text()
    assert "python -m memvir train" in card and "--memvir-n 2" in card

    again = memvir_cli("train", *common, "--epochs", "1", check=False)
    assert again.returncode == 2 and "add --resume" in again.stderr

    resumed = last_json(memvir_cli("train", "--out", run, "--resume", "--epochs", "2").stdout)
    assert resumed["step"] == 18

    metrics = last_json(memvir_cli("eval", run).stdout)
    assert metrics["dataset"] == "glyphs-mini" and metrics["items"] == 24 * 12
    assert metrics["map@r"] == pytest.approx(resumed["map@r"], abs=1e-6)

    index_dir = tmp_path / "index"
    indexed = last_json(memvir_cli("index", run, "--out", index_dir).stdout)
    assert indexed["items"] == 24 * 12 and (index_dir / "gallery.json").is_file()


def test_schedule_and_validation_flags_reach_the_run(tmp_path):
    run = tmp_path / "run"
    result = last_json(memvir_cli("train", "--dataset", "glyphs-mini", "--memvir-n", "2", "--memvir-m", "1",
                                  "--warmup-epochs", "0.5", "--memvir-schedule", "all-at-once", "--val-classes", "4",
                                  "--batch-size", "32", "--epochs", "1", "--out", run).stdout)
    assert 0 <= result["val_recall@1"] <= 1 and 0 <= result["recall@1"] <= 1
    config = json.loads((run / "train_config.json").read_text())
    assert config["memvir_schedule"] == "all-at-once" and config["val_classes"] == 4
    assert "all-at-once" in (run / "README.md").read_text()

    # The run again from its own folder, in one command: its settings exactly, with the one flag typed on top.
    stored = TrainConfig.from_json((run / "train_config.json").read_text())
    assert train_config(["train", "--config", str(run / "train_config.json"), "--out", "unused"]) == stored
    again = tmp_path / "again"
    memvir_cli("train", "--config", run / "train_config.json", "--max-steps", "2", "--out", again)
    assert TrainConfig.from_json((again / "train_config.json").read_text()) == replace(stored, max_steps=2)


@pytest.mark.parametrize(
    "args,message",
    [
        (["train", "--dataset", "glyphs-mini", "--memvir-schedule", "sudden", "--out", "{tmp}/x"],
         "memvir_schedule must be one of curriculum, all-at-once"),
        (["train", "--dataset", "glyphs-mini", "--val-classes", "30", "--out", "{tmp}/x"],
         "hold out between 2 and 22 (--val-classes)"),
        (["train", "--dataset", "glyphs-mini", "--memvir-n", "-1", "--out", "{tmp}/x"], "memvir_n must be"),
        (["train", "--dataset", "nope", "--out", "{tmp}/x"], "unknown dataset"),
        (["train", "--dataset", "glyphs-mini", "--loss", "hinge", "--out", "{tmp}/x"], "unknown loss"),
        (["train", "--dataset", "glyphs-mini", "--batch-size", "99999", "--out", "{tmp}/x"], "larger than"),
        (["train", "--dataset", "cub200", "--out", "{tmp}/x"], "data_root"),
        (["train", "--out", "{tmp}/none", "--resume"], "no checkpoint"),
        (["eval", "{tmp}/missing-model"], "missing-model"),
        (["push", "{tmp}", "--repo-id", "someone/x"], "config.json"),
    ],
)
def test_bad_input_gets_one_clear_line(tmp_path, args, message):
    result = memvir_cli(*[a.replace("{tmp}", str(tmp_path)) for a in args], check=False)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_ablation_flags_reach_the_run_config_and_the_model_card(tmp_path):
    run = tmp_path / "run"
    memvir_cli("train", "--dataset", "glyphs-mini", "--memvir-n", "1", "--memvir-m", "0", "--warmup-epochs", "0.5",
               "--memvir-reduction", "balanced", "--loss-scale-after-warmup", "0.5", "--adam-eps", "1e-8",
               "--freeze-bn", "--batch-size", "32", "--max-steps", "8", "--out", run)
    config = json.loads((run / "train_config.json").read_text())
    assert (config["memvir_reduction"], config["loss_scale_after_warmup"], config["adam_eps"], config["freeze_bn"]) \
        == ("balanced", 0.5, 1e-8, True)
    card = (run / "README.md").read_text()
    assert "balanced reduction" in card and "loss x0.5 after 4 warm-up steps" in card
    refused = memvir_cli("train", "--dataset", "glyphs-mini", "--memvir-reduction", "mean", "--out", tmp_path / "x",
                         check=False)
    assert refused.returncode == 2 and "invalid choice: 'mean'" in refused.stderr
