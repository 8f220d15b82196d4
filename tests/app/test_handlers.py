"""The page's handlers called directly, as the page's events call them, without a browser or a server: the poll's
state machine over a run with stand-in figures, the Train tab's refusals and a real start and stop, the snapshot
scrubber, the Retrieve tab's searches on a tiny checkpoint, and the page assembled with every api_name and the
parameter names clients send."""

import html
import inspect
import io
import re
import time
import typing
import zipfile
from types import SimpleNamespace

import gradio as gr
import pytest
import torch
from gradio.utils import get_type_hints as gradio_type_hints
from PIL import Image

from demo.common.handlers import reporting
from demo.common.inputs import InputRefused, box_number
from demo.common.settings import AppSettings
from demo.page import App, PageHandlers, build_app
from demo.retrieve import tab as retrieve_tab
from demo.retrieve.service import RetrievalService
from demo.runs.audience import Audience
from demo.runs.live_run import LiveRun
from demo.runs.manager import PageChoices, RunManager
from demo.train import live_view, words
from demo.train import tab as train_tab
from demo.train.poll import ControlsSent, CurvesSent, EmbeddingSent, PollHandlers, PollState
from demo.train.presets import PRESETS
from memvir.analysis.projection import project_snapshot
from memvir.config import TrainConfig
from memvir.events import ControlEvent, ControlRefused, SnapshotEvent, StatusEvent
from memvir.models.embedding_model import EmbeddingModel

SKIP = gr.skip()
DUE = gr.update(active=True)  # the poll starts the page's views timer, which sends the second poll
NO_SNAPSHOT = "No snapshot yet — press Start; the embeddings appear at the first snapshot."
EMPTY_CURVES = "Press Start to train; the curves fill in as it trains."


def _settings(tmp_path) -> AppSettings:
    return AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints", umap=False)


def _message(figure) -> str:
    """The text of an empty figure (live_view's placeholders)."""
    return figure.layout.annotations[0].text


# ---------------------------------------------------------------------------------------------- the poll
class StandInRuns:
    """What the poll asks of a RunManager: the run a page shows, UMAP (off), who watches (a real Audience) and what
    each page chose to show (real PageChoices)."""

    umap_worker = None

    def __init__(self, clock=time.monotonic):
        self.run = None
        self.audience = Audience(clock=clock)
        self.pages = PageChoices()

    def attach(self, visitor, viewed_id=None, after=None):
        return self.run

    def get(self, run_id):
        return self.run if self.run is not None and run_id == self.run.id else None


class StandInFigures:
    """What the poll asks of the FigureBuilder, with strings for figures: the curves and the spread figures at a key,
    the latest snapshot."""

    def __init__(self):
        self.curve_key = ("r1", 1)
        self.spread_key = ("r1", None)
        self.latest = None  # (snapshot key, step), once there is one

    def curves(self, run):
        return self.curve_key, (f"loss {self.curve_key}", f"classes {self.curve_key}", f"cosine {self.curve_key}")

    def spread(self, run):
        return self.spread_key, (f"drift {self.spread_key}", f"spread {self.spread_key}")

    def latest_embedding(self, run, color_by):
        if self.latest is None:
            return None
        key, step = self.latest
        return key, step, f"picture {key} by {color_by}", f"caption of step {step}"


def _split(answer: tuple) -> tuple:
    """A poll's answer as (state, status, the live controls' four, the views' six, timer, views timer)."""
    return answer[0], answer[1], list(answer[2:6]), list(answer[6:-2]), answer[-2], answer[-1]


def _live_run(tmp_path) -> LiveRun:
    run = LiveRun("r1", "alice", tmp_path / "r1", TrainConfig(dataset="glyphs-mini", epochs=5))
    run.total_steps = 45
    run._on_event(StatusEvent("running", 0, "training"))
    return run


def test_a_crowd_s_pages_poll_at_their_share_and_the_owner_s_every_second(tmp_path):
    """40 pages watch alice's run: the 39 others' pages share 4 polls a second (one each 10 s), alice's polls every
    second; the timer is sent only when a page's interval changes, and the status line says why it slowed."""
    now = [0.0]
    runs, figures = StandInRuns(clock=lambda: now[0]), StandInFigures()
    runs.run = _live_run(tmp_path)
    states = {f"v{k}": PollState() for k in range(39)}
    answers = {}
    live = PollHandlers(runs, figures)
    for visitor in states:  # all arrive within a second
        states[visitor], status, *_, timer, _ = live.poll(states[visitor], "age", True, visitor=visitor)
        answers[visitor] = (status, timer)
    # the first four pages are few enough for a poll a second; from the fifth on, ceil(pages / 4) seconds
    assert [answers[f"v{k}"][1] for k in range(4)] == [SKIP] * 4
    assert answers["v4"][1] == gr.update(value=2.0)  # 5 pages / 4
    assert answers["v8"][1] == gr.update(value=3.0) and answers["v38"][1] == gr.update(value=10.0)
    assert "39 pages are watching this run: this one updates every 10 s" in answers["v38"][0]
    assert "pages are watching" not in answers["v0"][0]
    owner_state, status, *_, timer, _ = live.poll(PollState(), "age", True, visitor="alice")
    assert timer == SKIP and "pages are watching" not in status  # 40 pages, but alice owns the run
    # the same interval again: no timer sent
    assert live.poll(states["v38"], "age", True, visitor="v38")[-2] == SKIP
    # the crowd leaves (no poll for 13 s); one page left polls every second again
    now[0] += 13.0
    _, status, *_, timer, _ = live.poll(states["v38"], "age", True, visitor="v38")
    assert timer == gr.update(value=1.0) and "pages are watching" not in status


