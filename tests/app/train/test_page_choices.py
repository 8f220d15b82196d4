"""A page's choice (Reset, Start, a pick from the runs' list) wins over a poll that began before it and ends after it.

Gradio keeps a page's state on the server and writes what a handler returns when the handler ends: a poll that read
the state before Reset and ends after it wrote the old run back, and the page showed it again (seen as a whole-suite
failure of tests/browser/test_past_runs_browser.py). Here the two calls are ordered by hand: the poll runs in a thread
of its own and is held inside its work (as it reads the run's status) until the visitor's click is answered, then let
go; once more through a served app's HTTP events, as the page's script sends them. Runs an earlier server left stopped
(run folders written here by hand) are what the pages show; one test starts a short real run. Expectations are written
out by hand."""

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from browser_calls import BrowserSession
from served_app import serving

from demo.common.settings import AppSettings
from demo.runs.manager import PageChoices, RunManager
from demo.train import live_view
from demo.train.live_view import FigureBuilder
from demo.train.past_runs import PastRunsHandlers
from demo.train.poll import PollHandlers, PollState
from demo.train.tab import TrainHandlers
from memvir.config import TrainConfig

OLDER = "20261205-093000-glyphs-mini-cosface-memvir-n3-m5-ab12"
NEWER = "20261205-094500-glyphs-mini-cosface-memvir-n3-m5-cd34"
READY = "**Ready.**"
WAIT_S = 120  # bounds every wait on the held poll: a failure, never a pace asserted


def _leave_stopped_run(folder: Path) -> None:
    """A run folder as a server that stopped mid-run leaves it: its settings, a log that ends stopped at step 2, and a
    trainer state to resume from (its content matters only to a resume, which no test here asks)."""
    folder.mkdir(parents=True)
    config = TrainConfig(dataset="glyphs-mini", loss="cosface", memvir_n=3, memvir_m=5, epochs=4)
    (folder / "train_config.json").write_text(json.dumps(config.to_dict()), encoding="utf-8")
    records = [{"type": "step", "step": step, "epoch": 0, "loss": 3.0, "num_classes": 24, "num_virtual_sets": 0,
                "warmup": True} for step in (1, 2)]
    records.append({"type": "status", "state": "stopped", "step": 2, "message": "stopped"})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    (folder / "trainer_state.pt").write_bytes(b"state")


@pytest.fixture
def runs(tmp_path):
    """A server that found two runs an earlier one left stopped: anyone's page shows the newer (RunManager.attach)."""
    settings = AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints", umap=False)
    for name in (OLDER, NEWER):
        _leave_stopped_run(settings.runs_dir / name)
    manager = RunManager(settings)
    yield manager
    manager.close()


@pytest.fixture(scope="module")
def figures():
    builder = FigureBuilder()
    yield builder
    builder.close()


class HeldPoll:
    """A page's poll in a thread of its own, held inside its work (as it reads the run's status line) until `finish`:
    what a poll in flight is when the visitor clicks."""

    def __init__(self, monkeypatch, live: PollHandlers, state: PollState, visitor: str, page):
        self.inside, self.released = threading.Event(), threading.Event()
        self.answer, self.error = None, None
        status = live_view.status_markdown

        def held_status(run, whose):
            if threading.current_thread() is self.thread and not self.inside.is_set():
                self.inside.set()
                assert self.released.wait(WAIT_S), "the held poll was never let go"
            return status(run, whose)

        monkeypatch.setattr(live_view, "status_markdown", held_status)
        self.thread = threading.Thread(target=self._poll, args=(live, state, visitor, page), daemon=True)
        self.thread.start()
        assert self.inside.wait(WAIT_S), "the poll never reached the run's status"

    def _poll(self, live, state, visitor, page):
        try:
            self.answer = live.poll(state, "age", True, visitor=visitor, request=page)
        except BaseException as error:  # re-raised in the test's thread
            self.error = error

    def finish(self) -> tuple:
        """Let the poll go on; its answer (state first, then the status line), which gradio writes last."""
        self.released.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the poll did not end"
        if self.error is not None:
            raise self.error
        return self.answer


def _poll(live, state, visitor, page) -> tuple:
    """(the state a poll writes, its status line)."""
    answer = live.poll(state, "age", True, visitor=visitor, request=page)
    return answer[0], answer[1]


