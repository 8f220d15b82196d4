"""`python -m memvir` against broken run folders, absurd flags, a full disk and careless resumes, each in a process of
its own (tests/cli_process.py): each case ends with one `error: ...` line that names the problem and exit status 2,
never a traceback, and leaves the run folder as it was."""

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from cli_process import file_size_limit, run_memvir

from memvir.models.embedding_model import EmbeddingModel

BASE_FLAGS = ["--dataset", "glyphs-mini", "--batch-size", "32", "--memvir-n", "1", "--memvir-m", "1",
              "--warmup-epochs", "0.5", "--lr", "0.002", "--seed", "3"]
"""The base run's settings: N, M, warm-up and lr differ from the CLI's defaults, so a default taken for a request
would show."""




def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def one_error_line(result, *needles):
    """Exit status 2, no traceback, and exactly one `error:` line holding every needle; that line."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def digest(folder: Path) -> dict:
    """Every file of `folder` (hidden ones included) and the hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("base") / "run"
    ok(run_memvir("train", *BASE_FLAGS, "--max-steps", "2", "--out", run))
    return run


@pytest.fixture
def run(base_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(base_run, copy)
    return copy


# ------------------------------------------------------------------------------------------------ damaged run folders
@pytest.mark.parametrize(
    "command,damage",
    [
        ("eval", lambda data: data[: len(data) // 3]),
        ("eval", lambda data: os.urandom(len(data))),
        ("eval", lambda data: struct.pack("<Q", 2**62) + data[8:]),
        ("index", lambda data: data[: len(data) // 3]),
    ],
    ids=["eval-truncated", "eval-random", "eval-2**62-header", "index-truncated"],
)
def test_a_damaged_weights_file_is_one_error_line(run, tmp_path, command, damage):
    weights = run / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    extra = ["--out", tmp_path / "index"] if command == "index" else []
    one_error_line(run_memvir(command, run, *extra), "model.safetensors", "truncated or damaged")


def test_a_config_json_with_a_huge_embedding_dim_is_refused_before_allocating(run):
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "embedding_dim": 10**9}))
    one_error_line(run_memvir("eval", run), "embedding_dim must be at most 65,536")


def test_a_trainer_state_without_its_parts_is_refused_on_resume(run):
    torch.save({"format": 1}, run / "trainer_state.pt")
    before = digest(run)
    one_error_line(run_memvir("train", "--out", run, "--resume"), "trainer_state.pt lacks config", "new folder")
    assert digest(run) == before


def test_a_trainer_state_with_a_wrong_shaped_tensor_is_refused_on_resume(run):
    state = torch.load(run / "trainer_state.pt", weights_only=True)
    state["class_weights"] = torch.zeros(3, 3)
    torch.save(state, run / "trainer_state.pt")
    one_error_line(run_memvir("train", "--out", run, "--resume"), "trainer_state.pt does not fit the run",
                   "must match")
    ok(run_memvir("eval", run))  # the model files beside it still load, as the message says


# ------------------------------------------------------------------------------------------------ absurd flags
@pytest.mark.parametrize(
    "flags,message",
    [
        (["--embedding-dim", "1000000000"], "embedding_dim must be at most 65,536"),
        (["--warmup-epochs", "inf"], "warmup_epochs must be a number from 0 to 1,000,000"),
        (["--warmup-epochs", "1e308"], "warmup_epochs must be a number from 0 to 1,000,000"),
        (["--epochs", "0"], "epochs must be an integer >= 1, got 0"),
        (["--memvir-n", "1000000", "--memvir-m", "1000000"], "over the memory limit of 16.0 GiB"),
        (["--seed", str(2**70)], "seed must be at most"),
    ],
)
def test_absurd_train_flags_are_one_error_line(tmp_path, flags, message):
    out = tmp_path / "run"
    one_error_line(run_memvir("train", "--dataset", "glyphs-mini", "--batch-size", "32", *flags, "--out", out),
                   message)
    assert not (out / "trainer_state.pt").exists()


def test_the_memory_limit_follows_the_environment_variable(tmp_path):
    result = run_memvir("train", "--dataset", "glyphs-mini", "--batch-size", "32", "--out", tmp_path / "run",
                        env={"MEMVIR_MAX_MEMORY_BYTES": "1000000"})
    one_error_line(result, "N=2, M=50", "limit of 976.6 KiB (1,000,000 bytes)", "MEMVIR_MAX_MEMORY_BYTES")


def test_a_non_integer_batch_size_is_refused_by_the_parser(tmp_path):
    result = run_memvir("train", "--batch-size", "1.5", "--out", tmp_path / "run")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "argument --batch-size: invalid int value: '1.5'" in result.stderr


def test_pretrained_weights_offline_are_one_error_line(tmp_path):
    unreachable = "http://127.0.0.1:9"  # nothing listens there: the download fails at once, without any network
    env = {"TORCH_HOME": str(tmp_path / "torch-home"), "https_proxy": unreachable, "HTTPS_PROXY": unreachable,
           "no_proxy": "", "NO_PROXY": ""}
    result = run_memvir("train", "--dataset", "glyphs-mini", "--backbone", "resnet18", "--pretrained",
                        "--out", tmp_path / "run", env=env)
    one_error_line(result, "ImageNet weights resnet18-", "not in the torch hub cache")


# ------------------------------------------------------------------------------------------------ a full disk
@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_says_so_and_keeps_the_previous_one(run):
    sizes = {name: (run / name).stat().st_size for name in ("model.safetensors", "trainer_state.pt")}
    limit = (sizes["model.safetensors"] + sizes["trainer_state.pt"]) // 2  # the weights fit, the trainer state not
    assert sizes["model.safetensors"] < limit < sizes["trainer_state.pt"]
    hub_files = {name: (run / name).read_bytes() for name in ("config.json", "model.safetensors", "README.md",
                                                              "trainer_state.pt")}
    result = run_memvir("train", "--out", run, "--resume", "--max-steps", "3", before=file_size_limit(limit))
    one_error_line(result, "the disk is full, or a quota or file size limit was reached", "File too large",
                   f"the previous checkpoint in {run} is intact")
    assert {name: (run / name).read_bytes() for name in hub_files} == hub_files
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    EmbeddingModel.from_pretrained(run)
    assert ok(run_memvir("train", "--out", run, "--resume", "--max-steps", "3"))["step"] == 3


# ------------------------------------------------------------------------------------------------ resume
def stored_config(run: Path) -> dict:
    return torch.load(run / "trainer_state.pt", weights_only=True)["config"]


def test_resume_refuses_flags_that_would_change_the_run(run):
    before = digest(run)
    result = run_memvir("train", "--out", run, "--resume", "--dataset", "glyphs", "--loss", "cosface",
                        "--batch-size", "16", "--embedding-dim", "64", "--memvir-n", "3")
    line = one_error_line(result, "--batch-size, --dataset, --embedding-dim, --loss cannot change when resuming",
                          "batch_size 32 -> 16", "new --out", "A resume may change")
    assert "--memvir-n cannot" not in line and "--memvir-n," in line  # N may change: listed among what may
    assert digest(run) == before


@pytest.mark.slow
def test_resume_applies_what_may_change_and_says_so(run):
    result = run_memvir("train", "--out", run, "--resume", "--memvir-n", "2", "--memvir-m", "0", "--warmup-epochs",
                        "0", "--class-lr", "0.02", "--max-steps", "3", "--batch-size", "32", "--dataset", "glyphs-mini")
    assert ok(result)["step"] == 3
    assert "resuming" in result.stderr and "at step 2; applied" in result.stderr
    for change in ("--memvir-n 1 -> 2", "--memvir-m 1 -> 0", "--warmup-epochs 0.5 -> 0.0", "--class-lr 0.01 -> 0.02",
                   "--max-steps 2 -> 3"):
        assert change in result.stderr
    assert "--batch-size" not in result.stderr and "--dataset" not in result.stderr  # restated, unchanged
    config = stored_config(run)
    assert (config["memvir_n"], config["memvir_m"], config["warmup_epochs"], config["class_lr"]) == (2, 0, 0.0, 0.02)
    controls = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"control"' in line]
    assert controls and controls[0]["step"] == 2 and controls[0]["memvir_n"] == 2


@pytest.mark.slow
def test_resume_takes_untyped_flags_for_no_request(run):
    result = run_memvir("train", "--out", run, "--resume", "--max-steps", "3")
    assert ok(result)["step"] == 3
    assert "applied --max-steps 2 -> 3" in result.stderr and "--memvir-n" not in result.stderr
    config = stored_config(run)
    assert (config["memvir_n"], config["memvir_m"], config["warmup_epochs"], config["lr"]) == (1, 1, 0.5, 0.002)


def test_resume_refuses_zero_epochs(run):
    one_error_line(run_memvir("train", "--out", run, "--resume", "--epochs", "0"), "epochs must be an integer >= 1")


@pytest.mark.slow
def test_resume_removes_what_a_killed_writer_left(run):
    stale_file = run / ".trainer_state.pt.k1ll3d.tmp"
    stale_file.write_bytes(os.urandom(5_000_000))
    stale_stage = run / ".checkpoint.k1ll3d.tmp"
    stale_stage.mkdir()
    (stale_stage / "model.safetensors").write_bytes(b"half")
    users = run / ".notes.tmp"  # not a temporary of ours
    users.write_text("keep me")
    ok(run_memvir("train", "--out", run, "--resume", "--max-steps", "3"))
    assert not stale_file.exists() and not stale_stage.exists() and users.read_text() == "keep me"


# ------------------------------------------------------------------------------------------------ --out
@pytest.mark.slow
def test_a_non_empty_folder_that_is_not_a_run_is_refused_unless_overwrite(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "README.md").write_text("my notes")
    (folder / "config.json").write_text('{"mine": true}')
    before = digest(folder)
    one_error_line(run_memvir("train", *BASE_FLAGS, "--max-steps", "1", "--out", folder),
                   "is not empty (README.md, config.json)", "not a run folder", "--overwrite")
    assert digest(folder) == before
    ok(run_memvir("train", *BASE_FLAGS, "--max-steps", "1", "--out", folder, "--overwrite"))
    assert (folder / "trainer_state.pt").is_file()
    EmbeddingModel.from_pretrained(folder)


def test_out_may_not_be_a_file_or_a_run(run, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    one_error_line(run_memvir("train", *BASE_FLAGS, "--out", a_file), "is a file, not a folder")
    one_error_line(run_memvir("train", *BASE_FLAGS, "--out", run, "--overwrite"), "already holds a run",
                   "add --resume")
