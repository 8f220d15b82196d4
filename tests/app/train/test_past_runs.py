"""The Train tab's "Runs on this server" (demo.train.past_runs) and the client API's /list_runs, called as the page's
events call them, on one server of the module's own: a run alice trained there (a short real one) and a run an
earlier server left stopped (a run folder written here by hand, read back as a restart reads it). Expectations come
from the runs' own folders (metrics.jsonl, train_config.json) and from the words written out here."""

import json
import time
import zipfile
from pathlib import Path

import gradio as gr
import pytest

from demo.api import RunApi
from demo.common.settings import AppSettings
from demo.runs.manager import RunManager
from demo.train import past_runs
from demo.train.live_view import FigureBuilder
from demo.train.past_runs import FOLLOW, FOLLOW_LABEL, PastRunsHandlers
from demo.train.poll import PollHandlers, PollState, shown_run, views_key
from demo.train.tab import TrainHandlers
from demo.train.views import ViewsHandlers, ViewsSent
from memvir.config import TrainConfig

pytestmark = pytest.mark.slow  # one real run of 9 steps, shared by the module

RESTORED = "20261205-093000-glyphs-mini-cosface-memvir-n3-m5-ab12"
RESTORED_STEPS = (1, 2, 3, 4)


def _leave_stopped_run(folder: Path) -> None:
    """A run folder as a server that stopped mid-run leaves it: its settings, its log up to step 4 with a stopped
    status, and a trainer state to resume from (its content matters only to a resume, which no test here asks)."""
    folder.mkdir(parents=True)
    config = TrainConfig(dataset="glyphs-mini", loss="cosface", memvir_n=3, memvir_m=5, epochs=4)
    (folder / "train_config.json").write_text(json.dumps(config.to_dict()), encoding="utf-8")
    records = [{"type": "step", "step": step, "epoch": 0, "loss": 3.0 - 0.1 * step, "num_classes": 24,
                "num_virtual_sets": 0, "warmup": True} for step in RESTORED_STEPS]
    records.append({"type": "status", "state": "stopped", "step": RESTORED_STEPS[-1], "message": "stopped"})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    (folder / "trainer_state.pt").write_bytes(b"state")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(the runs, alice's finished run, the restored run)."""
    root = tmp_path_factory.mktemp("past-runs")
    settings = AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False)
    _leave_stopped_run(settings.runs_dir / RESTORED)
    runs = RunManager(settings)
    # glyphs-mini: 9 steps of 32 an epoch; a snapshot every 3 steps, evaluated at the end
    alice = runs.start(TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=1, eval_at_start=False,
                                   snapshot_every=3, log_every=1, memvir_n=2, memvir_m=1, warmup_epochs=0.2), "alice")
    deadline = time.monotonic() + 120
    while (alice.training or alice.state != "finished") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alice.state == "finished", alice.message
    yield runs, alice, runs.get(RESTORED)
    runs.close()


@pytest.fixture(scope="module")
def figures():
    builder = FigureBuilder()
    yield builder
    builder.close()


def test_the_list_names_every_run_newest_first_by_state_settings_owner_and_start(server):
    runs, alice, restored = server
    assert restored is not None and restored.state == "stopped"
    update = PastRunsHandlers(runs).listed(PollState(), visitor="bob")
    assert update["value"] == FOLLOW
    labels = dict((value, label) for label, value in update["choices"])
    assert update["choices"][0] == (FOLLOW_LABEL, FOLLOW)
    assert [value for _, value in update["choices"][1:]] == [alice.id, RESTORED]  # alice's started after the restart
    started = time.strftime("%d %b %H:%M", time.localtime(alice.started_at))
    assert labels[alice.id] == (f"Finished · glyphs-mini, norm-softmax, N = 2, M = 1, 1 epoch · another visitor's · "
                                f"started {started} · {alice.id}")
    # the restored run started when its folder was written, not when this server read it back
    written = (runs.settings.runs_dir / RESTORED / "train_config.json").stat().st_mtime
    assert labels[RESTORED] == (f"Stopped · glyphs-mini, cosface, N = 3, M = 5, 4 epochs · left by an earlier server"
                                f" · started {time.strftime('%d %b %H:%M', time.localtime(written))} · {RESTORED}")
    assert "· yours ·" in dict((v, k) for k, v in PastRunsHandlers(runs).listed(
        PollState(), visitor="alice")["choices"])[alice.id]