def test_the_poll_sends_each_view_only_when_what_it_shows_changed(tmp_path):
    runs, figures = StandInRuns(), StandInFigures()

    live = PollHandlers(runs, figures)

    # a fresh page, no run: the empty views once, then nothing new
    state, status, controls, views, timer, due = _split(live.poll(PollState(), "age", True, visitor="bob"))
    assert status.startswith("**Ready.**")
    assert [_message(figure) for figure in views[:3]] == [EMPTY_CURVES] * 3
    assert (_message(views[3]), views[4], views[5]) == (NO_SNAPSHOT, "No snapshot yet.",
                                                       gr.update(maximum=1, value=1))
    assert state == PollState(curves=CurvesSent(None), embedding=EmbeddingSent(None), views="no run",
                              controls=ControlsSent(None))
    assert controls == [SKIP] * 4  # no run: the live controls as the visitor left them
    assert due == DUE  # the page's second poll: the empty spread figures and no results table
    assert timer == SKIP  # one page, no crowd: its timer stays at a poll a second
    again, _, controls, views, timer, due = _split(live.poll(state, "age", True, visitor="bob"))
    assert views == [SKIP] * 6 and again == state and due == SKIP

    # a run starts: its curves, and the picture that says no snapshot yet (the slider stays)
    runs.run = _live_run(tmp_path)
    state, status, controls, views, timer, due = _split(live.poll(state, "age", True, visitor="bob"))
    assert status.startswith("**Training** · step 0 of 45")
    assert "watching a run started by another visitor (read-only)" in status
    assert views[:3] == ["loss ('r1', 1)", "classes ('r1', 1)", "cosine ('r1', 1)"]
    assert (_message(views[3]), views[4], views[5]) == (NO_SNAPSHOT, "No snapshot yet.", SKIP)
    # the spread key as drawn, the results key, and whether it trains (a stand-in run without a process does not)
    running = repr((("r1", None), ("r1", "running", None), False))
    assert state == PollState(run_id="r1", curves=CurvesSent(("r1", 1)), embedding=EmbeddingSent("r1"),
                              controls=ControlsSent("r1"), views=running)
    assert controls == ["", SKIP, SKIP, SKIP]  # it does not train: nothing beside the controls, left as they are
    assert due == DUE
    assert live.poll(state, "age", True, visitor="bob")[2:] == (SKIP,) * 12

    # new records and the first snapshot: both views, the slider moved to the snapshot's step
    figures.curve_key, figures.latest = ("r1", 2), (("r1", 1), 30)
    state, _, controls, views, timer, due = _split(live.poll(state, "age", True, visitor="bob"))
    assert views == ["loss ('r1', 2)", "classes ('r1', 2)", "cosine ('r1', 2)", "picture ('r1', 1) by age",
                     "caption of step 30", gr.update(maximum=30, value=30)]
    assert state.embedding == EmbeddingSent("r1", ("r1", 1), "age")
    assert due == SKIP  # new records without a spread measure: the second poll is not sent

    # a spread measure: the spread figures redrawn, and the page asks for them
    figures.spread_key = ("r1", 30)
    state, _, controls, views, timer, due = _split(live.poll(state, "age", True, visitor="bob"))
    assert views == [SKIP] * 6 and due == DUE and state.views == repr((("r1", 30), ("r1", "running", None), False))

    # another colouring is another picture; the curves are as they were
    state, _, controls, views, timer, due = _split(live.poll(state, "class", True, visitor="bob"))
    assert views == [SKIP] * 3 + ["picture ('r1', 1) by class", "caption of step 30", gr.update(maximum=30, value=30)]

    # not following: only the slider's range, once per change to the run's snapshots
    state, _, controls, views, timer, due = _split(live.poll(state, "class", False, visitor="bob"))
    assert views == [SKIP] * 5 + [gr.update(maximum=1)]  # the run holds no snapshot itself: the range is (0, 1)
    assert state.embedding == EmbeddingSent("r1", ("r1", 0), following=False)
    assert live.poll(state, "class", False, visitor="bob")[2:] == (SKIP,) * 12

    # following again: the latest picture at once
    state, _, controls, views, timer, due = _split(live.poll(state, "class", True, visitor="bob"))
    assert views[3:5] == ["picture ('r1', 1) by class", "caption of step 30"]

    # the run forgotten: the empty views again
    runs.run = None
    state, _, controls, views, timer, due = _split(live.poll(state, "class", True, visitor="bob"))
    assert [_message(figure) for figure in views[:4]] == [EMPTY_CURVES] * 3 + [NO_SNAPSHOT]
    assert state.run_id == "r1"  # the run the page showed last: its buttons still name it


