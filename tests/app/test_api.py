"""The app's client API (demo.api) driven by gradio_client against a real server on 127.0.0.1: train on glyphs-mini
and watch it, change N live, stop and resume, a second visitor who may only watch, retrieval with an uploaded image,
and the messages for bad input. Waits poll against a deadline; nothing asserts how fast anything is."""

import re
import time
import zipfile

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from served_app import free_port, step_of

from demo.common.settings import AppSettings
from demo.page import build_app

DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from memvir import TrainConfig, Trainer

    root = tmp_path_factory.mktemp("app")
    checkpoint = root / "checkpoints" / "glyphs-mini-tiny"
    Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, max_steps=5, eval_at_start=False, snapshot_every=0,
                        embedding_dim=32), checkpoint).run()
    settings = AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False)
    app = build_app(settings)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield {"url": f"http://127.0.0.1:{port}/", "settings": settings, "checkpoint": str(checkpoint)}
    finally:
        app.close()


def _client(server) -> Client:
    return Client(server["url"], verbose=False)


def _poll(client) -> dict:
    """The run's status with every logged step (what the page's curves draw), the page's status line as "status"."""
    status = client.predict(history=True, api_name="/run_status")
    return {**status, "status": status["status_line"]}


def _poll_until(client, condition, what: str) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        view = _poll(client)
        if condition(view):
            return view
        time.sleep(0.3)
    raise AssertionError(f"the page never showed {what}; last status: {view['status']!r}")


def test_train_watch_change_n_stop_resume(server):
    alice, bob = _client(server), _client(server)
    started = alice.predict(dataset="glyphs-mini", batch_size=32, epochs=500, memvir_n=5, memvir_m=2,
                            warmup_epochs=0.5, snapshot_every=5, api_name="/start_run")
    assert started["yours"] is True and "glyphs-mini-norm-softmax-memvir-n5-m2" in started["run_id"]

    seen = {"points": 0}

    def loss_points_at_least(count):
        def check(view):
            seen["points"] = len([step for step in view["steps"] if step["loss"] is not None])
            return seen["points"] >= count
        return check

    first = _poll_until(alice, loss_points_at_least(3), "three loss points")
    first_points, first_step = seen["points"], step_of(first["status"])
    later = _poll_until(alice, loss_points_at_least(first_points + 3), "the loss curve growing")
    assert step_of(later["status"]) > first_step
    assert re.search(r"\*\*Training\*\* · epoch \d+ of 500 · step [\d,]+ of 4,500 · classes in use s\(i\) \d+ · "
                     r"virtual sets \d of 5", later["status"])
    snapshot = _poll_until(alice, lambda view: view["snapshot_steps"], "an embedding snapshot")
    assert all(step % 5 == 0 for step in snapshot["snapshot_steps"])  # every 5 steps

    # a second visitor watches, read-only
    with pytest.raises(AppError, match="another visitor's run is training"):
        bob.predict(dataset="glyphs-mini", api_name="/start_run")
    with pytest.raises(AppError, match="this run was started by another visitor"):
        bob.predict(api_name="/stop_run")
    with pytest.raises(AppError, match="this run was started by another visitor"):
        bob.predict(api_name="/compare_with_baseline")
    assert "you are watching a run started by another visitor (read-only)" in _poll(bob)["status"].lower()

    # N live: 5 -> 9 applies at the next step; the note beside the controls and the status line say at which
    asked = alice.predict(setting="memvir_n", value=9, api_name="/update_run")
    assert asked["message"].startswith("Asked for N 5 -> 9: pending")
    changed = _poll_until(alice, lambda view: "N 5 -> 9: applied at step" in (view["controls_note"] or ""),
                          "N applied")
    applied_at = re.fullmatch(r"N 5 -> 9: applied at step (\d+)", changed["controls_note"]).group(1)
    assert f"Live changes: N 5 -> 9 at step {int(applied_at):,}" in changed["status"]
    _poll_until(alice, lambda view: "of 9" in view["status"], "9 virtual sets allowed")

    assert alice.predict(api_name="/stop_run")["run_id"] == started["run_id"]
    stopped = _poll_until(alice, lambda view: view["status"].startswith("**Stopped**"), "the run stopped")
    stopped_at = step_of(stopped["status"])
    assert "press **Resume** to continue" in stopped["status"]
    assert alice.predict(api_name="/resume_run")["run_id"] == started["run_id"]
    _poll_until(alice, lambda view: view["status"].startswith("**Training**") and step_of(view["status"]) > stopped_at,
                "training resumed past the stop")
    alice.predict(api_name="/stop_run")
    _poll_until(alice, lambda view: view["status"].startswith("**Stopped**"), "the run stopped again")