def test_a_picked_run_is_what_the_poll_shows_with_its_curves_and_what_the_buttons_act_on(server, figures):
    runs, alice, _ = server
    pick, poll = PastRunsHandlers(runs).pick, PollHandlers(runs, figures).poll
    # alice's page shows her own run; she picks the run a restart left
    assert shown_run(runs, PollState(), "alice") is alice
    state, follow, summary, download = pick(PollState(), RESTORED, visitor="alice")
    assert state == PollState(run_id=RESTORED, picked=True) and follow is True
    assert summary.startswith(f"Showing `{RESTORED}` (your buttons act on it)")  # nobody's: anyone may resume it
    assert download["visible"] is False  # a stopped run's folder without a model
    answer = poll(state, "few", True, visitor="alice")
    new_state, status = answer[0], answer[1]
    assert new_state.run_id == RESTORED and new_state.picked
    assert status.startswith(f"**Stopped** · step {RESTORED_STEPS[-1]}")
    loss_figure = answer[6]  # after the state, the status line, the note beside the live controls and 3 sliders
    assert [list(trace.x) for trace in loss_figure.data if trace.name and "loss" in trace.name.lower()] == [
        list(RESTORED_STEPS)]
    # the list says what the page shows
    assert PastRunsHandlers(runs).listed(new_state, visitor="alice")["value"] == RESTORED

    # "Follow my run" gives the page her own run back
    state, follow, summary, download = pick(new_state, FOLLOW, visitor="alice")
    assert state == PollState() and summary == ""
    assert poll(state, "few", True, visitor="alice")[0].run_id == alice.id


def test_picking_the_run_the_page_shows_anyway_follows_again(server):
    runs, alice, _ = server
    state, *_ = PastRunsHandlers(runs).pick(PollState(run_id=RESTORED, picked=True), alice.id, visitor="alice")
    assert state == PollState()


def test_another_visitor_picks_a_finished_run_watches_it_and_downloads_its_model_but_cannot_push_it(server):
    runs, alice, _ = server
    state, _, summary, download = PastRunsHandlers(runs).pick(PollState(), alice.id, visitor="bob")
    assert state.picked and state.run_id == alice.id
    assert "another visitor's run: you watch it, only they may steer or push it" in summary
    final = [record for record in (alice.folder / "metrics.jsonl").read_text().splitlines()
             if json.loads(record).get("type") == "eval"][-1]
    final = json.loads(final)
    assert f"**Its last evaluation** (step {final['step']:,}, %)" in summary
    assert f"| Recall@1 (test) | {100 * final['recall@1']:.2f} |" in summary
    assert download["visible"] is True
    with zipfile.ZipFile(download["value"]) as archive:
        names = sorted(Path(name).name for name in archive.namelist())
        assert names == ["README.md", "config.json", "model.safetensors"]
        card = next(name for name in archive.namelist() if name.endswith("README.md"))
        assert archive.read(card) == (alice.folder / "README.md").read_bytes()
    # the buttons act on the run picked, and refuse bob
    assert TrainHandlers(runs).push_to_hub(state, "bob/model", visitor="bob").endswith(
        "only the visitor who started this run can push it")


def test_a_run_picked_while_it_trained_gets_its_final_figures_and_model_when_it_ends_without_a_pick_again(
        server, figures):
    """Before, the words under the list said 'pick it again then' and stayed so after the run picked had ended. The
    page's second poll, which the views key sends when the run shown ends (its results key holds its state), brings
    them: its last evaluation and its model to download; then they are not sent again."""
    runs, alice, _ = server
    second = ViewsHandlers(runs, figures)
    state = PollState(run_id=alice.id, picked=True)
    # what bob's page was sent while alice's run trained: the status and curves follow it through the polls
    while_training = ViewsSent(None, "", (f"Showing `{alice.id}` (another visitor's run: ...). Pick the first line "
                                          "...\nIts final figures and its model come here when it ends.", False))
    sent, *_, summary, download = second.poll_views(state, while_training, visitor="bob")
    final = json.loads([record for record in (alice.folder / "metrics.jsonl").read_text().splitlines()
                        if json.loads(record).get("type") == "eval"][-1])
    assert f"| Recall@1 (test) | {100 * final['recall@1']:.2f} |" in summary and sent.picked == (summary, True)
    assert download["visible"] is True and Path(download["value"]).name == f"{alice.id}.zip"
    assert second.poll_views(state, sent, visitor="bob")[-2:] == (gr.skip(), gr.skip())
    # following the usual run again (the first line): nothing under the list
    assert second.poll_views(PollState(), sent, visitor="bob")[-2:] == ("", gr.update(value=None, visible=False))


