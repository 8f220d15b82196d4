"""The client API (demo.api) driven by gradio_client against the app served on 127.0.0.1: its endpoints are the ones
docs/app.md lists, with the parameters it names; a run started, watched by another visitor, changed live and
stopped; searches and the gallery's figures checked against numpy over the gallery's exported embeddings and against
the library's retrieval_metrics. Waits poll against a deadline; nothing asserts how fast anything is."""

import itertools
import re
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from served_app import serving

from demo.api import ENDPOINTS
from demo.common.settings import AppSettings
from memvir import retrieval_metrics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "app.md"
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory):
    settings = AppSettings(data_dir=tmp_path_factory.mktemp("client-api") / "data", checkpoints_dir=tiny_checkpoints,
                           umap=False)
    with serving(settings) as (url, app):
        yield url, app


def _client(served) -> Client:
    return Client(served[0], verbose=False)


def _documented() -> dict[str, list[str]]:
    """docs/app.md's client API table: each endpoint and the parameters it lists, in the table's order."""
    section = DOCS.read_text(encoding="utf-8").split("\n## The client API\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `/(\w+)` \|([^|]*)\|", section, re.MULTILINE)
    return {name: re.findall(r"`(\w+)`", parameters) for name, parameters in rows}


def test_the_public_endpoints_are_the_client_api_and_docs_list_each_with_its_parameters(served):
    api = _client(served).view_api(print_info=False, return_format="dict")
    named = api["named_endpoints"]
    assert api["unnamed_endpoints"] == {}
    assert set(named) == {f"/{name}" for name in ENDPOINTS}  # the page's own events are private
    documented = _documented()
    assert list(documented) == list(ENDPOINTS)
    assert {name: [parameter["parameter_name"] for parameter in named[f"/{name}"]["parameters"]]
            for name in ENDPOINTS} == documented
    # plain values only: no endpoint of the client API answers with a component of the page
    assert {returned["component"] for name in ENDPOINTS for returned in named[f"/{name}"]["returns"]} == {"Api"}


def _until(client, condition, what: str, **arguments) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        status = client.predict(**arguments, api_name="/run_status")
        if condition(status):
            return status
        time.sleep(0.3)
    raise AssertionError(f"the run never showed {what}; last status: {status!r}")