@pytest.mark.slow
def test_schedule_and_validation_classes_reach_the_run(server):
    carol = _client(server)
    started = carol.predict(dataset="glyphs-mini", batch_size=32, epochs=50, memvir_n=2, memvir_m=2,
                            warmup_epochs=1, memvir_schedule="all-at-once", val_classes=4, snapshot_every=0,
                            api_name="/start_run")
    assert "glyphs-mini-norm-softmax-memvir-n2-m2-all-at-once" in started["run_id"]
    # The page's load event is the page's own: a client cannot call it (the page's events are private)
    with pytest.raises(ValueError, match="load"):
        carol.predict(visitor="", api_name="/load")

    def validation_points(view):
        return len([record for record in view["evaluations"] if "val_recall@1" in record]) >= 2

    _poll_until(carol, validation_points, "two validation Recall@1 points")
    # 4 of the 24 training classes held out leave 20; all at once, s(i) jumps from 20 to 20 * (N + 1) = 60 at the
    # warm-up's end, never passing 40 as the paper's pacing would
    seen = {}

    def class_counts_reach_60(view):
        seen["counts"] = {step["num_classes"] for step in view["steps"]}
        return 60 in seen["counts"]

    _poll_until(carol, class_counts_reach_60, "both virtual sets in use")
    assert seen["counts"] == {20, 60}
    carol.predict(api_name="/stop_run")
    _poll_until(carol, lambda view: view["status"].startswith(("**Stopped**", "**Finished**")), "the run ended")


def _glyph_png(tmp_path, index):
    from memvir.data import load_dataset

    split = load_dataset("glyphs-mini").test
    path = tmp_path / "query.png"
    split.image(index).save(path)
    return path, split.class_names[split.labels[index]]


def test_retrieval_with_a_checkpoint_and_an_uploaded_image(server, tmp_path):
    client = _client(server)
    gallery = client.predict(checkpoint=server["checkpoint"], api_name="/gallery")
    assert gallery["checkpoint"] == "glyphs-mini-tiny" and gallery["size"] == 288 and "recall@1" in gallery["metrics"]
    assert len(gallery["class_names"]) == 24  # the test classes

    query, class_name = _glyph_png(tmp_path, 40)
    found = client.predict(checkpoint=server["checkpoint"], k=5, query_class=class_name.split(" ")[0],
                           query_image=handle_file(query), api_name="/search")
    hits = found["hits"]
    assert len(hits) == 5
    assert all(re.fullmatch(r"\S+ U\+[0-9A-F]{4,6}", hit["class_name"]) and isinstance(hit["same_class"], bool)
               for hit in hits)
    # the query is in the gallery itself: its own copy comes first, with similarity 1
    assert (round(hits[0]["score"], 3), hits[0]["class_name"], hits[0]["same_class"]) == (1.0, class_name, True)
    assert found["query_class"] == class_name


def test_bad_inputs_give_messages(server, tmp_path):
    client = _client(server)
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    with pytest.raises(AppError, match="^notes.txt is not an image this app can read"):
        client.predict(checkpoint=server["checkpoint"], k=3, query_image=handle_file(notes), api_name="/search")

    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("../escaped.png", b"x")
        archive.writestr("a/1.png", b"y")
    with pytest.raises(AppError, match=re.escape("entry '../escaped.png' points outside the destination")):
        client.predict(checkpoint=server["checkpoint"], gallery_files=[handle_file(evil)], api_name="/gallery")
    uploads = server["settings"].uploads_dir
    assert not (uploads.parent / "escaped.png").exists() and not (uploads / "escaped.png").exists()
    assert not uploads.exists() or not any(uploads.rglob("*.png"))

    for message, arguments, endpoint in (
            ("the Hub cannot be reached from this server; pick a bundled checkpoint",
             {"checkpoint": "someone/not-cached"}, "/gallery"),
            ("batch size must be a whole number of at least 1", {"batch_size": 0}, "/start_run"),
            ("upload a zip of class folders first", {"dataset": "zip"}, "/start_run"),
            ("epochs must be a whole number of at least 1", {"epochs": 0}, "/start_run"),
            ("cannot hold out 23 validation classes from the 24 training classes of glyphs-mini",
             {"dataset": "glyphs-mini", "val_classes": 23}, "/start_run"),
            ("there is no run to push: train one first", {"repo_id": "me/x"}, "/push_run")):
        with pytest.raises(AppError, match=re.escape(message)):
            client.predict(**arguments, api_name=endpoint)
