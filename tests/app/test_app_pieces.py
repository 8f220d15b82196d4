"""The app's pieces without a server: settings, upload checks, glyph queries, the status line, a run's bookkeeping."""

import dataclasses
import io
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from demo.common.settings import AppSettings
from demo.common.uploads import UploadError, load_image, unpack_class_zip
from demo.retrieve.galleries import thumbnail
from demo.runs.live_run import LiveRun, SnapshotView
from demo.train import live_view
from memvir.config import TrainConfig
from memvir.events import ControlEvent, EvalEvent, SnapshotEvent, StatusEvent, StepEvent


def _png(path, size=(8, 8), color=200):
    Image.new("L", size, color).save(path)
    return path


# ---------------------------------------------------------------------------------------------- settings
def test_choices_written_into_the_page_match_the_library():
    from demo.train.tab import BACKBONE_CHOICES, LOSS_CHOICES, SCHEDULE_CHOICES
    from memvir import LOSSES
    from memvir.memory.virtual_classes import SCHEDULES
    from memvir.models.backbones import available_backbones

    assert tuple(LOSS_CHOICES) == tuple(LOSSES)
    assert tuple(BACKBONE_CHOICES) == available_backbones()
    assert tuple(value for _, value in SCHEDULE_CHOICES) == tuple(SCHEDULES)


def test_page_defaults_are_the_library_defaults_with_glyphs_preset():
    """The page opens on the library's settings, except those glyphs' preset (the fair comparison's MemVir arm,
    chosen on validation classes) sets: its N, M, warm-up, reduction and optimiser, and 12 epochs."""
    from demo.train.presets import PRESETS
    from demo.train.tab import DEFAULTS
    from memvir.config import TrainConfig

    library = TrainConfig().to_dict()
    for name in ("dataset", "backbone", "loss", "batch_size", "seed", "memvir_schedule", "val_classes"):
        assert DEFAULTS[name] == library[name], name
    preset = PRESETS["glyphs"]
    assert (DEFAULTS["epochs"], DEFAULTS["memvir_n"], DEFAULTS["memvir_m"], DEFAULTS["warmup_epochs"],
            DEFAULTS["memvir_reduction"]) == (12, preset.memvir_n, preset.memvir_m, preset.warmup_epochs,
                                              preset.memvir_reduction)
    assert (DEFAULTS["lr"], DEFAULTS["class_lr"], DEFAULTS["adam_eps"], DEFAULTS["loss_params"]) == (
        preset.optimiser.lr, preset.optimiser.class_lr, preset.optimiser.adam_eps, {"scale": preset.optimiser.scale})
    assert library["epochs"] == 8  # the library's own default, which the page departs from


def test_settings_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMVIR_APP_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MEMVIR_MAX_RUNS", "3")
    monkeypatch.setenv("MEMVIR_UMAP", "0")
    monkeypatch.setenv("MEMVIR_SERVER_PRIORITY", " Idle ")
    settings = AppSettings.from_env()
    assert settings.runs_dir == tmp_path / "data" / "runs"
    assert settings.uploads_dir == tmp_path / "data" / "uploads"
    assert (settings.max_active_runs, settings.umap, settings.server_priority) == (3, False, "idle")
    monkeypatch.delenv("MEMVIR_SERVER_PRIORITY")
    assert AppSettings.from_env().server_priority == "low"