def test_a_reset_wins_over_a_poll_that_began_before_it(runs, figures, monkeypatch):
    live, train, page = PollHandlers(runs, figures), TrainHandlers(runs), SimpleNamespace(session_hash="tab-1")
    shown, status = _poll(live, PollState(), "bob", page)  # a fresh page shows the run an earlier server left
    assert shown.run_id == NEWER and status.startswith("**Stopped**")

    in_flight = HeldPoll(monkeypatch, live, shown, "bob", page)
    reset, message, *_ = train.reset(shown, visitor="bob", request=page)
    assert message == "Reset: choose the settings and press Start." and reset.run_id is None
    written, status = in_flight.finish()[:2]
    # the poll's state is the one gradio writes last: the page shows no run, only runs started since its Reset
    assert (written.run_id, written.picked, written.after) == (None, False, reset.after)
    assert status.startswith(READY), status
    assert _poll(live, written, "bob", page)[0].run_id is None  # and goes on showing none


def test_a_reset_wins_over_a_poll_in_flight_on_a_served_app(tmp_path, monkeypatch):
    """The page's own events over HTTP, as its script sends them: the poll unqueued (one POST), Reset through gradio's
    queue. Gradio keeps the page's state on the server and writes each event's returned state as it ends: the poll
    that began before Reset ends after it."""
    settings = AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints", umap=False)
    _leave_stopped_run(settings.runs_dir / NEWER)
    inside, released = threading.Event(), threading.Event()
    status = live_view.status_markdown

    def held_status(run, whose):  # the first poll after the page is armed is held
        if armed.is_set() and not inside.is_set():
            inside.set()
            assert released.wait(WAIT_S), "the held poll was never let go"
        return status(run, whose)

    armed = threading.Event()
    monkeypatch.setattr(live_view, "status_markdown", held_status)
    with serving(settings) as (url, _):
        page = BrowserSession(url)

        def unqueued(name: str, data: list) -> list:
            body = {"data": data, "fn_index": page.events[name], "session_hash": page.session_hash,
                    "trigger_id": None, "event_data": None}
            answer = httpx.post(url + "gradio_api/run/predict", json=body, timeout=WAIT_S)
            answer.raise_for_status()
            return answer.json()["data"]

        unqueued("load", ["bob"])
        assert unqueued("poll", [None, "age", True, "bob"])[1].startswith("**Stopped**")
        armed.set()
        answers = []
        in_flight = threading.Thread(target=lambda: answers.append(unqueued("poll", [None, "age", True, "bob"])),
                                     daemon=True)
        in_flight.start()
        assert inside.wait(WAIT_S), "the poll never reached the run's status"
        reset = page.call("reset", [None, "bob"])
        assert reset.error is None and reset.data[1] == "Reset: choose the settings and press Start.", reset
        released.set()
        in_flight.join(WAIT_S)
        assert answers and answers[0][1].startswith(READY), answers
        assert unqueued("poll", [None, "age", True, "bob"])[1].startswith(READY)


def test_a_poll_that_wrote_over_a_reset_is_put_right_by_the_next(runs, figures):
    """A poll that ended between Reset's noting on the server and gradio writing Reset's state (or that gradio wrote
    later anyway): the page's next poll, and every handler, follows the Reset."""
    live, train, page = PollHandlers(runs, figures), TrainHandlers(runs), SimpleNamespace(session_hash="tab-1")
    shown, _ = _poll(live, PollState(), "bob", page)
    reset = train.reset(shown, visitor="bob", request=page)[0]
    written, status = _poll(live, shown, "bob", page)  # the old state, as a late write left it
    assert (written.run_id, written.after) == (None, reset.after) and status.startswith(READY)
    listed = PastRunsHandlers(runs).listed(shown, visitor="bob", request=page)
    assert listed["value"] == "follow"
    # the buttons act on what the page shows since Reset (no run), not on the run the late state names
    with pytest.warns(UserWarning):
        assert train.stop(shown, visitor="bob", request=page) == "⚠️ there is no run to control: press Start first"
    scrubbed = live.show_snapshot(shown, 2, "age", request=page)
    assert (scrubbed[0].run_id, scrubbed[0].after) == (None, reset.after)


