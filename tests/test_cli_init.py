"""`python -m memvir train --init FOLDER`: fine-tuning glyphs-few from the bundled pretrained backbone, offline, and
the refusals of folders it cannot start from. The references: the checkpoint file's tensors (read with safetensors)
and its test-set Recall@1 computed here by brute force in float64."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_process import run_memvir
from safetensors.torch import load_file

from memvir import TrainConfig, Trainer
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel

ROOT = Path(__file__).resolve().parents[1]
PRETRAINED = "checkpoints/glyphs-pretrain-convnet"


def brute_force_recall_at_1(embeddings: np.ndarray, labels: np.ndarray) -> float:
    """Each item's nearest other item by cosine in float64; the share whose neighbour has its label."""
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    return float(np.mean(labels[similarity.argmax(axis=1)] == labels))


def test_the_bundled_backbone_is_what_a_glyphs_few_run_starts_from():
    tensors = load_file(str(ROOT / PRETRAINED / "model.safetensors"))
    trainer = Trainer(TrainConfig(dataset="glyphs-few", init_from=str(ROOT / PRETRAINED), memvir_n=0, max_steps=1,
                                  eval_at_start=False, snapshot_every=0))
    state = trainer.model.state_dict()
    assert set(state) == set(tensors)
    for name, tensor in tensors.items():  # backbone and head: the run's embedding is the checkpoint's 128-d
        assert torch.equal(state[name], tensor), name
    assert trainer.class_weights.shape == (116, 128)


@pytest.mark.slow
def test_fine_tuning_glyphs_few_from_the_bundled_backbone_runs_offline(tmp_path):
    out = tmp_path / "run"
    result = run_memvir("train", "--dataset", "glyphs-few", "--init", PRETRAINED, "--memvir-n", "0", "--max-steps",
                        "2", "--batch-size", "32", "--val-classes", "29", "--val-fold", "3", "--eval-every", "0",
                        "--out", out, env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert f"initialised the backbone and embedding head from {PRETRAINED}; new class weights" in result.stderr
    assert json.loads((out / "train_config.json").read_text())["init_from"] == PRETRAINED
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r.get("type") == "eval" and r["step"] == 0)
    # the untrained run's test Recall@1 is the pretrained checkpoint's own on glyphs-few's test classes
    model = EmbeddingModel.from_pretrained(ROOT / PRETRAINED)
    test = load_dataset("glyphs-few").test
    images = torch.stack([test[i][0] for i in range(len(test))])
    embeddings = model.embed(images).double().numpy()
    expected = brute_force_recall_at_1(embeddings, test.labels)
    assert start["recall@1"] == pytest.approx(expected, abs=2 / len(test))  # a near tie may fall either way
    assert "val_recall@1" in start and json.loads(result.stdout.strip().splitlines()[-1])["step"] == 2


@pytest.mark.parametrize(("flags", "message"), [
    (["--init", "no/such/folder"], "--init no/such/folder: there is no such folder; pass a checkpoint folder "
                                   "(config.json + model.safetensors), such as checkpoints/glyphs-pretrain-convnet"),
    (["--init", "docs"], "--init docs is not a checkpoint: config.json and model.safetensors missing"),
    (["--init", PRETRAINED, "--backbone", "resnet18"],
     f"--init {PRETRAINED} holds a 'convnet' backbone, but this run builds 'resnet18': pass --backbone convnet"),
    (["--init", PRETRAINED, "--pretrained"], "both choose the starting weights; pass one of them"),
])
def test_folders_it_cannot_start_from_are_refused_in_one_line(tmp_path, flags, message):
    out = tmp_path / "run"
    result = run_memvir("train", "--dataset", "glyphs-few", "--max-steps", "1", *flags, "--out", out)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr and not out.exists()


def test_a_resume_may_not_change_where_the_run_started(tmp_path):
    out = tmp_path / "run"
    first = run_memvir("train", "--dataset", "glyphs-mini", "--init", PRETRAINED, "--memvir-n", "0", "--max-steps",
                       "1", "--epochs", "2", "--batch-size", "32", "--eval-every", "0", "--out", out)
    assert first.returncode == 0, first.stderr
    again = run_memvir("train", "--out", out, "--resume", "--init", "checkpoints/glyphs-norm-softmax-memvir")
    assert again.returncode == 2 and "--init cannot change when resuming" in again.stderr
    resumed = run_memvir("train", "--out", out, "--resume", "--max-steps", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "initialised" not in resumed.stderr  # the run's own weights, not the init's
