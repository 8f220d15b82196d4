"""The app's public API driven by gradio_client against a real server on 127.0.0.1: train on glyphs-mini and watch
it, change N live, stop and resume, a second visitor who may only watch, retrieval with an uploaded image, and the
messages for bad input. Waits poll against a deadline; nothing asserts how fast anything is."""

import base64
import html
import json
import re
import time
import zipfile

import numpy as np
import pytest
from gradio_client import Client, handle_file
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
    (status, controls_note, _n, _m, _warmup, curves, classes, cosine, embedding, caption, slider, _timer,
     _views_due) = client.predict(api_name="/poll")
    return {"status": status, "controls_note": controls_note, "curves": curves, "classes": classes,
            "embedding": embedding, "caption": caption}


def _plot_traces(plot) -> list[dict] | None:
    """The traces of a gr.Plot value; None when the poll skipped it (nothing new)."""
    if not isinstance(plot, dict) or "plot" not in plot:
        return None
    return json.loads(plot["plot"])["data"]


def _values(array) -> np.ndarray:
    """A plotly array as JSON carries it: a list, or {"dtype", "bdata": base64} for numeric arrays."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
    return np.asarray(array)


def _loss_steps(curves) -> np.ndarray | None:
    traces = _plot_traces(curves)
    if traces is None:
        return None
    loss = [trace for trace in traces if trace.get("name") == "loss"]
    return _values(loss[0]["x"]) if loss else np.array([])


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
    notice = alice.predict(dataset="glyphs-mini", batch_size=32, epochs=500, memvir_n=5, memvir_m=2,
                           warmup_epochs=0.5, snapshot_every=5, api_name="/start")
    assert notice.startswith("Started run `") and "glyphs-mini-norm-softmax-memvir-n5-m2" in notice

    seen = {"points": 0}

    def loss_points_at_least(count):
        def check(view):
            steps = _loss_steps(view["curves"])
            if steps is not None:
                seen["points"] = len(steps)
            return seen["points"] >= count
        return check

    first = _poll_until(alice, loss_points_at_least(3), "three loss points")
    first_points, first_step = seen["points"], step_of(first["status"])
    later = _poll_until(alice, loss_points_at_least(first_points + 3), "the loss curve growing")
    assert step_of(later["status"]) > first_step
    assert re.search(r"\*\*Training\*\* · epoch \d+ of 500 · step [\d,]+ of 4,500 · classes in use s\(i\) \d+ · "
                     r"virtual sets \d of 5", later["status"])
    snapshot = _poll_until(alice, lambda view: _plot_traces(view["embedding"]) is not None
                           and "step" in (view["caption"] or ""), "an embedding snapshot")
    assert re.match(r"Snapshot \d+ of \d+ kept · step [\d,]+ · PCA", snapshot["caption"])

    # a second visitor watches, read-only
    assert "another visitor's run is training" in bob.predict(dataset="glyphs-mini", api_name="/start")
    assert "this run was started by another visitor" in bob.predict(api_name="/stop")
    # Compare says at once that the baseline is starting, then how it went: a client's predict gets the last
    assert bob.predict(api_name="/compare_baseline").startswith("⚠️ this run was started by another visitor")
    assert "you are watching a run started by another visitor (read-only)" in _poll(bob)["status"].lower()

    # N live: 5 -> 9 applies at the next step; the note beside the controls and the status line say at which
    assert alice.predict(setting="memvir_n", value=9, api_name="/update").startswith("Asked for N 5 -> 9: pending")
    changed = _poll_until(alice, lambda view: "N 5 -> 9: applied at step" in (view["controls_note"] or ""),
                          "N applied")
    applied_at = re.fullmatch(r"N 5 -> 9: applied at step (\d+)", changed["controls_note"]).group(1)
    assert f"Live changes: N 5 -> 9 at step {int(applied_at):,}" in changed["status"]
    _poll_until(alice, lambda view: "of 9" in view["status"], "9 virtual sets allowed")

    assert alice.predict(api_name="/stop").startswith("Stopping")
    stopped = _poll_until(alice, lambda view: view["status"].startswith("**Stopped**"), "the run stopped")
    stopped_at = step_of(stopped["status"])
    assert "press **Resume** to continue" in stopped["status"]
    assert alice.predict(api_name="/resume") == ("Resumed.", True)  # and the page follows the run again
    _poll_until(alice, lambda view: view["status"].startswith("**Training**") and step_of(view["status"]) > stopped_at,
                "training resumed past the stop")
    alice.predict(api_name="/stop")
    _poll_until(alice, lambda view: view["status"].startswith("**Stopped**"), "the run stopped again")


def test_schedule_and_validation_classes_reach_the_run(server):
    carol = _client(server)
    notice = carol.predict(dataset="glyphs-mini", batch_size=32, epochs=50, memvir_n=2, memvir_m=2,
                           warmup_epochs=1, memvir_schedule="all-at-once", val_classes=4, snapshot_every=0,
                           api_name="/start")
    assert "glyphs-mini-norm-softmax-memvir-n2-m2-all-at-once" in notice
    # The page's load event is the page's own: a client cannot call it (the page's events are private)
    with pytest.raises(ValueError, match="load"):
        carol.predict(visitor="", api_name="/load")

    def validation_points(view):
        traces = _plot_traces(view["curves"]) or []
        return [t for t in traces if t.get("name") == "validation R@1" and len(_values(t["x"])) >= 2]

    _poll_until(carol, validation_points, "two validation Recall@1 points")
    # 4 of the 24 training classes held out leave 20; all at once, s(i) jumps from 20 to 20 * (N + 1) = 60 at the
    # warm-up's end, never passing 40 as the paper's pacing would
    seen = {}

    def class_counts_reach_60(view):
        traces = _plot_traces(view["classes"]) or []
        counts = [t for t in traces if t.get("name") == "classes s(i)"]
        if counts:
            seen["counts"] = set(_values(counts[0]["y"]).tolist())
        return 60 in seen.get("counts", ())

    _poll_until(carol, class_counts_reach_60, "both virtual sets in use")
    assert seen["counts"] == {20, 60}
    carol.predict(api_name="/stop")
    _poll_until(carol, lambda view: view["status"].startswith(("**Stopped**", "**Finished**")), "the run ended")


def _glyph_png(tmp_path, index):
    from memvir.data import load_dataset

    split = load_dataset("glyphs-mini").test
    path = tmp_path / "query.png"
    split.image(index).save(path)
    return path, split.class_names[split.labels[index]]


def test_retrieval_with_a_checkpoint_and_an_uploaded_image(server, tmp_path):
    client = _client(server)
    about, sample = client.predict(checkpoint_choice=server["checkpoint"], source="test split",
                                   api_name="/prepare_retrieval")
    assert "Checkpoint** `glyphs-mini-tiny`" in about and "288 images" in about and "Recall@1" in about
    assert len(sample) == 24  # one tile per test class

    query, class_name = _glyph_png(tmp_path, 40)
    about, results, seen = client.predict(checkpoint_choice=server["checkpoint"], source="test split", k=5,
                                          query_class=class_name.split(" ")[0], query_file=handle_file(query),
                                          api_name="/search_upload")
    captions = [html.unescape(text) for text in re.findall(r'<img [^>]*alt="([^"]*)"', results)]
    assert len(captions) == 5
    assert all(re.fullmatch(r"#\d -?\d\.\d{3} \S+ U\+[0-9A-F]{4,6} (same|other) class", text) for text in captions)
    # the query is in the gallery itself: its own copy comes first, with similarity 1
    assert captions[0] == f"#1 1.000 {class_name} same class"
    assert f"share the query's class ({class_name})" in about
    assert seen is not None


def test_bad_inputs_give_messages(server, tmp_path):
    client = _client(server)
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    about, _, _ = client.predict(checkpoint_choice=server["checkpoint"], source="test split", k=3, query_class="",
                                 query_file=handle_file(notes), api_name="/search_upload")
    assert about.startswith("⚠️ notes.txt is not an image this app can read")

    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("../escaped.png", b"x")
        archive.writestr("a/1.png", b"y")
    about, _ = client.predict(checkpoint_choice=server["checkpoint"], source="uploaded",
                              files=[handle_file(evil)], api_name="/prepare_retrieval")
    assert "entry '../escaped.png' points outside the destination" in about
    uploads = server["settings"].uploads_dir
    assert not (uploads.parent / "escaped.png").exists() and not (uploads / "escaped.png").exists()
    assert not uploads.exists() or not any(uploads.rglob("*.png"))

    about, _ = client.predict(checkpoint_choice="someone/not-cached", source="test split",
                              api_name="/prepare_retrieval")
    assert "the Hub cannot be reached from this server; pick a bundled checkpoint" in about
    assert "batch size must be a whole number of at least 1" in client.predict(batch_size=0, api_name="/start")
    assert "upload a zip of class folders first" in client.predict(dataset="zip", api_name="/start")
    assert "epochs must be a whole number of at least 1" in client.predict(epochs=0, api_name="/start")
    assert ("cannot hold out 23 validation classes from the 24 training classes of glyphs-mini"
            in client.predict(dataset="glyphs-mini", val_classes=23, api_name="/start"))
    assert "there is no run to push: train one first" in client.predict(repo_id="me/x", api_name="/push_to_hub")