@pytest.mark.parametrize(("name", "value", "message"), [
    ("MEMVIR_MAX_RUNS", "two", "MEMVIR_MAX_RUNS='two' is not a whole number"),
    ("MEMVIR_MAX_RUNS", "0", "MEMVIR_MAX_RUNS=0 is too small"),
    ("MEMVIR_UMAP", "maybe", "MEMVIR_UMAP='maybe' is not a yes/no value"),
    ("MEMVIR_SERVER_PRIORITY", "high", "MEMVIR_SERVER_PRIORITY='high' is not one of idle, low, normal"),
])
def test_bad_settings_say_which_variable(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        AppSettings.from_env()


# ---------------------------------------------------------------------------------------------- uploads
def test_load_image_decodes_a_png(tmp_path):
    image = load_image(_png(tmp_path / "a.png", (5, 7)), max_bytes=10_000, max_pixels=100)
    assert image.size == (5, 7) and np.asarray(image).max() == 200


def test_load_image_refuses_text(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not an image")
    with pytest.raises(UploadError, match=r"notes.txt is not an image this app can read \(PNG, JPEG"):
        load_image(path, max_bytes=10_000, max_pixels=100)


def test_load_image_refuses_a_truncated_png(tmp_path):
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 20, 30)).save(buffer, format="PNG")
    path = tmp_path / "cut.png"
    path.write_bytes(buffer.getvalue()[:60])
    with pytest.raises(UploadError, match="cut.png"):
        load_image(path, max_bytes=10_000, max_pixels=10_000)


def test_load_image_refuses_big_files_and_huge_canvases(tmp_path):
    path = _png(tmp_path / "big.png", (40, 30))
    with pytest.raises(UploadError, match=r"big.png is \d+ bytes; images up to 10 bytes are accepted"):
        load_image(path, max_bytes=10, max_pixels=10_000)
    with pytest.raises(UploadError, match="big.png is 40x30 pixels; images up to 0 megapixels are accepted"):
        load_image(path, max_bytes=10_000, max_pixels=40 * 30 - 1)


def _zip(path, entries):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def test_unpack_class_zip_lands_in_the_uploads_folder(tmp_path):
    png = io.BytesIO()
    Image.new("L", (4, 4)).save(png, format="PNG")
    path = _zip(tmp_path / "classes.zip", {"cats/1.png": png.getvalue(), "dogs/1.png": png.getvalue()})
    root = unpack_class_zip(path, tmp_path / "uploads", max_zip_bytes=10_000, max_unpacked_bytes=10_000)
    assert root.parent == tmp_path / "uploads"
    assert sorted(p.name for p in root.iterdir()) == ["cats", "dogs"]


def test_unpack_class_zip_refuses_paths_leaving_the_folder(tmp_path):
    path = _zip(tmp_path / "evil.zip", {"../escaped.png": b"x", "ok/1.png": b"y"})
    uploads = tmp_path / "uploads"
    with pytest.raises(UploadError, match=r"evil.zip: entry '../escaped.png' points outside the destination"):
        unpack_class_zip(path, uploads, max_zip_bytes=10_000, max_unpacked_bytes=10_000)
    assert not (tmp_path / "escaped.png").exists()
    assert not uploads.exists() or not any(uploads.iterdir())


def test_unpack_class_zip_refuses_big_zips(tmp_path):
    path = _zip(tmp_path / "big.zip", {"a/1.png": b"x" * 5000})
    with pytest.raises(UploadError, match=r"big.zip is 5.0 KiB; zips up to 100 bytes are accepted"):
        unpack_class_zip(path, tmp_path / "uploads", max_zip_bytes=100, max_unpacked_bytes=10_000)


def test_thumbnail_shows_glyphs_as_dark_ink_on_white():
    render = np.zeros((32, 32), dtype=np.uint8)
    render[:, :16] = 255
    shown = np.asarray(thumbnail(Image.fromarray(render), glyphs=True, size=64))
    assert shown.shape == (64, 64)
    assert shown[32, 5] == 0 and shown[32, 60] == 255


# ---------------------------------------------------------------------------------------------- status line
@pytest.mark.parametrize(("seconds", "text"), [(0, "10 s"), (28.16, "30 s"), (44.9, "40 s"), (89, "90 s"),
                                                (90, "2 min"), (200, "3 min"), (3569, "59 min"), (7500, "2 h 05 min")])