def test_the_live_controls_show_the_run_read_only_to_a_watcher_and_what_became_of_each_change(tmp_path):
    """The sliders follow the run's live values as it confirms them (a watcher's read-only), and the note beside
    them says a change is pending until the run applies it at a step or refuses it, and why; nothing once it ends."""
    runs, figures = StandInRuns(), StandInFigures()
    live = PollHandlers(runs, figures)
    run = runs.run = _live_run(tmp_path)  # the library's N 2, M 50, warm-up 2
    run.reserved = True  # training, as from Start on
    _, _, controls, *_ = _split(live.poll(PollState(), "age", True, visitor="bob"))
    assert controls == ["", gr.update(value=2, interactive=False), gr.update(value=50, interactive=False),
                        gr.update(value=2.0, interactive=False)]
    owner, _, controls, *_ = _split(live.poll(PollState(), "age", True, visitor="alice"))
    assert controls == ["", gr.update(value=2, interactive=True), gr.update(value=50, interactive=True),
                        gr.update(value=2.0, interactive=True)]
    assert _split(live.poll(owner, "age", True, visitor="alice"))[2] == [SKIP] * 4

    # N 2 -> 3 asked: pending beside the controls; N's slider stays where the visitor's hand put it
    run.asked({"memvir_n": 3})
    owner, _, controls, *_ = _split(live.poll(owner, "age", True, visitor="alice"))
    assert controls == ["Asked for N 2 -> 3: pending, the run applies it before its next step.", SKIP, SKIP, SKIP]
    run._on_event(ControlEvent(40, {"memvir_n": 3}, "", previous={"memvir_n": 2}))
    owner, _, controls, *_ = _split(live.poll(owner, "age", True, visitor="alice"))
    assert controls == ["N 2 -> 3: applied at step 41", gr.update(value=3, interactive=True), SKIP, SKIP]

    # M 50 -> 5000 refused when its memory could not be had: why, and M's slider back at the run's 50
    run.asked({"memvir_m": 5000})
    owner, _, controls, *_ = _split(live.poll(owner, "age", True, visitor="alice"))
    assert controls[0] == "Asked for M 50 -> 5000: pending, the run applies it before its next step."
    run._on_event(ControlRefused(50, {"memvir_m": 5000}, "can't allocate memory", ""))
    owner, _, controls, *_ = _split(live.poll(owner, "age", True, visitor="alice"))
    assert controls == ["M 50 -> 5000 refused at step 51: its memory could not be allocated (can't allocate memory); "
                        "the run trains on with N = 3, M = 50", SKIP, gr.update(value=50, interactive=True), SKIP]

    # the run ends: the note goes, and the sliders are everyone's to set for the next Start
    run.reserved = False
    run._on_event(StatusEvent("finished", 60, "finished 60 steps"))
    _, _, controls, *_ = _split(live.poll(owner, "age", True, visitor="alice"))
    assert controls == ["", SKIP, SKIP, SKIP]

def test_a_pages_own_live_change_once_applied_is_not_sent_back_over_the_newer_one_typed_since(tmp_path):
    """N 2 -> 3 asked from a page, and 4 typed there while that ask is on its way: the page sends 4 once the first
    ask is answered, reading the box then (trigger_mode "always_last"). Before, a poll between the run applying 3 and
    that answer sent 3 back to the box, over the 4, and the second ask went out as 3: the run stayed at 3 and the
    visitor's last change was lost. The page that asked is not sent its own applied value; the owner's other tab is;
    a refused ask puts the box back at the run's value."""
    runs, figures = StandInRuns(), StandInFigures()
    live = PollHandlers(runs, figures)
    run = runs.run = _live_run(tmp_path)  # the library's N 2
    run.reserved = True
    tab_a, tab_b = SimpleNamespace(session_hash="tab-a"), SimpleNamespace(session_hash="tab-b")

    def poll(state, tab):
        state, _, controls, *_ = _split(live.poll(state, "age", True, visitor="alice", request=tab))
        return state, controls

    page_a, _ = poll(PollState(), tab_a)
    page_b, _ = poll(PollState(), tab_b)
    run.asked({"memvir_n": 3}, page="tab-a")
    page_a, controls = poll(page_a, tab_a)
    assert controls == ["Asked for N 2 -> 3: pending, the run applies it before its next step.", SKIP, SKIP, SKIP]
    run._on_event(ControlEvent(40, {"memvir_n": 3}, "", previous={"memvir_n": 2}))
    page_a, controls = poll(page_a, tab_a)
    assert controls == ["N 2 -> 3: applied at step 41", SKIP, SKIP, SKIP]  # the box keeps what the visitor typed
    page_b, controls = poll(page_b, tab_b)
    assert controls == ["N 2 -> 3: applied at step 41", gr.update(value=3, interactive=True), SKIP, SKIP]

    # the 4 typed meanwhile goes out: applied, it is the page's own again; the other tab follows
    run.asked({"memvir_n": 4}, page="tab-a")
    run._on_event(ControlEvent(45, {"memvir_n": 4}, "", previous={"memvir_n": 3}))
    page_a, controls = poll(page_a, tab_a)
    assert controls == ["N 3 -> 4: applied at step 46", SKIP, SKIP, SKIP]
    page_b, controls = poll(page_b, tab_b)
    assert controls[1] == gr.update(value=4, interactive=True)

    # refused: the box that asked goes back to the run's N, as the note says
    run.asked({"memvir_n": 40}, page="tab-a")
    page_a, controls = poll(page_a, tab_a)
    run._on_event(ControlRefused(50, {"memvir_n": 40}, "can't allocate memory", ""))
    page_a, controls = poll(page_a, tab_a)
    assert controls[1] == gr.update(value=4, interactive=True)
    # a change a client of the API made (no page) reaches every page, the one that asked before too
    run.asked({"memvir_n": 5})
    run._on_event(ControlEvent(55, {"memvir_n": 5}, "", previous={"memvir_n": 4}))
    assert poll(page_a, tab_a)[1][1] == gr.update(value=5, interactive=True)


