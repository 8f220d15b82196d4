"""`--report-to trackio | tensorboard` (memvir.train.reporting): a short CLI run's logged steps and evaluations, as
its metrics.jsonl holds them, read back from trackio's store and from the TensorBoard event file with the libraries'
own readers; rank 0 alone reports; the settings that name where are checked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_process import run_memvir

from memvir.config import TrainConfig
from memvir.events import EvalEvent, StatusEvent, StepEvent
from memvir.train.distributed import World
from memvir.train.reporting import (
    TensorBoardReporter,
    TrackioReporter,
    eval_metrics,
    reporter_for,
    step_metrics,
)

ROOT = Path(__file__).resolve().parents[2]
RUN = ["--dataset", "glyphs-mini", "--batch-size", "16", "--memvir-n", "2", "--memvir-m", "0", "--warmup-epochs",
       "0", "--memvir-schedule", "all-at-once", "--log-every", "2", "--seed", "5"]
"""A short run whose s(i) grows from its second step (N=2, M=0, no warm-up): steps 1 and 3 log as first and last,
step 2 at the cadence."""

# trackio reads TRACKIO_DIR when it is imported: its store is read in a process of its own with the test's folder
READ_TRACKIO = """
import json, sys, trackio
from trackio.sqlite_storage import SQLiteStorage
project = sys.argv[1]
runs = {run.name: {"config": run.config, "logs": SQLiteStorage.get_logs(project, run.name)}
        for run in trackio.Api().runs(project)}
print(json.dumps(runs, default=str))
"""


def records(run_folder: Path) -> list[dict]:
    return [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]


def expected_by_step(run_folder: Path) -> dict[int, dict[str, float]]:
    """What the tracker should hold, written out from metrics.jsonl: a step record's numbers under train/ (not its
    step, epoch or warm-up flag), an evaluation's under test/ (val_* under val/)."""
    expected: dict[int, dict[str, float]] = {}
    for record in records(run_folder):
        if record["type"] == "step":
            values = {f"train/{k}": v for k, v in record.items()
                      if k not in ("type", "step", "epoch", "warmup") and v is not None}
        elif record["type"] == "eval":
            values = {(f"val/{k[4:]}" if k.startswith("val_") else f"test/{k}"): v for k, v in record.items()
                      if k not in ("type", "step", "epoch")}
        else:
            continue
        expected.setdefault(record["step"], {}).update(values)
    return expected


@pytest.mark.slow
def test_trackio_holds_the_runs_metrics_and_settings_and_a_resume_continues_its_run(tmp_path):
    trackio_dir, run = tmp_path / "trackio", tmp_path / "glyph-run"
    env = {"TRACKIO_DIR": str(trackio_dir)}
    first = run_memvir("train", *RUN, "--max-steps", "2", "--report-to", "trackio", "--report-project", "memvir-test",
                       "--out", run, env=env)
    assert first.returncode == 0, first.stderr
    # stdout stays the CLI's one result line: trackio's own words go to stderr
    assert json.loads(first.stdout.strip().splitlines()[-1])["step"] == 2 and "Trackio" not in first.stdout
    resumed = run_memvir("train", "--out", run, "--resume", "--max-steps", "3", env=env)
    assert resumed.returncode == 0, resumed.stderr

    read = subprocess.run([sys.executable, "-c", READ_TRACKIO, "memvir-test"], capture_output=True, text=True,
                          env={**os.environ, **env, "HF_HUB_OFFLINE": "1"}, cwd=ROOT, timeout=120)
    assert read.returncode == 0, read.stderr
    runs = json.loads(read.stdout)
    assert list(runs) == ["glyph-run"]  # named after its folder; the resume continued it
    config = runs["glyph-run"]["config"]
    assert {k: config[k] for k in ("dataset", "batch_size", "memvir_n", "memvir_m", "report_to")} == {
        "dataset": "glyphs-mini", "batch_size": 16, "memvir_n": 2, "memvir_m": 0, "report_to": "trackio"}

    held: dict[int, dict[str, float]] = {}
    for entry in runs["glyph-run"]["logs"]:
        held.setdefault(entry["step"], {}).update(
            {k: v for k, v in entry.items() if k not in ("step", "timestamp")})
    expected = expected_by_step(run)
    assert sorted(held) == sorted(expected) == [0, 1, 2, 3]
    for step, values in expected.items():
        assert held[step] == pytest.approx(values, rel=1e-12), step
    # what the issue names: the loss, s(i), cos(x, W_y) at the logged steps, Recall@1 at the evaluations
    assert {"train/loss", "train/num_classes", "train/mean_target_cosine"} <= set(held[3])
    assert held[3]["train/num_classes"] > held[1]["train/num_classes"]  # the virtual classes joined
    assert {"test/recall@1", "test/map@r"} <= set(held[0]) and "test/recall@1" in held[2] and "test/recall@1" in held[3]