@pytest.mark.slow
def test_start_watch_change_and_stop_a_run(served):
    alice, bob = _client(served), _client(served)
    with pytest.raises(AppError, match="batch size must be a whole number of at least 1"):
        alice.predict(dataset="glyphs-mini", batch_size=0, api_name="/start_run")
    assert alice.predict(api_name="/run_status")["state"] == "none"

    # glyphs-mini trains 9 steps an epoch at batch 32: the warm-up ends after step 4, and with M = 2 a virtual set
    # arrives every 3 steps from there, up to N of them
    started = alice.predict(dataset="glyphs-mini", batch_size=32, epochs=500, memvir_n=2, memvir_m=2,
                            warmup_epochs=0.5, snapshot_every=5, api_name="/start_run")
    run_id = started["run_id"]
    assert "glyphs-mini-norm-softmax-memvir-n2-m2" in run_id and started["yours"] is True
    assert started["live_values"]["memvir_n"] == 2 and started["total_steps"] == 4500
    training = _until(alice, lambda status: status["state"] == "running" and status["step"] >= 1, "training")
    assert training["run_id"] == run_id and training["status_line"].startswith("**Training**")

    # another visitor watches it and may not steer it
    watched = bob.predict(api_name="/run_status")
    assert (watched["run_id"], watched["yours"]) == (run_id, False)
    for endpoint, arguments in (("/stop_run", {}), ("/pause_run", {}), ("/update_run", {"setting": "memvir_n",
                                                                                         "value": 3})):
        with pytest.raises(AppError, match="this run was started by another visitor"):
            bob.predict(**arguments, api_name=endpoint)
    with pytest.raises(AppError, match="another visitor's run is training"):
        bob.predict(dataset="glyphs-mini", api_name="/start_run")
    with pytest.raises(AppError, match="only the visitor who started this run can push it"):
        bob.predict(repo_id="bob/memvir", api_name="/push_run")
    with pytest.raises(AppError, match="the run is still training: stop it or let it finish, then push"):
        alice.predict(repo_id="alice/memvir", api_name="/push_run")
    with pytest.raises(AppError, match="there is no run 'nope' on this server"):
        bob.predict(run_id="nope", api_name="/run_status")

    # N live, 2 -> 4: the run applies it before its next step and goes on to its third and fourth virtual sets
    asked = alice.predict(setting="memvir_n", value=4, api_name="/update_run")
    assert (asked["run_id"], asked["old"], asked["new"]) == (run_id, 2, 4)
    assert asked["message"] == "Asked for N 2 -> 4: pending, the run applies it before its next step."
    with pytest.raises(AppError, match="the live settings are"):
        alice.predict(setting="batch_size", value=8, api_name="/update_run")
    changed = _until(alice, lambda status: status["changes"], "N applied")
    (change,) = changed["changes"]
    assert (change["setting"], change["old"], change["new"]) == ("memvir_n", 2, 4)
    assert changed["controls_note"] == f"N 2 -> 4: applied at step {change['step']}"
    assert changed["live_values"]["memvir_n"] == 4 and changed["pending"] == {}
    _until(alice, lambda status: (status["num_virtual_sets"] or 0) >= 3, "a third virtual set")
    history = alice.predict(history=True, api_name="/run_status")
    steps = [record["step"] for record in history["steps"]]
    assert steps and steps == sorted(steps) and history["snapshot_steps"]

    stopping = alice.predict(run_id=run_id, api_name="/stop_run")
    assert stopping["run_id"] == run_id
    stopped = _until(alice, lambda status: status["state"] == "stopped", "the run stopped")
    assert stopped["can_resume"] is True and "press **Resume** to continue" in stopped["status_line"]
    with pytest.raises(AppError, match="the run is not training"):
        alice.predict(api_name="/stop_run")

    # the Train tab's list of the server's runs, as each visitor reads it
    (listed,) = [run for run in bob.predict(api_name="/list_runs")["runs"] if run["run_id"] == run_id]
    assert (listed["state"], listed["yours"], listed["memvir_n"], listed["step"]) == (
        "stopped", False, 4, stopped["step"])
    assert listed["label"].startswith("Stopped · glyphs-mini, norm-softmax, N = 4, M = 2, 500 epochs · another")
    assert [run["yours"] for run in alice.predict(api_name="/list_runs")["runs"] if run["run_id"] == run_id] == [True]


def _cosines(embeddings: np.ndarray) -> np.ndarray:
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    return unit @ unit.T


@pytest.fixture(scope="module")
def exported(served):
    """The default checkpoint and its gallery's embeddings, labels and class names as /gallery_embeddings gives them."""
    client = _client(served)
    listed = client.predict(api_name="/checkpoints")
    checkpoint = listed["default"]
    assert Path(checkpoint).name == "glyphs-mini-tiny"  # the bundled one (a run of this server's is listed too)
    assert checkpoint in [entry["checkpoint"] for entry in listed["checkpoints"]]
    files = client.predict(checkpoint=checkpoint, api_name="/gallery_embeddings")
    with np.load(files["npz"]) as arrays:
        embeddings, labels, names = arrays["embeddings"], arrays["labels"], arrays["class_names"].tolist()
    assert files["size"] == len(labels) == 288 and zipfile.is_zipfile(files["projector"])
    return checkpoint, embeddings, labels, names