def test_a_reset_in_one_tab_leaves_the_visitor_s_other_tab_as_it_is(runs, figures):
    """Each tab (a gradio session) has a state of its own, and so a Reset of its own."""
    live, train = PollHandlers(runs, figures), TrainHandlers(runs)
    tab_a, tab_b = SimpleNamespace(session_hash="tab-a"), SimpleNamespace(session_hash="tab-b")
    shown_a, _ = _poll(live, PollState(), "bob", tab_a)
    shown_b, _ = _poll(live, PollState(), "bob", tab_b)
    train.reset(shown_a, visitor="bob", request=tab_a)
    assert _poll(live, shown_a, "bob", tab_a)[0].run_id is None
    assert _poll(live, shown_b, "bob", tab_b)[0].run_id == NEWER


def test_a_pick_wins_over_a_poll_that_began_before_it(runs, figures, monkeypatch):
    live, page = PollHandlers(runs, figures), SimpleNamespace(session_hash="tab-1")
    shown, _ = _poll(live, PollState(), "bob", page)
    assert shown.run_id == NEWER
    in_flight = HeldPoll(monkeypatch, live, shown, "bob", page)
    picked, follow, summary, _ = PastRunsHandlers(runs).pick(shown, OLDER, visitor="bob", request=page)
    assert (picked.run_id, picked.picked, follow) == (OLDER, True, True)
    assert summary.startswith(f"Showing `{OLDER}`")
    written, status = in_flight.finish()[:2]
    assert (written.run_id, written.picked) == (OLDER, True)
    assert status.startswith("**Stopped**"), status
    assert _poll(live, written, "bob", page)[0].run_id == OLDER  # followed from then on


def test_a_reset_after_a_pick_shows_no_run_and_a_pick_after_a_reset_shows_the_one_picked(runs, figures):
    live, train, page = PollHandlers(runs, figures), TrainHandlers(runs), SimpleNamespace(session_hash="tab-1")
    shown, _ = _poll(live, PollState(), "bob", page)
    picked = PastRunsHandlers(runs).pick(shown, OLDER, visitor="bob", request=page)[0]
    reset = train.reset(picked, visitor="bob", request=page)[0]
    assert _poll(live, picked, "bob", page)[0].run_id is None  # a poll with the pick's state, written late
    picked_again = PastRunsHandlers(runs).pick(reset, OLDER, visitor="bob", request=page)[0]
    assert (picked_again.run_id, picked_again.after) == (OLDER, reset.after)
    assert _poll(live, reset, "bob", page)[0].run_id == OLDER  # a poll with Reset's state, written late


@pytest.mark.slow
def test_a_start_wins_over_a_poll_that_began_before_it(runs, figures, monkeypatch):
    """The page shows alice's own stopped run, which it keeps while others start theirs (RunManager.attach): a poll
    that began before her Start wrote it back over her new run."""
    runs.get(NEWER).owner = "alice"  # hers: a run she started on this server, stopped
    live, train, page = PollHandlers(runs, figures), TrainHandlers(runs), SimpleNamespace(session_hash="tab-1")
    shown, _ = _poll(live, PollState(), "alice", page)
    assert shown.run_id == NEWER
    in_flight = HeldPoll(monkeypatch, live, shown, "alice", page)
    # dataset, backbone, loss, batch, epochs, lr, seed, N, M, warm-up, snapshot every, eval every: 9 steps
    started, notice = train.start("glyphs-mini", "convnet", "norm-softmax", 32, 1, 1e-3, 0, 2, 1, 0.2, 0, 0,
                                  visitor="alice", request=page)
    assert notice == f"Started run `{started.run_id}`"
    written, status = in_flight.finish()[:2]
    assert written.run_id == started.run_id != NEWER
    assert _poll(live, written, "alice", page)[0].run_id == started.run_id


def test_page_choices_are_stamped_in_order_per_page_and_the_oldest_page_goes_first():
    choices = PageChoices(kept=2)
    first = choices.choose("tab-a", after=10.0)
    second = choices.choose("tab-b", run_id="r1")
    assert 0 < first.stamp < second.stamp
    assert choices.latest("tab-a") == first and choices.latest("tab-b") == second
    third = choices.choose("tab-a", run_id="r2", picked=True)  # tab-a chose last: tab-b is now the oldest
    assert (third.stamp, third.run_id, third.after, third.picked) == (second.stamp + 1, "r2", None, True)
    choices.choose("tab-c")
    assert choices.latest("tab-b") is None and choices.latest("tab-a") == third
    # no page (a client of the API, a test calling a handler): nothing noted, nothing to order
    assert choices.choose(None, run_id="r3").stamp == 0 and choices.latest(None) is None