def test_time_left_is_worded_no_finer_than_an_estimate(seconds, text):
    assert live_view.time_left_words(seconds) == text


def _run(tmp_path, **overrides):
    values = {"dataset": "glyphs-mini", "epochs": 5, "batch_size": 128, "memvir_n": 5, "memvir_m": 10,
              "warmup_epochs": 1.0}
    config = TrainConfig(**{**values, **overrides})
    run = LiveRun("r1", "owner", tmp_path / "r1", config)
    run.total_steps = 475
    return run


def _step(step, **overrides):
    values = dict(step=step, epoch=1, loss=2.0, num_classes=2042, num_virtual_sets=1, mean_target_cosine=0.3,
                  images_per_s=1600.0, lr=1e-3, warmup=False)
    return StepEvent(**{**values, **overrides})


def test_status_line_says_epoch_step_classes_virtual_sets_speed_and_time_left(tmp_path):
    run = _run(tmp_path)
    run._on_event(StatusEvent("running", 0, "training"))
    run._on_event(_step(123))
    text = live_view.status_markdown(run, "owner")
    # time left before the run's pace is known: (475 - 123) steps x 128 images / 1600 images/s = 28.16 s
    assert ("**Training** · epoch 2 of 5 · step 123 of 475 · classes in use s(i) 2,042 · virtual sets 1 of 5 · "
            "1,600 images/s · about 30 s left") in text
    assert "another visitor" not in text
    assert "watching a run started by another visitor (read-only)" in live_view.status_markdown(run, "someone")


def test_time_left_follows_the_runs_pace_over_its_recent_minutes_not_one_moments_images_per_second(tmp_path):
    run = _run(tmp_path, epochs=50)
    run.total_steps = 4000
    now = [1000.0]
    run.pace.clock = lambda: now[0]
    run._on_event(StatusEvent("running", 0, "training"))
    for step in range(100, 400, 10):  # 10 steps every 2 s, an evaluation's 30 s pause after step 250
        now[0] += 30.0 if step == 260 else 2.0
        run._on_event(_step(step, images_per_s=9000.0 if step == 390 else 640.0))
    # by hand: step s arrives at 1000 + 2 (s - 90) / 10 (+ 28 from step 260 on), so 390 at 1088; the 120 s window
    # reaches back to 968 and holds every arrival from step 100 (1002): 290 steps in 86 s, the pause included,
    # where the last images/s (9,000) would say 51 s; left: (4000 - 390) / (290 / 86) = 1,070.6 s
    assert live_view.seconds_left(run) == pytest.approx((4000 - 390) / (290 / 86))
    assert "about 18 min left" in live_view.status_markdown(run, "owner")
    # a pause forgets the pace: after it, the Trainer's images/s again until 20 s of arrivals
    run._on_event(StatusEvent("paused", 390, "paused"))
    assert live_view.seconds_left(run) is None
    run._on_event(StatusEvent("running", 390, "training"))
    now[0] += 600.0
    run._on_event(_step(400, images_per_s=1280.0))
    assert live_view.seconds_left(run) == pytest.approx((4000 - 400) * 128 / 1280.0)


def test_a_baselines_status_line_says_it_is_one_rather_than_counting_no_virtual_sets(tmp_path):
    baseline = _run(tmp_path, memvir_n=0)
    baseline._on_event(StatusEvent("running", 0, "training"))
    baseline._on_event(_step(12, num_virtual_sets=0, warmup=True))
    text = live_view.status_markdown(baseline, "owner")
    assert "classes in use s(i) 2,042 · baseline (N = 0): no virtual classes · 1,600 images/s" in text
    assert "virtual sets" not in text and "warm-up" not in text