def test_search_answers_the_nearest_items_by_cosine(served, exported, glyph_query):
    client = _client(served)
    checkpoint, embeddings, labels, names = exported
    cosines = _cosines(embeddings.astype(np.float64))
    # a gallery item as the query: itself left out, the hits are its nearest by cosine, marked same class or not
    found = client.predict(checkpoint=checkpoint, item=40, k=5, api_name="/search")
    assert found["query_class"] == names[labels[40]] and found["size"] == 288
    by_hand = np.delete(cosines[40], 40)
    np.testing.assert_allclose([hit["score"] for hit in found["hits"]], np.sort(by_hand)[::-1][:5], atol=1e-5)
    for hit in found["hits"]:
        assert hit["item"] != 40 and hit["score"] == pytest.approx(cosines[40, hit["item"]], abs=1e-5)
        assert hit["same_class"] == bool(labels[hit["item"]] == labels[40]) and hit["below_cutoff"] is False
    # with the query's class known (a gallery item's is), R: the other images of its class
    assert found["same_class_items"] == int((labels == labels[40]).sum()) - 1

    # an uploaded image (the same item's picture): its own copy comes first; a cut-off marks the hits below it
    cutoff = found["hits"][2]["score"] - 1e-4
    uploaded = client.predict(checkpoint=checkpoint, query_image=handle_file(glyph_query), k=5,
                              query_class=names[labels[40]].split(" ")[0], cutoff=cutoff, api_name="/search")
    first = uploaded["hits"][0]
    assert first["score"] == pytest.approx(1.0, abs=1e-4) and first["same_class"] is True
    assert [hit["below_cutoff"] for hit in uploaded["hits"]] == [hit["score"] < cutoff for hit in uploaded["hits"]]

    with pytest.raises(AppError, match=re.escape("send either a query image (query_image) or a gallery item's number")):
        client.predict(checkpoint=checkpoint, api_name="/search")
    # a file is an upload: a path, or a dict without gradio's FileData marker, would name a file of the server's
    for named in (str(glyph_query), {"path": str(glyph_query)}):
        with pytest.raises(AppError, match=re.escape("send files as uploads (gradio_client.handle_file(path))")):
            client.predict(checkpoint=checkpoint, query_image=named, api_name="/search")
    with pytest.raises(AppError, match=re.escape("send files as uploads")):
        client.predict(checkpoint=checkpoint, gallery_files=[str(glyph_query)], api_name="/gallery")
    with pytest.raises(AppError, match="the two checkpoints are the same"):
        client.predict(checkpoint=checkpoint, second_checkpoint=checkpoint, item=3, api_name="/compare")


def test_the_gallery_s_figures_match_the_library_and_numpy(served, exported):
    client = _client(served)
    checkpoint, embeddings, labels, names = exported
    gallery = client.predict(checkpoint=checkpoint, api_name="/gallery")
    assert (gallery["size"], gallery["class_names"], gallery["trained_on"]) == (288, names, "glyphs-mini")

    reference = retrieval_metrics(embeddings, labels)
    metrics = client.predict(checkpoint=checkpoint, api_name="/class_metrics")
    (overall,) = metrics["overall"]
    assert overall == pytest.approx({name: reference[name] for name in ("recall@1", "r_precision", "map@r")},
                                    abs=1e-6)
    assert [row["class_name"] for row in metrics["classes"]] == names
    assert all(row["queries"] == 12 for row in metrics["classes"])

    hardest = client.predict(checkpoint=checkpoint, count=3, api_name="/hardest")["queries"]
    precisions = [row["average_precision"] for row in hardest]
    assert len(hardest) == 3 and precisions == sorted(precisions)
    assert all(row["class_name"] == names[labels[row["query"]]] for row in hardest)

    # the pairs by hand: a cut-off between two same-class cosines, and the share of same-class pairs below it
    cosines = _cosines(embeddings.astype(np.float64))
    pairs = list(itertools.combinations(range(len(labels)), 2))
    same = np.array([cosines[i, j] for i, j in pairs if labels[i] == labels[j]])
    ordered = np.sort(same)
    gaps = np.diff(ordered)
    place = int(np.argmax(gaps[: len(gaps) // 2]))  # the widest gap in the lower half: no pair near the cut-off
    cutoff = float((ordered[place] + ordered[place + 1]) / 2)
    figures = client.predict(checkpoint=checkpoint, fmr=0.01, cutoff=cutoff, api_name="/threshold")
    assert (figures["same_pairs"], figures["other_pairs"]) == (len(same), len(pairs) - len(same))
    assert figures["at_cutoff"]["false_non_matches"] == place + 1
    assert figures["at_cutoff"]["fnmr"] == pytest.approx((place + 1) / len(same))
    assert 0 < figures["at_fmr"]["fmr"] <= 0.01

    download = client.predict(checkpoint=checkpoint, api_name="/checkpoint_zip")
    with zipfile.ZipFile(download) as archive:
        assert sorted(archive.namelist()) == [f"glyphs-mini-tiny/{name}" for name in ("README.md", "config.json",
                                                                                   "model.safetensors")]
