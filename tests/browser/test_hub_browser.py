"""The Retrieve tab given a Hub repo id, in a real headless chromium: the app, started as `python app.py` is (its own
process, its environment pointing huggingface_hub at a Hub on 127.0.0.1), pulls the model that `push` put there and
searches with it. Waits are Playwright's, bounded; nothing asserts speed."""

from pathlib import Path

import pytest
from hub_server import USER, WRITE_TOKEN, client_environment, point_client_at
from served_app import app_py, free_port

from memvir import TrainConfig, Trainer
from memvir.hub import push

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
REPO = f"{USER}/glyphs-mini-tiny"
WAIT_MS = 90_000
START_S = 180


@pytest.fixture
def app_pulling_from_the_hub(loopback_hub, tmp_path, monkeypatch):
    """A tiny run pushed to the loopback Hub, and `python app.py` serving the page with that Hub as its HF_ENDPOINT
    (no bundled checkpoints, so the only model it can show is the one typed); its URL."""
    run = tmp_path / "run"
    Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, max_steps=5, eval_at_start=False, snapshot_every=0,
                        embedding_dim=32), run).run()
    point_client_at(monkeypatch, loopback_hub.url, tmp_path / "pusher")
    push(run, REPO, token=WRITE_TOKEN)

    port = free_port()
    (tmp_path / "no-checkpoints").mkdir()
    env = client_environment(loopback_hub.url, tmp_path / "app-home") | {
        "PYTHONPATH": str(ROOT), "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
        "MEMVIR_APP_DATA": str(tmp_path / "app-data"), "MEMVIR_CHECKPOINTS": str(tmp_path / "no-checkpoints"),
        "MEMVIR_UMAP": "0"}
    with app_py(env, tmp_path / "app.log", START_S) as url:
        yield url


def test_the_retrieve_tab_searches_with_a_model_pulled_by_repo_id(app_pulling_from_the_hub, loopback_hub,
                                                                  open_page, screenshot, tmp_path):
    from memvir.data import load_dataset

    page = open_page(app_pulling_from_the_hub)
    page.get_by_role("tab", name="Retrieve").click()
    checkpoint = page.locator("#checkpoint input")
    checkpoint.fill(REPO)
    checkpoint.press("Enter")
    page.locator("#load").click()
    summary = page.locator("#retrieval-summary")
    page.wait_for_function("(repo) => document.querySelector('#retrieval-summary').innerText.includes(repo)",
                           arg=REPO, timeout=WAIT_MS)
    assert f"{REPO}: convnet, 32-d, trained on glyphs-mini" in summary.inner_text()

    query = tmp_path / "query.png"
    load_dataset("glyphs-mini").test.image(40).resize((64, 64)).save(query)
    page.get_by_role("tab", name="Upload").click()
    page.locator("#query-file input[type=file]").set_input_files(str(query))
    page.locator("#search-upload").click()
    page.wait_for_function("() => document.querySelectorAll('#results .result-tile').length >= 8", timeout=WAIT_MS)
    assert page.locator("#results .result-tile").count() == 8
    assert "nearest of" in summary.inner_text() and REPO in summary.inner_text()
    screenshot("retrieval-hub-repo", shown=page)

    commit = loopback_hub.repos[REPO].refs["main"]
    asked = loopback_hub.paths_requested()
    assert f"/{REPO}/resolve/{commit}/model.safetensors" in asked  # the weights came from the Hub
    assert "/api/agent-harnesses" not in asked  # app.py turned the side requests off