def _snapshot(step: int) -> SnapshotEvent:
    generator = torch.Generator().manual_seed(step)
    rows = torch.nn.functional.normalize(torch.randn(12, 4, generator=generator), dim=1)
    return SnapshotEvent(step=step, margin=1, embeddings=rows, labels=torch.arange(12) % 3,
                         ages=torch.zeros(12).long(), class_weights=torch.randn(3, 4, generator=generator),
                         class_weight_labels=torch.arange(3), class_weight_ages=torch.zeros(3).long(),
                         probe_embeddings=torch.randn(6, 4, generator=generator),
                         probe_labels=torch.tensor([0, 0, 1, 1, 2, 2]))


def test_scrubbing_shows_the_snapshot_at_that_step_and_stops_following(tmp_path):
    runs = StandInRuns()
    runs.run = _live_run(tmp_path)
    runs.run._project = project_snapshot
    for step in (10, 20, 30):
        runs.run._on_event(_snapshot(step))
    state = PollState(run_id="r1")

    live = PollHandlers(runs, figures=None)
    state, figure, caption, follow, slider = live.show_snapshot(state, 25, "age")
    # let go between two kept snapshots: the slider moves onto the step shown, and the caption says why
    assert (state.scrubbed_step, follow, slider) == (20, False, 20)
    assert caption == ("Snapshot 2 of 3 kept · step 20 · PCA  \nNearest kept snapshot before step 25: step 20 (a "
                       "snapshot every 25 steps).")  # TrainConfig's default cadence
    assert len(figure.data) > 0
    assert live.show_snapshot(state, 20, "age")[2:] == ("Snapshot 2 of 3 kept · step 20 · PCA", False, SKIP)
    assert live.recolor(state, False, "class")[1] == "Snapshot 2 of 3 kept · step 20 · PCA"
    # following: the latest, whose UMAP the worker makes once the run rests
    assert live.recolor(state, True, "class")[1] == "Snapshot 3 of 3 kept · step 30 · PCA · UMAP on its way"
    assert live.show_snapshot(state, 30, "age")[3] is True  # at the last snapshot: following again


def test_a_scrub_between_thinned_snapshots_says_which_is_kept_and_how_sparse_they_are(tmp_path):
    runs = StandInRuns()
    run = runs.run = _live_run(tmp_path)
    run._project, run._snapshot_history = project_snapshot, 4
    for step in range(25, 176, 25):  # every 25 steps (TrainConfig's default), 4 kept: [25, 125, 175] at the end
        run._on_event(_snapshot(step))
    assert [view.step for view in run.snapshots] == [25, 125, 175]
    live = PollHandlers(runs, figures=None)
    _, _, caption, _, slider = live.show_snapshot(PollState(run_id="r1"), 150, "age")
    assert slider == 125 and caption.endswith(
        "  \nNearest kept snapshot before step 150: step 125 (of the snapshots taken every 25 steps, one in 2 is "
        "kept here: the older ones thin out as the run goes on).")
    _, _, caption, _, slider = live.show_snapshot(PollState(run_id="r1"), 100, "age")
    assert slider == 25 and "step 25 (of the snapshots taken every 25 steps, one in 4 is kept here" in caption


def test_a_resting_run_s_umap_says_it_waits_behind_its_baseline_while_that_trains(tmp_path):
    run = _live_run(tmp_path)
    run._project = project_snapshot
    run._on_event(_snapshot(10))
    run.baseline = LiveRun("r1-baseline", "alice", tmp_path / "b", TrainConfig(dataset="glyphs-mini", memvir_n=0),
                           "baseline")
    run.baseline.reserved = True  # training: its process is being started
    training_key = live_view.picture_key(run)
    assert live_view.embedding_view(run, None, "age")[1] == (
        "Snapshot 1 of 1 kept · step 10 · PCA · UMAP waits behind the baseline, training now (UMAP runs at the lowest "
        "priority)")
    run.baseline.reserved = False
    assert live_view.picture_key(run) != training_key  # the picture is drawn again when the baseline ends
    assert live_view.embedding_view(run, None, "age")[1] == "Snapshot 1 of 1 kept · step 10 · PCA · UMAP on its way"


