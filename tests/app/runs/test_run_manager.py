"""RunManager with real Trainers on glyphs-mini: threads, the training slot, owners, live changes, resume, baselines,
and UMAP swapped in for PCA (with a stand-in projection, so no real UMAP runs here)."""

import dataclasses
import json
import re
import time

import pytest

from demo.common.settings import AppSettings
from demo.runs.manager import NotRunOwner, RunError, RunLimitReached, RunManager
from demo.train.live_view import status_markdown
from demo.umap.worker import UmapWorker
from memvir.analysis.projection import project_snapshot
from memvir.config import TrainConfig


@pytest.fixture
def manager(tmp_path):
    settings = AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints", umap=False)
    manager = RunManager(settings)
    yield manager
    manager.close()


def quick(**overrides) -> TrainConfig:
    """glyphs-mini: 288 training images, 9 steps of 32 per epoch."""
    values = dict(dataset="glyphs-mini", batch_size=32, epochs=1, eval_at_start=False, snapshot_every=3, log_every=1)
    return TrainConfig(**{**values, **overrides})


def wait_for(condition, seconds=60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    raise AssertionError("condition not met before the deadline")


def test_a_run_trains_on_its_thread_and_mirrors_metrics_jsonl(manager):
    run = manager.start(quick(), "alice")
    run.join(60)
    assert run.state == "finished" and not run.busy
    lines = (run.folder / "metrics.jsonl").read_text().splitlines()
    assert run.records == [json.loads(line) for line in lines]
    assert [record["step"] for record in run.records if record["type"] == "step"] == list(range(1, 10))
    assert [view.step for view in run.snapshots] == [3, 6, 9]
    assert all(view.projected.method == "pca" for view in run.snapshots)
    assert run.last_step.step == run.total_steps == 9
    assert (run.folder / "model.safetensors").is_file()


def test_the_records_built_from_events_are_the_lines_the_trainer_logged(manager):
    """Steps are logged every log_every steps, at the first and last, and where they carry the spread (at the
    snapshot cadence): here every 4th, the 1st and 9th, and every 3rd."""
    run = manager.start(quick(log_every=4, snapshot_every=3), "alice")
    run.join(60)
    lines = (run.folder / "metrics.jsonl").read_text().splitlines()
    assert run.records == [json.loads(line) for line in lines]
    assert [record["step"] for record in run.records if record["type"] == "step"] == [1, 3, 4, 6, 8, 9]
    assert [record["type"] for record in run.records if record["type"] != "step"] == ["status", "eval", "status"]


def test_one_run_at_a_time_and_only_its_owner_steers_it(manager):
    run = manager.start(quick(epochs=200), "alice")
    with pytest.raises(RunLimitReached, match="another visitor's run is training, and this machine trains 1 run"):
        manager.start(quick(), "bob")
    with pytest.raises(RunLimitReached, match="your run is still training: stop it before starting another"):
        manager.start(quick(), "alice")
    for action in (manager.stop, manager.pause, manager.resume, manager.compare_with_baseline):
        with pytest.raises(NotRunOwner, match="this run was started by another visitor: you can watch it"):
            action(run.id, "bob")
    with pytest.raises(NotRunOwner):
        manager.update(run.id, "bob", {"memvir_n": 1})
    assert manager.attach("bob") is run  # another visitor watches the run in progress
    assert manager.attach("alice") is run  # a reloaded page finds its own run again
    manager.stop(run.id, "alice")
    run.join(60)
    assert run.state == "stopped" and run.can_resume
    assert manager.attach("bob", after=time.time()) is None  # a page reset after the run shows nothing
    bobs = manager.start(quick(epochs=200), "bob")
    assert bobs.owner == "bob"  # the slot is free again
    # alice's page keeps her stopped run, which only she may resume; a watcher's page moves on to the run that trains
    assert manager.attach("alice", run.id) is run and "press **Resume**" in status_markdown(run, "alice")
    assert manager.attach("carol", run.id) is bobs
    watched = status_markdown(run, "carol")
    assert "press **Resume**" not in watched and "another visitor (read-only)" in watched
    manager.stop(bobs.id, "bob")


def test_pause_then_resume(manager):
    run = manager.start(quick(epochs=200), "alice")
    wait_for(lambda: run.last_step is not None)
    manager.pause(run.id, "alice")
    wait_for(lambda: run.state == "paused")
    paused_at = run.last_step.step
    time.sleep(0.3)
    assert run.last_step.step == paused_at and run.busy
    manager.resume(run.id, "alice")
    wait_for(lambda: run.last_step.step > paused_at)
    manager.stop(run.id, "alice")
    run.join(60)


def test_live_change_then_stop_and_resume_continue_the_same_run(manager):
    run = manager.start(quick(epochs=200, memvir_n=2), "alice")
    wait_for(lambda: run.last_step is not None)
    manager.update(run.id, "alice", {"memvir_n": 4})
    wait_for(lambda: run.control_message is not None)
    applied_at = int(re.fullmatch(r"N 2 -> 4: applied at step (\d+)", run.control_message).group(1))
    assert run.live_values["memvir_n"] == 4
    manager.stop(run.id, "alice")
    run.join(60)
    stopped_at = run.last_step.step
    assert run.state == "stopped" and stopped_at >= applied_at - 1

    manager.resume(run.id, "alice")
    wait_for(lambda: run.last_step.step >= stopped_at + 3)
    manager.stop(run.id, "alice")
    run.join(60)
    steps = [record["step"] for record in run.records if record["type"] == "step"]
    assert steps == list(range(1, steps[-1] + 1))  # resumed where it stopped: no step twice, none missing
    controls = [record for record in run.records if record["type"] == "control"]
    assert [record["memvir_n"] for record in controls] == [4]


def test_an_unfinished_run_cannot_be_resumed_twice_and_a_finished_one_not_at_all(manager):
    run = manager.start(quick(), "alice")
    run.join(60)
    with pytest.raises(RunError, match="the run finished and has nothing to resume: press Start"):
        manager.resume(run.id, "alice")
    with pytest.raises(RunError, match="the run is not training \\(it is finished\\)"):
        manager.stop(run.id, "alice")
    with pytest.raises(RunError, match="there is no run to control: press Start first"):
        manager.stop(None, "alice")


@pytest.mark.slow
def test_baseline_is_loaded_when_the_same_configuration_finished_before(manager):
    finished = manager.start(quick(memvir_n=0), "alice")
    finished.join(60)
    run = manager.start(quick(memvir_n=3), "alice")
    baseline = manager.compare_with_baseline(run.id, "alice")
    assert baseline.folder == finished.folder and baseline.state == "finished" and not baseline.training
    assert baseline.records == finished.records
    assert manager.compare_with_baseline(run.id, "alice") is baseline
    run.join(60)


@pytest.mark.slow
def test_a_baseline_differing_only_in_the_classes_shown_is_loaded_not_trained_again(manager):
    """"Classes shown" only chooses what the snapshots draw: a finished baseline that drew others still fits."""
    finished = manager.start(quick(memvir_n=0), "alice")
    finished.join(60)
    run = manager.start(quick(memvir_n=3, focus_classes=[1, 2, 3]), "alice")
    baseline = manager.compare_with_baseline(run.id, "alice")
    assert baseline.folder == finished.folder and baseline.state == "finished"
    run.join(60)


@pytest.mark.slow
def test_baseline_trains_beside_the_run_when_none_finished(manager):
    run = manager.start(quick(memvir_n=3, epochs=2), "alice")
    baseline = manager.compare_with_baseline(run.id, "alice")
    assert baseline.config.memvir_n == 0 and baseline.config.snapshot_every == 0
    baseline.join(60)
    run.join(60)
    assert baseline.state == "finished" and baseline.snapshots == []
    assert [r["num_virtual_sets"] for r in baseline.records if r["type"] == "step"] == [0] * 18
    assert not run.busy


@pytest.mark.slow
def test_a_baseline_trains_the_optimiser_settings_it_is_given_in_place_of_the_run_s(manager):
    """The Train tab passes the tuned baseline's own optimiser (demo.train.presets): those replace the run's."""
    run = manager.start(quick(memvir_n=3, epochs=2), "alice")
    baseline = manager.compare_with_baseline(run.id, "alice", {"lr": 2e-3, "adam_eps": 1e-8,
                                                                "loss_params": {"scale": 30.0}})
    assert (baseline.config.memvir_n, baseline.config.lr, baseline.config.adam_eps, baseline.config.loss_params) == (
        0, 2e-3, 1e-8, {"scale": 30.0})
    assert (run.config.lr, run.config.adam_eps) == (1e-3, 1e-2)  # the run keeps its own
    baseline.join(60)
    run.join(60)


def test_a_baseline_run_has_nothing_to_compare_with(manager):
    run = manager.start(quick(memvir_n=0), "alice")
    with pytest.raises(RunError, match=r"this run is a baseline already \(N = 0\)"):
        manager.compare_with_baseline(run.id, "alice")
    run.join(60)


def test_a_configuration_that_cannot_train_is_refused_and_frees_the_slot(manager, tmp_path):
    with pytest.raises(ValueError, match="does not exist or is not a folder"):
        manager.start(quick(dataset=f"folder:{tmp_path / 'missing'}"), "alice")
    with pytest.raises(ValueError, match="batch_size 1000 is larger than the training split"):
        manager.start(quick(batch_size=1000), "alice")
    assert manager.busy_runs() == [] and manager.runs() == []


def test_umap_replaces_pca_of_the_latest_snapshot_once_the_run_rests(manager):
    def fake_umap(snapshot, reference):
        return dataclasses.replace(project_snapshot(snapshot, "pca"), method="umap")

    worker = UmapWorker(project=fake_umap)
    try:
        run = manager.start(quick(), "alice")
        run.join(60)
        run.use_umap(worker)
        assert worker.wait((run.id, 9), timeout=30)
        run.use_umap(worker)
        assert [view.projected.method for view in run.snapshots] == ["pca", "pca", "umap"]
        assert run.latest_raw_snapshot is None  # projected for good: no raw embeddings kept
    finally:
        worker.close()


def test_a_finished_run_written_before_a_setting_existed_still_counts_as_one_of_these_settings(tmp_path):
    """A train_config.json without a setting added since (init_from, say) reads as its default: the baseline it holds
    is still found for Compare."""
    from demo.runs.manager import _finished_run_with

    config = quick(memvir_n=0).to_dict()
    folder = tmp_path / "runs" / "20260101-000000-glyphs-mini-norm-softmax-baseline-abcd"
    folder.mkdir(parents=True)
    older = {name: value for name, value in config.items() if name != "init_from"}
    (folder / "train_config.json").write_text(json.dumps(older))
    (folder / "metrics.jsonl").write_text(json.dumps({"type": "status", "state": "finished", "step": 9}) + "\n")
    assert _finished_run_with(tmp_path / "runs", config) == folder
    assert _finished_run_with(tmp_path / "runs", {**config, "seed": 1}) is None  # another run's settings