def test_a_picked_run_s_model_comes_once_it_counts_as_ended_though_its_words_came_before(server, figures,
                                                                                           monkeypatch):
    """A run's finished status and last evaluation reach the page before the run counts as ended (no longer
    training: demo.runs.process notes the last word after the listener has it), and its model is offered only then
    (past_runs.has_model). Before, the second poll that brought the words left the model out
    and was never sent again (the words did not change): a watcher's page never offered it (a browser check caught
    it on a busy machine). Now the views key changes as the run ends, and the second poll sends the model."""
    runs, alice, _ = server
    second = ViewsHandlers(runs, figures)
    state = PollState(run_id=alice.id, picked=True)
    monkeypatch.setattr(alice, "reserved", True)  # not yet counted as ended (a held slot stands for it)
    ending = views_key(figures, alice)
    sent, *_, summary, download = second.poll_views(state, None, visitor="bob")
    assert "| Recall@1 (test) |" in summary and download == gr.update(value=None, visible=False)
    assert sent.picked == (summary, False)
    monkeypatch.setattr(alice, "reserved", False)  # ended
    assert views_key(figures, alice) != ending  # the page sends its second poll again
    sent, *_, words, download = second.poll_views(state, sent, visitor="bob")
    assert words == summary and download["visible"] is True and Path(download["value"]).name == f"{alice.id}.zip"
    assert second.poll_views(state, sent, visitor="bob")[-2:] == (gr.skip(), gr.skip())


def test_a_model_whose_zip_failed_is_zipped_again_at_the_next_second_poll(server, figures, monkeypatch):
    """model_zip gives None where the folder changed under it: what was sent says no model was offered, so the next
    second poll tries again instead of skipping."""
    runs, alice, _ = server
    second = ViewsHandlers(runs, figures)
    state = PollState(run_id=alice.id, picked=True)
    real_zip = past_runs.model_zip
    monkeypatch.setattr(past_runs, "model_zip", lambda runs, run: None)
    sent, *_, summary, download = second.poll_views(state, None, visitor="bob")
    assert download == gr.update(value=None, visible=False) and sent.picked == (summary, False)
    monkeypatch.setattr(past_runs, "model_zip", real_zip)
    sent, *_, download = second.poll_views(state, sent, visitor="bob")
    assert download["visible"] is True and sent.picked == (summary, True)


def test_a_run_the_server_no_longer_keeps_is_refused_in_words(server):
    runs, _, _ = server
    before = PollState(run_id=RESTORED, picked=True)
    state, follow, summary, download = PastRunsHandlers(runs).pick(before, "20260101-000000-gone", visitor="bob")
    assert state is before and follow == gr.skip() and download == gr.skip()
    assert summary.startswith("⚠️ There is no run '20260101-000000-gone' on this server any more")


class _Runs:
    """A manager whose attach finds a newer run: the one that trains now."""

    def __init__(self, picked, training):
        self.picked, self.training = picked, training

    def get(self, run_id):
        return self.picked if run_id == self.picked.id else None

    def attach(self, visitor, viewed_id=None, after=None):
        return self.training


def test_a_picked_run_stays_shown_while_another_trains_and_a_gone_one_gives_way(server):
    _, alice, restored = server
    runs = _Runs(restored, alice)
    assert shown_run(runs, PollState(run_id=RESTORED, picked=True), "bob") is restored
    assert shown_run(runs, PollState(run_id=RESTORED), "bob") is alice  # not picked: attach's choice
    assert shown_run(runs, PollState(run_id="gone", picked=True), "bob") is alice


def test_the_client_api_lists_the_runs_as_the_page_does(server):
    runs, alice, _ = server
    listed = RunApi(runs).list_runs(visitor="alice")["runs"]
    assert [run["run_id"] for run in listed] == [alice.id, RESTORED]
    mine, left = listed
    final = [json.loads(line) for line in (alice.folder / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("type") == "eval"][-1]
    last_step = max(json.loads(line)["step"] for line in (alice.folder / "metrics.jsonl").read_text().splitlines()
                    if json.loads(line).get("type") == "step")
    assert mine["final"] == {key: value for key, value in final.items() if key != "type"}
    assert (mine["state"], mine["yours"], mine["has_model"], mine["memvir_n"], mine["memvir_m"], mine["step"]) == (
        "finished", True, True, 2, 1, last_step)
    assert mine["label"] == past_runs.run_label(alice, "alice")
    assert (left["state"], left["yours"], left["has_model"], left["step"], left["final"]) == (
        "stopped", False, False, RESTORED_STEPS[-1], None)
    assert json.loads(json.dumps(listed)) == listed  # plain values
