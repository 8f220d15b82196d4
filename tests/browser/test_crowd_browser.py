"""A crowd watching one run: a visitor's page that is not the run's owner's polls less often once many pages watch
(demo.runs.audience), as the poll's answer sets the page's timer, and its status line says so."""

import json

import pytest

from memvir.config import TrainConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]
WAIT_MS = 120_000


@pytest.fixture
def crowded_app_url(tmp_path, monkeypatch, serve):
    """An app whose every run counts as crowded from its first other page: its share is one poll in 3 s."""
    from demo.common.settings import AppSettings
    from demo.page import build_app
    from demo.runs import audience

    monkeypatch.setattr(audience, "FULL_RATE_PAGES", 0)
    monkeypatch.setattr(audience, "CROWD_POLLS_PER_S", 1 / 3)
    app = build_app(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "none", umap=False))
    run = app.run_manager.start(TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=300, eval_at_start=False,
                                            snapshot_every=0), "someone-else")
    try:
        yield serve(app)
    finally:
        app.run_manager.stop(run.id, "someone-else")
        app.close()


def test_a_watcher_s_page_slows_to_its_share_and_says_so(open_page, crowded_app_url):
    page = open_page(crowded_app_url)
    page.wait_for_function("() => document.querySelector('#run-status')?.innerText.includes('updates every 3 s')",
                           timeout=WAIT_MS)
    assert "pages are watching this run: this one updates every 3 s" in page.locator("#run-status").inner_text()
    posted = []  # each event the page sends is a POST naming its function by number
    page.on("request", lambda request: posted.append(json.loads(request.post_data or "{}").get("fn_index")))
    page.wait_for_timeout(9500)
    names = page.evaluate("() => Object.fromEntries(window.gradio_config.dependencies.map(d => [d.id, d.api_name]))")
    polls = [names.get(str(number)) for number in posted if number is not None].count("poll")
    assert 2 <= polls <= 4, polls  # one every 3 s, not one a second (9 or 10)
