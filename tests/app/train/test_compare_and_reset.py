"""Compare with baseline and Reset as the page's events call them, with real glyphs-mini runs: what only changes what
the page shows (the classes shown, the snapshot and evaluation cadences) never makes a finished baseline of the same
settings unfit, so Compare loads it rather than training another; the status line says what the baseline is, trained
beside the run or loaded. Expectations are written out by hand."""

import re

import pytest

from demo.train import live_view, words
from demo.train import tab as train_tab

# dataset, backbone, loss, batch, epochs, lr, seed, N, M, warm-up, snapshot every, eval every: 9 steps an epoch
SETTINGS = ("glyphs-mini", "convnet", "norm-softmax", 32, 2, 1e-3, 0, 2, 1, 0.2)
BASELINE_WORDS = "**Baseline** (the same settings with N = 0: no virtual classes)"


def _start(runs, snapshot_every, eval_every, focus_classes):
    train = train_tab.TrainHandlers(runs)
    state, notice = train.start(*SETTINGS, snapshot_every, eval_every, focus_classes=focus_classes,
                                visitor="alice")
    assert notice.startswith("Started run"), notice
    run = runs.get(state.run_id)
    run.join(120)
    assert run.state == "finished"
    return state, run


def _baseline_folders(runs):
    return sorted(folder.name for folder in runs.settings.runs_dir.iterdir() if "-baseline-" in folder.name)


@pytest.mark.slow
def test_a_finished_baseline_is_reused_whatever_the_classes_shown_and_the_status_says_what_it_is(runs):
    state, run = _start(runs, snapshot_every=3, eval_every=1, focus_classes="1, 2")
    train = train_tab.TrainHandlers(runs)
    starting, notice = train.compare(state, visitor="alice")  # at once, then how it went
    assert starting == words.BASELINE_STARTING
    assert notice.startswith("Baseline (N = 0) started: it trains now, on its own")
    run.baseline.join(120)
    assert run.baseline.state == "finished"
    trained = _baseline_folders(runs)
    assert len(trained) == 1
    lines = live_view.status_markdown(run, "alice").split("  \n")
    baseline_line = lines[-1]
    # what it is and how far it got: 2 epochs of 9 steps, 24 real classes and no virtual set
    assert re.fullmatch(re.escape(BASELINE_WORDS) + r": finished · epoch 2 of 2 · step 18 of 18 · "
                        r"classes in use s\(i\) 24 · [\d,]+ images/s", baseline_line), baseline_line
    assert "virtual sets" not in baseline_line

    # the same settings but for what the page draws: other classes shown, other snapshot and evaluation cadences
    state, second = _start(runs, snapshot_every=5, eval_every=2, focus_classes="3, 4, 5")
    starting, notice = train.compare(state, visitor="alice")
    assert starting == words.BASELINE_STARTING
    assert notice.startswith(f"Baseline (N = 0): a finished run of these settings, `{trained[0]}`, loaded rather "
                             "than trained again; it appears in grey on the curves. It was trained with"), notice
    assert second.baseline.folder.name == trained[0] and not second.baseline.training
    assert _baseline_folders(runs) == trained  # none trained again
    baseline_line = live_view.status_markdown(second, "alice").split("  \n")[-1]
    assert baseline_line == (f"{BASELINE_WORDS}: a finished run of these settings, loaded from `{trained[0]}` · "
                             "step 18 of 18")


@pytest.mark.slow
def test_a_baseline_of_other_settings_is_not_reused(runs):
    state, run = _start(runs, snapshot_every=3, eval_every=1, focus_classes="")
    train = train_tab.TrainHandlers(runs)
    list(train.compare(state, visitor="alice"))
    run.baseline.join(120)
    other = (*SETTINGS[:6], 1, *SETTINGS[7:])  # seed 1: another baseline
    state, notice = train.start(*other, 3, 1, visitor="alice")
    runs.get(state.run_id).join(120)
    assert list(train.compare(state, visitor="alice"))[-1].startswith("Baseline (N = 0) started")
    runs.get(state.run_id).baseline.join(120)
    assert len(_baseline_folders(runs)) == 2