@pytest.mark.slow
def test_the_tensorboard_event_file_holds_the_runs_metrics_and_settings(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    result = run_memvir("train", *RUN, "--max-steps", "2", "--val-classes", "4", "--report-to", "tensorboard",
                        "--out", run)
    assert result.returncode == 0, result.stderr
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    held: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for scalar in events.Scalars(tag):
            held.setdefault(scalar.step, {})[tag] = scalar.value
    expected = expected_by_step(run)
    assert sorted(held) == sorted(expected) == [0, 1, 2]
    for step, values in expected.items():
        assert held[step] == pytest.approx(values, rel=1e-6), step  # TensorBoard keeps float32
    assert {"val/recall@1", "test/recall@1"} <= set(held[2])
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    settings = json.loads(text)  # an indented block of JSON, as TensorBoard's text view shows code
    assert TrainConfig.from_dict(settings) == TrainConfig.from_json((run / "train_config.json").read_text())


THREADED_TRACKIO = """
import json, sys, threading
from memvir.config import TrainConfig
from memvir.events import EvalEvent, StatusEvent
from memvir.train.reporting import TrackioReporter
reporter = TrackioReporter(TrainConfig(dataset="glyphs-mini", report_to="trackio", report_project="threads"),
                           sys.argv[1])
def train():  # as a Trainer in a thread of the app's: the tracker's run is opened and fed there
    reporter(StatusEvent("running", 0))
    reporter(EvalEvent(step=0, epoch=0, metrics={"recall@1": 0.25}))
worker = threading.Thread(target=train)
worker.start()
worker.join()
reporter.close()  # from the main thread, as the exit closes a run whose thread ended without its last event
import trackio
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps([SQLiteStorage.get_logs("threads", run.name) for run in trackio.Api().runs("threads")], default=str))
"""


@pytest.mark.slow
def test_a_run_fed_from_a_thread_is_closed_from_another(tmp_path):
    read = subprocess.run([sys.executable, "-c", THREADED_TRACKIO, str(tmp_path / "threaded-run")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1",
                               "PYTHONPATH": str(ROOT)})
    assert read.returncode == 0, read.stderr
    [[entry]] = json.loads(read.stdout)
    assert (entry["step"], entry["test/recall@1"]) == (0, 0.25)
    assert "Trackio" not in read.stdout  # its words went to stderr, at the close too


def config(**values):
    return TrainConfig(dataset="glyphs-mini", **values)


def logged_step(step: int, loss: float) -> StepEvent:
    return StepEvent(step=step, epoch=0, loss=loss, num_classes=24, num_virtual_sets=0, mean_target_cosine=0.5,
                     images_per_s=10.0, lr=0.001, warmup=False, logged=True)


def test_a_resumed_run_hides_what_tensorboard_got_past_its_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    settings = config(report_to="tensorboard")
    killed = TensorBoardReporter(settings, tmp_path)
    for event in (StatusEvent("running", 0), *(logged_step(step, float(step)) for step in (1, 2, 3, 4))):
        killed(event)
    killed.close()  # as the exit closes it when a process is killed after step 4, its checkpoint at step 2
    resumed = TensorBoardReporter(settings, tmp_path)
    for event in (StatusEvent("running", 2), logged_step(3, 30.0), StatusEvent("finished", 3)):
        resumed(event)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_rank_zero_alone_reports(tmp_path):
    trackio = config(report_to="trackio")
    assert isinstance(reporter_for(trackio, tmp_path, World(rank=0, world_size=2)), TrackioReporter)
    assert reporter_for(trackio, None, World(rank=1, world_size=2)) is None
    assert isinstance(reporter_for(config(report_to="tensorboard"), tmp_path, World()), TensorBoardReporter)
    assert reporter_for(config(report_to="tensorboard"), None, World(rank=3, world_size=4)) is None
    assert reporter_for(config(), tmp_path, World()) is None


def test_a_step_and_an_evaluation_as_the_tracker_receives_them():
    step = StepEvent(step=7, epoch=1, loss=2.5, num_classes=72, num_virtual_sets=2, mean_target_cosine=0.25,
                     images_per_s=100.0, lr=0.001, warmup=False, spread={"weight_mean_cos": 0.125},
                     adam={"adam_eps_share": 0.5}, logged=True)
    assert step_metrics(step) == {"train/loss": 2.5, "train/num_classes": 72.0, "train/num_virtual_sets": 2.0,
                                  "train/mean_target_cosine": 0.25, "train/images_per_s": 100.0, "train/lr": 0.001,
                                  "train/weight_mean_cos": 0.125, "train/adam_eps_share": 0.5}
    unchecked = StepEvent(step=8, epoch=1, loss=None, num_classes=72, num_virtual_sets=2, mean_target_cosine=None,
                          images_per_s=100.0, lr=0.001, warmup=True)
    assert "train/loss" not in step_metrics(unchecked) and "train/mean_target_cosine" not in step_metrics(unchecked)
    evaluation = EvalEvent(step=9, epoch=1, metrics={"recall@1": 0.75, "map@r": 0.5, "val_recall@1": 0.625})
    assert eval_metrics(evaluation) == {"test/recall@1": 0.75, "test/map@r": 0.5, "val/recall@1": 0.625}


def test_a_missing_tracker_package_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)  # as on a machine without it
    reporter = TrackioReporter(config(report_to="trackio"), tmp_path)
    with pytest.raises(ValueError, match=r"pip install trackio==0\.43\.0"):
        reporter(EvalEvent(step=0, epoch=0, metrics={"recall@1": 0.5}))


def test_tensorboard_needs_a_run_folder():
    with pytest.raises(ValueError, match="run folder"):
        TensorBoardReporter(config(report_to="tensorboard"), None)


@pytest.mark.parametrize(("values", "message"), [
    (dict(report_to="wandb"), "report_to must be one of none, trackio, tensorboard"),
    (dict(report_to="tensorboard", report_space="me/runs"), "add report_to trackio"),
    (dict(report_to="trackio", report_bucket="me/bucket"), "name the Space too"),
    (dict(report_to="trackio", report_space="me/my runs"), "report_space must be a Hugging Face id"),
    (dict(report_to="trackio", report_project=""), "report_project must be a name"),
])
def test_where_to_report_is_checked_in_words(values, message):
    with pytest.raises(ValueError, match=message):
        config(**values)
    assert config(report_to="trackio", report_space="me/runs", report_bucket="me/bucket").report_bucket == "me/bucket"