# ---------------------------------------------------------------------------------------------- the Train tab
@pytest.fixture
def runs(tmp_path):
    manager = RunManager(_settings(tmp_path))
    yield manager
    manager.close()


# dataset, backbone, loss, batch size, epochs, lr, seed, N, M, warm-up, snapshot every, eval every
GOOD = ("glyphs-mini", "convnet", "norm-softmax", 32, 200, 1e-3, 0, 2, 2, 0.5, 10, 1)


@pytest.mark.parametrize(("position", "value", "message"), [
    (3, 1.5, "batch size must be a whole number of at least 1, got 1.5"),
    (4, 0, "epochs must be a whole number of at least 1, got 0"),
    (5, -1, "learning rate must be a number above 0, got -1"),
    (7, -2, "N must be an integer >= 0, got -2"),  # N: TrainConfig's to judge, named as the page's control is
    (8, 2.5, "M must be an integer >= 0, got 2.5"),
    (7, None, "N is empty: enter a number"),
    (10, "", "snapshot every is empty: enter a whole number of at least 0"),
    (0, "zip", "upload a zip of class folders first (one folder of images per class)"),
    (0, "folder", "type the path of a folder holding one sub-folder of images per class"),
    (0, "hub", "type the id of a Hub image-classification dataset, OWNER/NAME (e.g. someone/birds)"),
])
def test_start_refuses_bad_settings_with_a_message_and_starts_nothing(runs, position, value, message):
    settings = list(GOOD)
    settings[position] = value
    train = train_tab.TrainHandlers(runs)
    with pytest.warns(UserWarning, match=re.escape(message)):  # gr.Warning outside a request
        assert train.start(*settings, visitor="alice") == (SKIP, f"⚠️ {message}")
    assert runs.runs() == []


def test_a_hub_dataset_id_is_checked_before_a_run_starts(runs):
    train = train_tab.TrainHandlers(runs)
    message = "'hf:no-owner' is not a Hub dataset name: write hf:OWNER/NAME or hf:OWNER/NAME@REVISION"
    with pytest.warns(UserWarning, match=re.escape(message)):
        assert train.start("hub", *GOOD[1:], hub_dataset="no-owner", visitor="alice")[1].startswith(
            f"⚠️ {message}")
    assert runs.runs() == []


@pytest.mark.parametrize(("typed", "read"), [(3.0, 3), (-1.0, -1), (2.5, 2.5), (" 4 ", 4), (7, 7)])
def test_a_number_box_is_read_as_it_shows_and_left_to_the_library_to_judge(typed, read):
    number = box_number(typed, "N")
    assert number == read and type(number) is type(read)  # 3.0 from a slider is the int TrainConfig takes


@pytest.mark.parametrize(("typed", "message"), [
    (None, "N is empty: enter a number"), ("", "N is empty: enter a number"),
    ("three", "N must be a number from -9,007,199,254,740,992 to 9,007,199,254,740,992, got three"),
    (1e300, "N must be a number from -9,007,199,254,740,992 to 9,007,199,254,740,992, got 1e+300"),
])
def test_what_is_no_number_is_refused_naming_its_box(typed, message):
    with pytest.raises(InputRefused, match=f"^{re.escape(message)}$"):
        box_number(typed, "N")


def test_a_refused_n_costs_no_unpacking_of_the_zip(runs, tmp_path):
    """N is TrainConfig's to judge, and judged before the dataset: a zip is never unpacked for a run N refuses."""
    upload = tmp_path / "classes.zip"
    with zipfile.ZipFile(upload, "w") as archive:
        for name in ("a/1.png", "a/2.png", "b/1.png", "b/2.png"):
            buffer = io.BytesIO()
            Image.new("L", (8, 8), 128).save(buffer, "PNG")
            archive.writestr(name, buffer.getvalue())
    settings = list(GOOD)
    settings[0], settings[7] = "zip", -1
    message = "N must be an integer >= 0, got -1"
    with pytest.warns(UserWarning, match=re.escape(message)):
        assert train_tab.TrainHandlers(runs).start(*settings, zip_file=str(upload), visitor="alice") == (
            SKIP, f"⚠️ {message}")
    assert not runs.settings.uploads_dir.exists() or not any(runs.settings.uploads_dir.iterdir())
    assert runs.runs() == []

def test_controls_without_a_run_say_what_to_do(runs):
    state = PollState()
    train = train_tab.TrainHandlers(runs)
    with pytest.warns(UserWarning):
        assert train.stop(state, visitor="alice") == "⚠️ there is no run to control: press Start first"
        assert train.push_to_hub(state, "me/x", visitor="alice") == (
            "⚠️ there is no run to push: train one first")
        assert train.resume(state, visitor="alice") == ("⚠️ there is no run to control: press Start first", SKIP)
        # Compare says at once that the baseline is starting; the refusal is its last word
        assert list(train.compare(state, visitor="alice")) == [
            words.BASELINE_STARTING, "⚠️ there is no run to control: press Start first"]
        # a visitor key that is not text is refused before anything is said
        assert list(train.compare(state, visitor="\x00")) == [
            "⚠️ the page's visitor key (reload the page for a new one) holds a control character (U+0000): remove it "
            "and try again"]
    assert train.update(state, "memvir_n", 3, visitor="alice") == (
        "The new MemVir settings apply when you press Start.")
    assert train_tab.dataset_inputs("zip") == (gr.update(visible=False), gr.update(visible=True),
                                               gr.update(visible=False))
    assert train_tab.dataset_inputs("hub") == (gr.update(visible=False), gr.update(visible=False),
                                               gr.update(visible=True))


