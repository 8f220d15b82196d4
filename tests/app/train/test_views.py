"""The Train tab's new views and controls, called as the page's events call them: the second poll (spread curves and
results table, sent only when changed), the few-class classes chosen live and at Start, the reduction at Start, the
baseline's notice, the few-class picture through the poll's colouring, and the page's words kept to the library."""

import re
import time

import gradio as gr
import numpy as np
import pytest

from demo.common.inputs import whole_numbers
from demo.runs.live_run import LiveRun
from demo.train import live_view
from demo.train import tab as train_tab
from demo.train import views as train_views
from demo.train.poll import PollHandlers, PollState, views_key
from demo.train.views import ViewsHandlers, ViewsSent
from memvir.config import TrainConfig
from memvir.data import load_dataset

SKIP = gr.skip()


def wait_for(condition, seconds=90.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    raise AssertionError("condition not met before the deadline")


def quick(**overrides) -> TrainConfig:
    """glyphs-mini: 9 steps of 32 an epoch; a virtual set from step 4 (warm-up 0.2 epochs = 2 steps, M = 1)."""
    values = dict(dataset="glyphs-mini", batch_size=32, epochs=1, eval_at_start=False, snapshot_every=3, log_every=1,
                  memvir_n=2, memvir_m=1, warmup_epochs=0.2)
    return TrainConfig(**{**values, **overrides})


class StandInFigures:
    def __init__(self):
        self.key = ("r1", 1)

    def spread(self, run):
        return self.key, (f"drift {self.key}", f"spread {self.key}")


class StandInRuns:
    def __init__(self, run=None):
        self.run = run

    def attach(self, visitor, viewed_id=None, after=None):
        return self.run


# ---------------------------------------------------------------------------------------------- the second poll
def test_the_second_poll_sends_the_spread_curves_and_the_results_only_when_they_change(tmp_path):
    runs, figures = StandInRuns(), StandInFigures()
    second = ViewsHandlers(runs, figures)
    sent, drift, spread, results, picked, download = second.poll_views(PollState(), None, visitor="bob")
    assert sent == ViewsSent(None, "", ("", False)) and results == ""
    assert (picked, download) == ("", gr.update(value=None, visible=False))  # no run picked: nothing under the list
    assert "the classes appears at the first snapshot" in drift.layout.annotations[0].text
    assert second.poll_views(PollState(), sent, visitor="bob")[1:] == (SKIP,) * 5

    run = LiveRun("r1", "alice", tmp_path / "r1", quick())
    runs.run = run
    sent, drift, spread, results, *_ = second.poll_views(PollState(), sent, visitor="bob")
    assert (sent, drift, spread, results) == (ViewsSent(("r1", 1), "", ("", False)), "drift ('r1', 1)",
                                              "spread ('r1', 1)", SKIP)
    figures.key = ("r1", 2)
    assert second.poll_views(PollState(), sent, visitor="bob")[1:3] == ("drift ('r1', 2)", "spread ('r1', 2)")


@pytest.mark.slow
def test_the_results_table_reaches_the_page_once_the_run_and_its_baseline_finished(runs):
    run = runs.start(quick(epochs=2), "alice")
    baseline = runs.compare_with_baseline(run.id, "alice")
    run.join(90)
    baseline.join(90)
    from demo.train.live_view import FigureBuilder

    figures = FigureBuilder()
    second = ViewsHandlers(runs, figures)
    try:
        _, drift, spread, results, *_ = second.poll_views(PollState(run_id=run.id), None, visitor="alice")
    finally:
        figures.close()
    final = [record for record in run.records if record["type"] == "eval"][-1]
    assert f"| Recall@1 (test) | {100 * final['recall@1']:.2f} |" in results
    assert "| metric | this run | baseline | difference |" in results and "**Baseline**: N = 0;" in results
    assert [trace.name for trace in spread.data if "baseline" in (trace.name or "")] == [
        "baseline mean cos", "baseline uniformity"]
    assert any(trace.name == "from 2 steps ago" for trace in drift.data)  # M = 1: set 1 is 2 steps old


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """(its RunManager, a quick() run of alice's, finished), shared by the tests that only read a finished run."""
    from demo.common.settings import AppSettings
    from demo.runs.manager import RunManager

    folder = tmp_path_factory.mktemp("finished")
    manager = RunManager(AppSettings(data_dir=folder / "data", checkpoints_dir=folder / "checkpoints", umap=False))
    run = manager.start(quick(), "alice")
    run.join(90)
    wait_for(lambda: not run.busy)
    yield manager, run
    manager.close()


def test_a_new_page_shows_the_latest_snapshot_on_its_first_poll_in_either_picture(finished_run):
    runs, run = finished_run
    last = run.snapshots[-1].step
    figures = live_view.FigureBuilder()
    live = PollHandlers(runs, figures)
    try:
        for picture in ("few", "age"):  # the owner's page reloaded: nothing drawn for it yet
            answer = live.poll(PollState(), picture, True, visitor="alice")
            caption, slider = answer[-4], answer[-3]
            assert f"step {last:,}" in caption and "No snapshot yet" not in caption, caption
            assert slider["value"] == last
    finally:
        figures.close()


def test_a_run_that_ended_after_its_curves_were_drawn_has_every_step_in_them_at_the_next_ask(finished_run):
    """The builder draws a training run's curves every interval; once the run has ended, a poll that asks gets them
    drawn from every record at once, not the drawing from before its last steps (its status already says Finished)."""
    _, run = finished_run
    steps = [record["step"] for record in run.records if record["type"] == "step"]
    assert len(steps) == 9  # glyphs-mini, batch 32, one epoch, every step logged
    figures = live_view.FigureBuilder(interval=3600)  # its own drawing never comes round again in this test
    try:
        every_record = run.records
        with run.lock:
            run.records = every_record[:-4]  # as the builder last saw them, before the last steps and the end
        _, early = figures.curves(run)
        with run.lock:
            run.records = every_record
        _, now = figures.curves(run)
    finally:
        figures.close()

    def loss_steps(curve_figures):
        return [list(trace.x) for trace in curve_figures[0].data if trace.name == "loss"][0]

    assert loss_steps(early) != steps
    assert loss_steps(now) == steps


# ---------------------------------------------------------------------------------------------- controls
def test_the_classes_shown_are_typed_as_distinct_whole_numbers():
    assert whole_numbers(" 3, 17 40 ", "classes", 20) == [3, 17, 40]
    assert whole_numbers("", "classes", 20) == []
    with pytest.raises(ValueError, match="classes: each may appear once, got 3, 3"):
        whole_numbers("3, 3", "classes", 20)
    with pytest.raises(ValueError, match="classes must be a whole number of at least 0, got 2.5"):
        whole_numbers("2.5", "classes", 20)
    with pytest.raises(ValueError, match="classes: at most 2, got 3"):
        whole_numbers("1 2 3", "classes", 2)


def test_start_passes_the_reduction_and_the_classes_shown(runs):
    settings = ("glyphs-mini", "convnet", "norm-softmax", 32, 1, 1e-3, 0, 2, 1, 0.2, 3, 1)
    train = train_tab.TrainHandlers(runs)
    state, notice = train.start(*settings, memvir_reduction="balanced", focus_classes="4, 9, 1", visitor="alice")
    run = runs.get(state.run_id)
    assert (run.config.memvir_reduction, run.config.focus_classes) == ("balanced", [4, 9, 1])
    run.join(90)
    assert run.few_classes.view(None).projection.classes.tolist() == [4, 9, 1]
    with pytest.warns(UserWarning, match="the MemVir loss reduction is one of official, balanced, got mean"):
        assert train.start(*settings, memvir_reduction="mean", visitor="alice")[1].startswith("⚠️")


def test_classes_chosen_live_reach_the_next_snapshots_and_only_the_owner_may_choose(runs):
    run = runs.start(quick(epochs=300), "alice")
    state = PollState(run_id=run.id)
    wait_for(lambda: run.few_classes.steps())
    second = ViewsHandlers(runs, figures=None)
    assert second.show_classes(state, "0, 5, 7", visitor="alice") == (
        "Asked for classes 0, 5, 7: the next snapshot draws them.")
    wait_for(lambda: run.few_classes.view(None).projection.classes.tolist() == [0, 5, 7])
    with pytest.warns(UserWarning, match="this run was started by another visitor"):
        second.show_classes(state, "1, 2", visitor="bob")
    with pytest.warns(UserWarning, match=re.escape("focus_classes [99] are not training classes of glyphs-mini")):
        second.show_classes(state, "99", visitor="alice")
    runs.stop(run.id, "alice")
    run.join(90)
    assert second.show_classes(state, "1", visitor="alice") == (
        "These classes are drawn from the first snapshot of the next run you start.")


def test_the_few_class_picture_is_one_of_the_pictures_a_page_scrubs_and_recolours(runs):
    run = runs.start(quick(epochs=2), "alice")
    run.join(90)
    state = PollState(run_id=run.id)
    live = PollHandlers(runs, figures=None)
    figure, caption = live.recolor(state, True, "few")
    assert re.fullmatch(r"Snapshot 6 of 6 kept · step 18 · PCA · training classes( \d+,){7} \d+", caption)
    kinds = {(trace.meta["kind"], trace.meta["age"]) for trace in figure.data if trace.meta}
    assert {("weights", 0), ("weights", 1), ("weights", 2), ("embeddings", 0)} <= kinds
    # scrubbed back: that snapshot, in whichever picture; the slider's value is the step shown
    _, _, caption, follow, slider = live.show_snapshot(state, 7, "few")
    assert caption.startswith("Snapshot 2 of 6 kept · step 6 · PCA") and follow is False and slider == 6
    assert caption.endswith("  \nNearest kept snapshot before step 7: step 6 (a snapshot every 3 steps).")
    assert live.recolor(PollState(run_id=run.id), False, "age", step=7)[1].startswith("Snapshot 2 of 6 kept · step 6")
    # UMAP asked for where the server runs none: said so
    assert "UMAP is off on this server" in live.recolor(state, True, "few-umap")[1]
    # the drift of the same snapshot's stored weights: a panel per class
    figure, caption = live.recolor(state, True, "few-drift")
    assert re.fullmatch(r"Snapshot 6 of 6 kept · step 18 · true angles · training classes( \d+,){7} \d+", caption)
    assert len(figure.layout.annotations) == 8
    assert {trace.meta["age"] for trace in figure.data if trace.meta} == {0, 1, 2}

    # hover names each point's class as the neighbours of a clicked image do, by the dataset's own name ('Ж U+0416'):
    # training classes in the map, the drift panels (titled by the name alone), all classes' rows and weights; test
    # classes for probes
    data = load_dataset("glyphs-mini")
    drift_titles = [note.text for note in figure.layout.annotations]
    assert drift_titles == [data.train.class_names[label] for label in _focus(live, state)]
    named = 0
    for picture in ("few", "few-drift", "class", "age"):
        for trace in live.recolor(state, True, picture)[0].data:
            if trace.hovertemplate and "class %{text}" in trace.hovertemplate:
                split = data.test if "probe" in trace.hovertemplate else data.train
                labels = [int(np.ravel(row)[0]) for row in trace.customdata]  # a point's class comes first
                assert list(trace.text) == [split.class_names[label] for label in labels], picture
                named += len(labels)
    assert named > 100 and all(re.fullmatch(r". U\+[0-9A-F]{4,5}", name) for name in data.train.class_names)


def _focus(live, state) -> list[int]:
    """The classes the few-class map shows (its meta'd traces' classes)."""
    figure, _ = live.recolor(state, True, "few")
    return sorted({int(row[0]) for trace in figure.data if trace.meta for row in trace.customdata})


def test_the_baseline_notice_says_it_trains_beside_the_run_at_a_cost(runs):
    run = runs.start(quick(epochs=300), "alice")
    train = train_tab.TrainHandlers(runs)
    *_, notice = train.compare(PollState(run_id=run.id), visitor="alice")
    assert "trains beside this run" in notice and "about half its speed" in notice
    # glyphs-mini has no tuned baseline: the notice says the comparison is against the run's own optimiser
    assert "no baseline was tuned for these settings" in notice and run.baseline.config.lr == run.config.lr
    runs.stop(run.id, "alice")
    run.join(90)


def test_the_pages_choices_are_the_librarys():
    from memvir.config import REDUCTIONS

    assert tuple(value for _, value in train_tab.REDUCTION_CHOICES) == REDUCTIONS
    assert tuple(value for _, value in train_views.PICTURE_CHOICES) == live_view.PICTURES


class _RecordingUmap:
    """A UMAP worker that records which runs' few-class views it was asked to lay out."""

    def __init__(self):
        self.watched = []

    def watch(self, track):
        self.watched.append(track)


class _OneRun:
    """What the poll asks of a RunManager: one run, a UMAP worker, and who watches."""

    def __init__(self, run):
        from demo.runs.audience import Audience

        self.run, self.umap_worker, self.audience = run, _RecordingUmap(), Audience()
        self.used = []
        run.use_umap = self.used.append

    def attach(self, visitor, viewed_id=None, after=None):
        return self.run

    def get(self, run_id):
        return self.run


def test_few_class_views_are_laid_out_in_umap_only_once_a_page_shows_them_so(tmp_path):
    run = LiveRun("r1", "alice", tmp_path / "r1", quick())
    runs, figures = _OneRun(run), live_view.FigureBuilder()
    live = PollHandlers(runs, figures)
    try:
        live.poll(PollState(), "few", True, visitor="alice")
        live.recolor(PollState(run_id="r1"), True, "age")
        assert runs.umap_worker.watched == [] and runs.used  # PCA shown: no UMAP work while it trains
        live.poll(PollState(), "few-umap", True, visitor="alice")
        assert runs.umap_worker.watched == [run.few_classes]
        live.recolor(PollState(run_id="r1"), True, "few-umap")  # switching to it asks at once
        assert runs.umap_worker.watched == [run.few_classes, run.few_classes]
    finally:
        figures.close()


def test_the_figures_drawn_in_the_background_are_only_those_a_page_asked_for(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(live_view, "build_curves", lambda run: drawn.append("curves") or ("c1", "c2", "c3"))
    monkeypatch.setattr(live_view, "build_spread", lambda run: drawn.append("spread") or ("s1", "s2"))
    run = LiveRun("r1", "alice", tmp_path / "r1", quick())
    figures = live_view.FigureBuilder(interval=0.01, forget_after=0.3)
    try:
        assert figures.curves(run) == (live_view.curve_key(run), ("c1", "c2", "c3"))  # drawn at once the first time
        run.records.append({"type": "step", "step": 1})  # a new record: the curves are out of date
        wait_for(lambda: drawn.count("curves") == 2, 5)
        time.sleep(0.1)
        assert "spread" not in drawn  # no page asked for the spread figures: never drawn
        assert figures.spread(run)[1] == ("s1", "s2")
        run.records.append({"type": "step", "step": 2, "weight_mean_cos": 0.1})  # with a spread measure: both
        wait_for(lambda: drawn.count("spread") == 2 and drawn.count("curves") == 3, 5)
        time.sleep(0.6)  # no page asks any more: nothing is redrawn after forget_after
        settled = len(drawn)
        run.records.append({"type": "step", "step": 3})
        time.sleep(0.2)
        assert len(drawn) == settled
    finally:
        figures.close()


def test_the_spread_figures_are_drawn_anew_only_with_a_new_spread_measure(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(live_view, "build_curves", lambda run: drawn.append("curves") or ("c1", "c2", "c3"))
    monkeypatch.setattr(live_view, "build_spread", lambda run: drawn.append("spread") or ("s1", "s2"))
    run = LiveRun("r1", "alice", tmp_path / "r1", quick())
    figures = live_view.FigureBuilder(interval=0.01)
    try:
        figures.curves(run), figures.spread(run)
        first_key = figures.spread(run)[0]
        for step in (1, 2, 3):  # steps between snapshots: the curves change, the spread measures do not
            run.records.append({"type": "step", "step": step})
            wait_for(lambda step=step: drawn.count("curves") == step + 1, 5)
        time.sleep(0.1)
        assert drawn.count("spread") == 1 and figures.spread(run)[0] == first_key  # a page polling is sent nothing
        run.records.append({"type": "step", "step": 4, "weight_mean_cos": 0.1})
        wait_for(lambda: drawn.count("spread") == 2, 5)
        assert figures.spread(run)[0] != first_key
        # a live change of M names the virtual sets' ages from its step on, which the next spread measure draws: the
        # curves drawn already keep the ages they were drawn with (demo.train.figures.spread.drift_figure)
        run.live_values["memvir_m"] += 1
        assert live_view.spread_key(run) == figures.spread(run)[0]
    finally:
        figures.close()


def test_the_views_key_changes_with_a_spread_measure_as_either_run_finishes_and_as_it_counts_as_ended(
        tmp_path, monkeypatch):
    from memvir.events import StatusEvent

    monkeypatch.setattr(live_view, "build_curves", lambda run: ("c1", "c2", "c3"))
    monkeypatch.setattr(live_view, "build_spread", lambda run: ("s1", "s2"))
    run = LiveRun("r1", "alice", tmp_path / "r1", quick())
    run.reserved = True  # it trains (a held slot stands for its process)
    run._on_event(StatusEvent("running", 0))
    figures = live_view.FigureBuilder(interval=0.01)
    try:
        assert views_key(figures, None) == "no run"
        seen = [views_key(figures, run)]
        for step in (1, 2, 3):  # steps between snapshots: no second poll
            run.records.append({"type": "step", "step": step})
        time.sleep(0.2)
        assert views_key(figures, run) == seen[-1]
        run.records.append({"type": "step", "step": 4, "weight_mean_cos": 0.1})  # drawn anew in the background
        wait_for(lambda: views_key(figures, run) != seen[-1], 5)
        seen.append(views_key(figures, run))
        run.baseline = LiveRun("r1-baseline", "alice", tmp_path / "b", quick(memvir_n=0))
        run.baseline._on_event(StatusEvent("running", 0))
        wait_for(lambda: views_key(figures, run) != seen[-1], 5)  # the results key at once, its spread next
        time.sleep(0.2)
        seen.append(views_key(figures, run))
        run._on_event(StatusEvent("finished", 9))
        seen.append(views_key(figures, run))
        run.reserved = False  # it counts as ended a moment after its finished status: its model is offered now
        seen.append(views_key(figures, run))
        run.baseline._on_event(StatusEvent("finished", 9))  # the results table can be sent now
        seen.append(views_key(figures, run))
        assert len(set(seen)) == len(seen) == 6
    finally:
        figures.close()


def test_the_first_screen_summarises_the_settings_and_says_what_start_does():
    from demo.train import words

    text = words.first_screen("glyphs", "norm-softmax", 128, 12, 4, 10, 2.0)
    summary, what_happens = text.split("\n\n")
    assert summary == ("**Settings:** glyphs · norm-softmax · batch 128 · 12 epochs · MemVir N = 4, M = 10 after 2 "
                       "warm-up epochs (all below)")
    lines = what_happens.split("  \n")
    assert len(lines) == 3
    # glyphs' preset by hand: 12,251 training images in whole batches of 128 are 95 steps an epoch, 1,140 in 12
    # epochs; the 190 warm-up steps store nothing, and the first virtual set is the step M + 1 = 11 stored steps
    # back, in use from step 190 + 11 + 1
    assert "(glyphs, 1,140 steps) takes about 5 minutes" in lines[0]
    assert "first virtual set arrives at step 202 (about 50 s in), then one more every 11 steps" in lines[1]
    assert "Recall@1" in lines[2] and "classes in use" in lines[2]
    # the summary follows the controls, whatever the dataset
    assert words.first_screen("glyphs-mini", "arcface", 32, 8.0, 0, 10, 1).startswith(
        "**Settings:** glyphs-mini · arcface · batch 32 · 8 epochs · the baseline (N = 0) (all below)")
    assert "N = 3, M = 5 after 0.5 warm-up epochs" in words.first_screen("glyphs", "cosface", 64, 3, 3, 5, 0.5)