def test_status_line_names_live_changes_in_the_pages_words(tmp_path):
    run = _run(tmp_path, memvir_n=5)
    run._on_event(ControlEvent(123, {"memvir_n": 10}, "memvir_n 5 -> 10: applied at step 124"))
    run._on_event(ControlEvent(130, {"memvir_m": 3, "warmup_epochs": 2.0}, "..."))
    assert run.control_message == "M 10 -> 3, warm-up (epochs) 1 -> 2: applied at step 131"
    run._on_event(ControlEvent(140, {"memvir_n": 7}, "..."))
    assert run.control_message == "N 10 -> 7: applied at step 141"
    # the status line lists every change so far, each at the first step trained with it
    assert ("Live changes: N 5 -> 10 at step 124, M 10 -> 3 at step 131, warm-up (epochs) 1 -> 2 at step 131, "
            "N 10 -> 7 at step 141") in live_view.status_markdown(run, "owner")


def test_a_run_keeps_the_records_of_the_events_it_hears_as_metrics_jsonl_would(tmp_path):
    run = _run(tmp_path)  # the steps the trainer logged say so; the others only update the status line
    events = [StatusEvent("running", 0, "training"), _step(1, logged=True), _step(2),
              _step(5, spread={"weight_mean_cos": 0.25}, logged=True), _step(10, logged=True),
              EvalEvent(10, 0, {"recall@1": 0.5}), ControlEvent(11, {"memvir_n": 3}, "N 5 -> 3"), _step(11),
              _step(475, logged=True), StatusEvent("finished", 475, "done")]
    for event in events:
        run._on_event(event)
    assert [(record["type"], record["step"]) for record in run.records] == [
        ("status", 0), ("step", 1), ("step", 5), ("step", 10), ("eval", 10), ("control", 11), ("step", 475),
        ("status", 475)]
    assert run.records[2] == {"type": "step", "step": 5, "epoch": 1, "loss": 2.0, "num_classes": 2042,
                              "num_virtual_sets": 1, "mean_target_cosine": 0.3, "images_per_s": 1600.0, "lr": 1e-3,
                              "warmup": False, "weight_mean_cos": 0.25}
    assert run.records[4] == {"type": "eval", "step": 10, "epoch": 0, "recall@1": 0.5}
    assert run.last_step.step == 475 and run.state == "finished"


def test_status_line_when_nothing_runs():
    assert "press **Start**" in live_view.status_markdown(None, "anyone")


# ---------------------------------------------------------------------------------------------- snapshots
def _snapshot(step):
    rows = torch.nn.functional.normalize(torch.randn(6, 4), dim=1)
    return SnapshotEvent(step=step, margin=1, embeddings=rows, labels=torch.arange(6) % 3, ages=torch.zeros(6).long(),
                         class_weights=torch.randn(3, 4), class_weight_labels=torch.arange(3),
                         class_weight_ages=torch.zeros(3).long(), probe_embeddings=torch.randn(4, 4),
                         probe_labels=torch.tensor([0, 0, 1, 1]))


def test_snapshots_are_kept_projected_and_thinned_from_the_start_on(tmp_path):
    run = _run(tmp_path)
    projected_steps = []

    def project(snapshot, method, reference=None):
        projected_steps.append(snapshot.step)
        return dataclasses.make_dataclass("P", ["step", "method"])(snapshot.step, method)

    run._project, run._snapshot_history = project, 4
    for step in (10, 20, 30, 40, 50):
        run._on_event(_snapshot(step))
    # the fifth snapshot overflows 4: every other older one goes, the newest stays -> 10, 30, 50
    assert [view.step for view in run.snapshots] == [10, 30, 50]
    assert all(isinstance(view, SnapshotView) and view.projected.method == "pca" for view in run.snapshots)
    assert projected_steps == [10, 20, 30, 40, 50]
    assert run.latest_raw_snapshot.step == 50  # only the newest raw snapshot is held (for UMAP)
    assert [run.snapshot_at(s).step for s in (None, 5, 10, 29, 30, 49, 99)] == [50, 10, 10, 10, 30, 30, 50]
    assert live_view.snapshot_range(run) == (10, 50)
