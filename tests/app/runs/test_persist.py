"""Runs that outlive the container (demo.runs.persist): a folder stands in for a Space's mounted Storage Bucket. A
resting run's files are copied there, marker last; a new server on an empty local disk restores and lists them (a
stopped run resumable, a finished one searchable); a copy that broke off is ignored."""

import json
import shutil

import pytest

from demo.common.settings import AppSettings
from demo.retrieve.service import RetrievalService
from demo.runs import persist
from demo.runs.live_run import LiveRun
from demo.runs.manager import RunManager
from memvir.config import TrainConfig
from memvir.events import StatusEvent, StepEvent

KEPT = ["README.md", "config.json", "metrics.jsonl", "model.safetensors", "train_config.json", "trainer_state.pt"]


def _settings(tmp_path, server: str) -> AppSettings:
    return AppSettings(data_dir=tmp_path / server, checkpoints_dir=tmp_path / "no-checkpoints", umap=False,
                       persist_dir=tmp_path / "bucket")


def _run_folder(tiny_checkpoints, runs_dir, name, last_state):
    folder = runs_dir / name
    shutil.copytree(tiny_checkpoints / "glyphs-mini-tiny", folder)
    with (folder / "metrics.jsonl").open("a") as log:
        log.write(json.dumps(StatusEvent(last_state, 5, "").record()) + "\n")
    return folder


def _rest(runs: RunManager, folder, state: str) -> None:
    """What the run's process tells the server as it ends: its last step, then its state."""
    config = TrainConfig.from_json((folder / "train_config.json").read_text())
    run = LiveRun(folder.name, "alice", folder, config)
    listen = runs.keeper.listener(run)
    listen(StepEvent(step=5, epoch=0, loss=1.0, num_classes=24, num_virtual_sets=0, mean_target_cosine=0.1,
                     images_per_s=1.0, lr=1e-3, warmup=True))
    assert not (runs.settings.persist_dir / "runs" / folder.name).exists()  # nothing while it trains
    listen(StatusEvent(state, 5, ""))
    for thread in runs.keeper.copying:
        thread.join(30)


def test_resting_runs_are_kept_and_a_new_server_lists_them(tiny_checkpoints, tmp_path):
    first = _settings(tmp_path, "server-1")
    runs = RunManager(first)
    finished = _run_folder(tiny_checkpoints, first.runs_dir, "20261206-finished", "finished")
    stopped = _run_folder(tiny_checkpoints, first.runs_dir, "20261206-stopped", "stopped")
    _rest(runs, finished, "finished")
    _rest(runs, stopped, "stopped")
    runs.close()
    for folder in (finished, stopped):
        copy = first.persist_dir / "runs" / folder.name
        assert sorted(p.name for p in copy.iterdir() if p.name != persist.COMPLETE) == KEPT
        assert persist.complete(copy)
        assert (copy / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()

    # the container restarted: a new server, an empty local disk, the same bucket
    second = _settings(tmp_path, "server-2")
    runs = RunManager(second)
    try:
        assert sorted(p.name for p in second.runs_dir.iterdir()) == ["20261206-finished", "20261206-stopped"]
        listed = runs.runs()  # the run the restart cut off, resumable by any visitor as before
        assert [(run.id, run.state, run.owner) for run in listed] == [("20261206-stopped", "stopped", None)]
        assert listed[0].can_resume
        choices = [label for label, _ in RetrievalService(second).checkpoint_choices()]
        assert "run: 20261206-finished" in choices and "run: 20261206-stopped" in choices
    finally:
        runs.close()


def test_a_copy_that_broke_off_is_not_restored(tiny_checkpoints, tmp_path, caplog):
    first = _settings(tmp_path, "server-1")
    folder = _run_folder(tiny_checkpoints, first.runs_dir, "20261206-whole", "finished")
    copy = persist.save(folder, first.persist_dir)
    half = persist.save(_run_folder(tiny_checkpoints, first.runs_dir, "20261206-half", "finished"),
                        first.persist_dir)
    (half / "model.safetensors").write_bytes(b"cut")  # the copy of the weights broke off
    unmarked = first.persist_dir / "runs" / "20261206-unmarked"
    shutil.copytree(folder, unmarked)  # every file, but the marker was never written
    assert persist.complete(copy) and not persist.complete(half) and not persist.complete(unmarked)
    second = _settings(tmp_path, "server-2")
    second.runs_dir.mkdir(parents=True)
    with caplog.at_level("WARNING"):
        restored = persist.restore(second.persist_dir, second.runs_dir)
    assert [p.name for p in restored] == ["20261206-whole"]
    assert sorted(p.name for p in second.runs_dir.iterdir()) == ["20261206-whole"]  # no staging folder left
    assert "20261206-half is incomplete" in caplog.text and "20261206-unmarked is incomplete" in caplog.text
    # a local run of the same name is never overwritten
    (second.runs_dir / "20261206-whole" / "README.md").write_text("mine")
    assert persist.restore(second.persist_dir, second.runs_dir) == []
    assert (second.runs_dir / "20261206-whole" / "README.md").read_text() == "mine"


@pytest.mark.parametrize("state", ["running", "paused"])
def test_a_run_that_still_trains_is_not_copied(tiny_checkpoints, tmp_path, state):
    settings = _settings(tmp_path, "server")
    runs = RunManager(settings)
    try:
        folder = _run_folder(tiny_checkpoints, settings.runs_dir, "20261206-live", "running")
        run = LiveRun(folder.name, "alice", folder, TrainConfig.from_json((folder / "train_config.json").read_text()))
        runs.keeper.listener(run)(StatusEvent(state, 3, ""))
        assert runs.keeper.copying == [] and not (settings.persist_dir / "runs").exists()
    finally:
        runs.close()