def test_start_then_stop_and_reset_to_the_librarys_defaults(runs):
    before = time.time()
    train = train_tab.TrainHandlers(runs)
    state, notice = train.start(*GOOD, memvir_schedule=None, memvir_store_dtype=None, visitor="alice")
    (run,) = runs.runs()
    assert (state, notice) == (PollState(run_id=run.id), f"Started run `{run.id}`")
    # unset choices take the library's defaults; the page's own departures from them apply
    assert (run.config.memvir_schedule, run.config.memvir_store_dtype, run.config.eval_at_start) == (
        "curriculum", "float32", False)
    assert (run.owner, run.config.batch_size, run.config.epochs, run.config.snapshot_every) == ("alice", 32, 200, 10)
    with pytest.warns(UserWarning, match="another visitor's run is training"):
        assert train.start(*GOOD, visitor="bob")[1].startswith("⚠️ another visitor's run is training")
    with pytest.warns(UserWarning, match="this run was started by another visitor"):
        assert train.stop(state, visitor="bob").startswith("⚠️ this run was started by another visitor")

    # a live change, then the page reloaded: its sliders show the run's values (N 3, not the settings it started
    # with), and a change of M from a page that still shows N 4 leaves N alone
    # the note beside the controls is the poll's alone (an answer here could land after its newer one); the run
    # notes which page asked, whose box is then not sent its own value back (the poll)
    tab = SimpleNamespace(session_hash="tab-1")
    assert train.update(state, "memvir_n", 3.0, visitor="alice", request=tab) == SKIP
    assert run.last_asks == {"memvir_n": ("tab-1", 3)}
    page = PageHandlers(runs, RetrievalService(runs.settings))
    assert page.load(visitor="alice")[4:7] == (3, 2, 0.5)
    watcher = page.load(visitor="bob")  # another visitor's page watches the run that trains, and sees it as it is
    assert watcher[1].run_id == run.id and watcher[4:7] == (3, 2, 0.5)
    assert train.update(state, "memvir_m", 5, visitor="alice") == SKIP
    with run.lock:
        assert (run.pending.get("memvir_n", run.live_values["memvir_n"]),
                run.pending.get("memvir_m", run.live_values["memvir_m"])) == (3, 5)

    reset_state, message, *values, memvir_notice, classes_notice = train.reset(state, visitor="alice")
    assert message == "Stopped the run (its folder is kept for retrieval) and reset the settings."
    assert reset_state.run_id is None and reset_state.after >= before
    library = TrainConfig()
    # the library's defaults with glyphs' preset (demo.train.presets: its N, M, warm-up, reduction and optimiser,
    # 12 epochs), the loss it was chosen with, then the classes shown emptied
    preset = PRESETS["glyphs"]
    assert values == [preset.memvir_n, preset.memvir_m, preset.warmup_epochs, 128, 12, preset.optimiser.lr,
                      library.seed, library.memvir_schedule, library.val_classes, library.memvir_store_dtype,
                      preset.memvir_reduction, preset.optimiser.class_lr, preset.optimiser.adam_eps, "norm-softmax",
                      preset.optimiser.scale, ""]
    assert memvir_notice == classes_notice == ""  # the answers beside the sliders and the classes box: about that run
    run.join(60)
    assert run.state == "stopped"


def test_a_page_opened_gets_a_visitor_key_and_the_checkpoints(runs, tmp_path):
    retrieval = RetrievalService(runs.settings)
    page = PageHandlers(runs, retrieval)
    visitor, state, push_button, note, n, m, warmup, checkpoints = page.load(visitor="")
    assert (n, m, warmup) == (gr.update(), gr.update(), gr.update())  # no run to show: the sliders as they are
    assert re.fullmatch(r"[0-9a-f]{32}", visitor) and state == PollState()
    assert checkpoints == gr.update(choices=[])
    assert page.load(visitor="kept")[0] == "kept"
    # A page whose Start beat its load event: the load adopts the session's key, under which that run was started,
    # so the page owns its run (a fresh key here would make it "another visitor's" run, its Stop refused).
    assert page.load(visitor="", request=SimpleNamespace(session_hash="abc123"))[0] == "abc123"


# ---------------------------------------------------------------------------------------------- the Retrieve tab
def _captions(tiles_html: str) -> list[str]:
    """The result tiles' captions as plain text (each image's alternative text, demo.retrieve.tiles)."""
    return [html.unescape(text) for text in re.findall(r'<img [^>]*alt="([^"]*)"', tiles_html)]


