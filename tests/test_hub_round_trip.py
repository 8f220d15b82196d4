"""The Hub round trip as a user makes it, over HTTP against a Hub on 127.0.0.1 (tests/hub_server.py): train a small
run with `python -m memvir train`, `python -m memvir push` it, then `memvir.hub.pull` it on another "machine" (a
cache of its own), `EmbeddingModel.from_pretrained(repo_id)` with bit-identical weights, the model card read back
from the Hub with the run's metrics, and `python -m memvir eval repo_id`."""

import subprocess
import sys

import pytest
import torch
from hub_server import USER, WRITE_TOKEN, client_environment, point_client_at
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from test_cli import ROOT, last_json, memvir_cli

from memvir.hub import pull
from memvir.models.embedding_model import EmbeddingModel

REPO = f"{USER}/memvir-glyphs-mini"
HUB_FILES = ("README.md", "config.json", "model.safetensors")


def _memvir_online(env, *args) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "memvir", *map(str, args)], capture_output=True, text=True,
                            cwd=ROOT, timeout=600, env={**env, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr}"
    return result


@pytest.mark.slow
def test_train_push_pull_load_and_eval_by_repo_id(loopback_hub, tmp_path, monkeypatch):
    hub, run = loopback_hub, tmp_path / "run"
    trained = last_json(memvir_cli("train", "--dataset", "glyphs-mini", "--memvir-n", "1", "--memvir-m", "1",
                                   "--warmup-epochs", "0.5", "--batch-size", "32", "--epochs", "1", "--seed", "0",
                                   "--out", run).stdout)

    # push, as a user with a token in HF_TOKEN
    pushed = _memvir_online(client_environment(hub.url, tmp_path / "user", token=WRITE_TOKEN),
                            "push", run, "--repo-id", REPO)
    assert pushed.stdout.strip().splitlines()[-1] == f"{hub.url}/{REPO}"
    on_the_hub = hub.files_at(REPO)
    assert sorted(on_the_hub) == [".gitattributes", "README.md", "config.json", "metrics.jsonl", "model.safetensors"]
    assert all(on_the_hub[name] == (run / name).read_bytes() for name in (*HUB_FILES, "metrics.jsonl"))
    assert hub.repos[REPO].resolve("main").files["model.safetensors"].lfs_sha256  # through LFS
    assert "/api/agent-harnesses" not in hub.paths_requested()

    # pull it on a machine that has never seen it
    point_client_at(monkeypatch, hub.url, tmp_path / "elsewhere")
    folder = pull(REPO)
    assert all((folder / name).read_bytes() == (run / name).read_bytes() for name in HUB_FILES)
    model = EmbeddingModel.from_pretrained(REPO)
    saved, loaded = load_file(run / "model.safetensors"), model.state_dict()
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[key], saved[key]) for key in saved)

    # the card, as the Hub serves it, carries the run's final metrics
    card = ModelCard.load(REPO, ignore_metadata_errors=False)
    assert card.data.library_name == "memvir" and card.data.datasets == ["glyphs-mini"]
    measured = {result.metric_type: result.metric_value for result in card.data.eval_results}
    assert set(measured) == {"recall@1", "recall@2", "recall@4", "recall@8", "precision@1", "r_precision", "map@r"}
    assert measured == {name: trained[name] for name in measured}

    # and the CLI evaluates the model by its repo id, with the metrics the run ended on
    evaluated = last_json(_memvir_online(client_environment(hub.url, tmp_path / "third"), "eval", REPO).stdout)
    assert evaluated["dataset"] == "glyphs-mini"
    assert all(abs(evaluated[name] - trained[name]) < 1e-6 for name in measured), (evaluated, trained)
