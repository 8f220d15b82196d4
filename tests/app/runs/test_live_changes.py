"""A run's live changes in the page's words, read from the Trainer's typed records: every live setting has the page's
name, a control record reads back as the event it was written from, a run's story lists each change at its step,
and the baseline's status line names the optimiser it trains. Expectations are written out by hand."""

import pickle
from pathlib import Path

import pytest

from demo.runs import live_changes
from demo.runs.live_run import LiveRun
from demo.train import live_view
from demo.train.presets import PRESETS, tuned_baseline
from memvir.config import LIVE_SETTINGS, SettingRefused, TrainConfig
from memvir.events import ControlEvent, StatusEvent


def test_every_live_setting_has_the_pages_name():
    assert set(live_changes.LIVE_LABELS) == set(LIVE_SETTINGS)


@pytest.mark.parametrize(("settings", "library", "page"), [
    ({"memvir_n": -1}, "TrainConfig: memvir_n must be an integer >= 0, got -1", "N must be an integer >= 0, got -1"),
    ({"warmup_epochs": -2}, "TrainConfig: warmup_epochs must be a number from 0 to 1,000,000, got -2",
     "warm-up (epochs) must be a number from 0 to 1,000,000, got -2"),
    ({"lr": 0.0}, "TrainConfig: lr must be > 0 and finite, got 0.0", "lr must be > 0 and finite, got 0.0"),
    ({"batch_size": 0}, "TrainConfig: batch_size must be an integer >= 1, got 0",
     "batch_size must be an integer >= 1, got 0"),  # not a live setting: the library's name stands
])
def test_a_setting_trainconfig_refuses_is_named_as_the_page_names_its_control(settings, library, page):
    with pytest.raises(SettingRefused) as refused:
        TrainConfig(**settings)
    assert str(refused.value) == library  # the CLI and the library keep their words
    # the run's process sends the refusal across a pipe: its fields survive the pickle
    crossed = pickle.loads(pickle.dumps(refused.value))
    assert (crossed.setting, crossed.detail) == (refused.value.setting, refused.value.detail)
    assert live_changes.refusal_words(crossed) == page
    assert live_changes.refusal_words(ValueError("anything else")) == "anything else"


def test_a_control_record_reads_back_as_the_event_it_was_written_from():
    event = ControlEvent(521, {"memvir_n": 6, "lr": 0.0005}, "whatever the Trainer said",
                         previous={"memvir_n": 4, "lr": 0.001})
    assert ControlEvent.from_record(event.record()) == event
    old = {"type": "control", "step": 95, "message": "memvir_n 4 -> 3: applied at step 96", "memvir_n": 3}
    assert ControlEvent.from_record(old) == ControlEvent(95, {"memvir_n": 3}, "memvir_n 4 -> 3: applied at step 96")


def test_a_runs_story_lists_each_change_at_the_first_step_trained_with_it():
    records = [{"type": "step", "step": 1},
               ControlEvent(521, {"memvir_n": 6}, "", previous={"memvir_n": 4}).record(),
               ControlEvent(699, {"memvir_n": 8, "warmup_epochs": 3.0}, "",
                            previous={"memvir_n": 6, "warmup_epochs": 2.0}).record(),
               {"type": "control", "step": 800, "message": "memvir_m 10 -> 20: applied at step 801", "memvir_m": 20}]
    changes = live_changes.record_changes(records)  # the record without `previous` tells no old value: left out
    assert live_changes.story(changes) == ("N 4 -> 6 at step 522, N 6 -> 8 at step 700, "
                                           "warm-up (epochs) 2 -> 3 at step 700")
    # a run read back from its folder shows the values its changes left it with
    run = LiveRun("r", "alice", Path("unused"), TrainConfig(memvir_n=4, warmup_epochs=2.0))
    run.records = records
    run.changes = live_changes.record_changes(records)
    assert live_view.changes_line(run.changes) == live_changes.story(changes)


def test_the_status_line_keeps_the_latest_changes_and_counts_the_rest():
    changes = [live_changes.LiveChange(10 * step, "memvir_n", step, step + 1) for step in range(1, 9)]
    assert live_view.changes_line(changes) == ("2 earlier, then N 3 -> 4 at step 30, N 4 -> 5 at step 40, "
                                               "N 5 -> 6 at step 50, N 6 -> 7 at step 60, N 7 -> 8 at step 70, "
                                               "N 8 -> 9 at step 80")


def test_the_baselines_status_names_its_own_tuned_optimiser():
    """Before, a baseline training the fair comparison's tuned optimiser was described as 'the same settings with
    N = 0'."""
    config = TrainConfig(dataset="glyphs", **PRESETS["glyphs"].settings())
    tuned = tuned_baseline(config)
    assert tuned is not None
    baseline = LiveRun("b", "alice", Path("unused"),
                       TrainConfig.from_dict({**config.to_dict(), **tuned.settings(), "memvir_n": 0}), "baseline")
    baseline._on_event(StatusEvent("running", 0, "training"))
    line = live_view.baseline_line(baseline, config)
    assert tuned.loss_scale_after_warmup == 2.0  # the widened search's baseline: its loss x2 after the warm-up
    assert line.startswith(f"**Baseline** (N = 0: no virtual classes; its own optimiser: lr {tuned.lr:g}, "
                           f"class-weight lr {tuned.class_lr:g}, Adam eps {tuned.adam_eps:g}, scale {tuned.scale:g}, "
                           "loss x2 after the warm-up)")
    # one that trains the run's own optimiser is the run's settings with N = 0
    same = LiveRun("b", "alice", Path("unused"), TrainConfig.from_dict({**config.to_dict(), "memvir_n": 0}),
                   "baseline")
    assert live_view.baseline_line(same, config).startswith(
        "**Baseline** (the same settings with N = 0: no virtual classes)")