@pytest.fixture(scope="module")
def retrieval(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieve-tab")
    torch.manual_seed(0)
    EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                   dataset="glyphs-mini").save_pretrained(root / "checkpoints" / "tiny")
    service = RetrievalService(AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False))
    return service, str(root / "checkpoints" / "tiny")


def test_searches_from_the_retrieve_tab(retrieval, tmp_path):
    from memvir.data import load_dataset

    service, checkpoint = retrieval
    handlers = retrieve_tab.RetrieveHandlers(service)
    about, tiles, picked = handlers.prepare(checkpoint, "test split")
    assert about.startswith("**Checkpoint** `tiny`: convnet, 16-d, trained on `glyphs-mini`.  \n**Gallery**: the "
                            "glyphs-mini test split, 288 images.")
    assert len(tiles) == 24 and picked["sample"][:3] == [0, 12, 24]

    split = load_dataset("glyphs-mini").test
    query = tmp_path / "query.png"
    split.image(40).save(query)
    class_name = split.class_names[split.labels[40]]
    about, tiles, seen = handlers.search_upload(checkpoint, "test split", 3, class_name.split(" ")[0],
                                                str(query))
    captions = _captions(tiles)
    assert captions[0] == f"#1 1.000 {class_name} same class"  # the query's own copy in the gallery, named in full
    assert len(captions) == 3 and isinstance(seen, Image.Image)
    assert about.endswith(f"3 nearest of 288 images in the glyphs-mini test split, with their cosine similarity · "
                          f"{sum(c.endswith(' same class') for c in captions)} of 3 share the query's class "
                          f"({class_name}).")

    about, tiles, _ = handlers.search_gallery_item(checkpoint, "test split", 2, picked,
                                                   evt=SimpleNamespace(index=1))
    assert len(_captions(tiles)) == 2 and "share the query's class" in about


@pytest.mark.parametrize(("handler", "arguments", "message"), [
    ("prepare", ("", "test split"), "choose a checkpoint, or type a Hub repo id such as owner/name"),
    ("search_upload", (None, "test split", 3, "", None), "upload a query image first"),
    ("search_drawing", (None, "test split", 3, "", None), "draw a character on the sketchpad first"),
    ("search_gallery_item", (None, "test split", 3, {"sample": [0], "gallery": "another"}),
     "the gallery changed: press Load again, then pick an image"),
])
def test_retrieve_tab_refusals(retrieval, handler, arguments, message):
    service, checkpoint = retrieval
    arguments = tuple(checkpoint if argument is None and index == 0 else argument
                      for index, argument in enumerate(arguments))
    with pytest.warns(UserWarning):
        assert getattr(retrieve_tab.RetrieveHandlers(service), handler)(*arguments)[0] == f"⚠️ {message}"


# ---------------------------------------------------------------------------------------------- the page
class _Pusher:
    """A handler class as the page's are: its context an attribute, its handler a method `reporting` decorates."""

    def __init__(self, hub):
        self.hub = hub

    @reporting(message_slot=0, outputs=2)
    def push(self, repo_id, visitor=None, request: gr.Request = None):
        return f"pushed {repo_id} to {self.hub}", visitor


def test_a_methods_texts_are_checked_under_their_own_names_self_aside():
    """`self` is a method's first parameter and its first argument: the texts passed after it, by position or by
    name, are still paired with their own parameters, and what Gradio reads of the bound method leaves it out."""
    handlers = _Pusher("the hub")
    assert handlers.push("me/x", "v") == ("pushed me/x to the hub", "v")
    with pytest.warns(UserWarning, match="the repo id is 1,001 characters long"):
        assert handlers.push("x" * 1001, "v") == ("⚠️ the repo id is 1,001 characters long; at most 1,000 are "
                                                  "accepted: shorten it", SKIP)
    with pytest.warns(UserWarning, match=re.escape("the page's visitor key (reload the page for a new one) holds a "
                                                   "control character (U+0000)")):
        handlers.push("me/x", "\x00")
    with pytest.warns(UserWarning, match="the repo id holds a control character"):
        handlers.push(repo_id="\x00")
    assert list(inspect.signature(handlers.push).parameters) == ["repo_id", "visitor", "request"]
    assert gradio_type_hints(handlers.push)["request"] is gr.Request  # how Gradio knows to pass the request


# The app's public endpoints, the client API (demo.api), and the parameters a client sends, as gradio_client names
# them; docs/app.md lists the same endpoints (tests/app/test_client_api.py checks it).
API = {
    "/start_run": ["dataset", "backbone", "loss", "batch_size", "epochs", "lr", "seed", "memvir_n", "memvir_m",
                   "warmup_epochs", "snapshot_every", "eval_every", "folder_path", "zip_file", "memvir_schedule",
                   "val_classes", "memvir_store_dtype", "memvir_reduction", "focus_classes", "class_lr", "adam_eps",
                   "loss_scale", "hub_dataset", "visitor"],
    "/run_status": ["run_id", "history", "visitor"], "/list_runs": ["visitor"],
    "/update_run": ["setting", "value", "run_id", "visitor"],
    "/stop_run": ["run_id", "visitor"], "/pause_run": ["run_id", "visitor"], "/resume_run": ["run_id", "visitor"],
    "/compare_with_baseline": ["run_id", "visitor"], "/push_run": ["repo_id", "run_id", "visitor"],
    "/checkpoints": [], "/gallery": ["checkpoint", "gallery_files"],
    "/search": ["checkpoint", "query_image", "item", "k", "query_class", "drawn", "gallery_files", "cutoff"],
    "/compare": ["checkpoint", "second_checkpoint", "query_image", "item", "k", "query_class", "drawn", "gallery_files",
                 "cutoff"],
    "/hardest": ["checkpoint", "order", "count", "second_checkpoint", "gallery_files"],
    "/class_metrics": ["checkpoint", "second_checkpoint", "gallery_files", "confused_pairs"],
    "/threshold": ["checkpoint", "fmr", "cutoff", "gallery_files"], "/checkpoint_zip": ["checkpoint"],
    "/gallery_embeddings": ["checkpoint", "gallery_files"],
}
# The page's own events: wired in the browser, no endpoint a client can call.
PRIVATE = {"load", "dataset_choice", "suggest_settings", "loss_scale", "reset", "show_snapshot", "color_snapshot",
           "follow_snapshots", "poll_views", "views_due", "show_classes", "query_class_hint",
           "query_class_hint_after_load", "clear_sketch", "list_second_checkpoints", "remember_pick",
           "threshold_as_cutoff", "threshold_view_with_cutoff", "show_gallery_upload", "pick_query_class",
           "snapshot_neighbours", "search_result_tile", "update_n", "update_m", "update_warmup", "first_screen",
           "poll", "start", "stop", "pause", "resume", "compare_baseline", "push_to_hub", "list_checkpoints",
           "prepare_retrieval", "download_checkpoint", "export_gallery", "search_upload", "search_drawing",
           "search_gallery_item", "compare_gallery_item", "compare_upload", "compare_drawing", "hardest_queries",
           "per_class_metrics", "threshold_view", "list_runs_on_load", "list_runs_on_page", "list_runs_after_start",
           "list_runs_after_reset", "pick_run", "sample_for_pick"}


def test_the_page_is_assembled_with_every_api_name_and_the_parameter_names_clients_send(tmp_path):
    app = build_app(_settings(tmp_path))
    try:
        assert isinstance(app, App) and isinstance(app.blocks, gr.Blocks)
        assert app.retrieval_service.settings is app.settings is app.run_manager.settings
        endpoints = app.blocks.get_api_info()["named_endpoints"]
        assert {name: [parameter["parameter_name"] for parameter in endpoint["parameters"]]
                for name, endpoint in endpoints.items()} == API
        visibility = {block_fn.api_name: block_fn.api_visibility for block_fn in app.blocks.fns.values()
                      if block_fn.fn is not None}  # the browser-only events (js, no handler) are private anyway
        assert {name for name, seen in visibility.items() if seen == "private"} == PRIVATE
        # Gradio passes gr.Request and gr.SelectData by their annotations, and silently passes nothing when they
        # cannot be resolved: every handler's must
        hints = {block_fn.api_name: typing.get_type_hints(block_fn.fn) for block_fn in app.blocks.fns.values()
                 if block_fn.fn is not None}  # events that run only in the browser have no handler
        assert {name for name, found in hints.items() if found.get("request") is gr.Request} == {
            "load", "poll", "start", "stop", "pause", "resume", "compare_baseline", "reset", "update_n", "update_m",
            "update_warmup", "push_to_hub", "poll_views", "show_classes", "start_run", "run_status",
            "update_run", "stop_run", "pause_run", "resume_run", "compare_with_baseline", "push_run", "list_runs",
            "list_runs_on_load", "list_runs_on_page", "list_runs_after_start", "list_runs_after_reset", "pick_run",
            # the page's session: they follow its latest Reset, Start or pick (demo.train.poll.current_state)
            "show_snapshot", "color_snapshot", "follow_snapshots", "snapshot_neighbours"}
        assert hints["search_gallery_item"]["evt"] is gr.SelectData
        # a refusal answers every output its event has (reporting's count), the message in its place
        counts = {block_fn.api_name: (block_fn.fn.reported_outputs, len(block_fn.outputs))
                  for block_fn in app.blocks.fns.values() if hasattr(block_fn.fn, "reported_outputs")}
        assert len(counts) > 20 and {name for name, (said, wired) in counts.items() if said != wired} == set()
        # every gr.Tabs holds tabs only: a component made beside them (a gr.State made while wiring, say) makes
        # gradio draw a tab's button twice once it is opened
        config = app.blocks.get_config_file()
        types = {component["id"]: component["type"] for component in config["components"]}

        def strays(node):
            inside = node.get("children", [])
            found = [types[child["id"]] for child in inside if types.get(node["id"]) == "tabs"
                     and types[child["id"]] != "tabitem"]
            return found + [stray for child in inside for stray in strays(child)]

        assert strays(config["layout"]) == []
    finally:
        app.close()
