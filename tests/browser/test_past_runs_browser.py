"""The Train tab's "Runs on this server" in a real headless chromium: a run another visitor started on the shared app
is picked from the list by a fresh visitor while it trains (paused), and followed to its end without a pick again,
at desktop width; picked again, finished, on a phone (390 px). The page shows it: its status line, its loss curve as
plotly drew it, its last evaluation as its metrics.jsonl has it, and its model to download. Read from the page; waits
are Playwright's, bounded; nothing asserts speed."""

import json
import re
import time

import pytest
from test_train_views_browser import _traces

pytestmark = pytest.mark.browser

WAIT_MS = 120_000


def _paused_run(app):
    """A short glyphs-mini run started by another visitor on the shared app, paused as it trains (its LiveRun)."""
    from memvir import TrainConfig

    run = app.run_manager.start(TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=1, eval_at_start=False,
                                            snapshot_every=3, log_every=1, memvir_n=2, memvir_m=1,
                                            warmup_epochs=0.2), "an-earlier-visitor")
    app.run_manager.pause(run.id, run.owner)
    _wait_until(lambda: run.state == "paused", run)
    return run


def _wait_until(condition, run):
    deadline = time.monotonic() + WAIT_MS / 1000
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert condition(), run.message


def _final(run) -> tuple[dict, int]:
    """(the finished run's last evaluation record, how many steps its log holds)."""
    records = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    return ([record for record in records if record.get("type") == "eval"][-1],
            len([1 for record in records if record.get("type") == "step"]))


def test_a_visitor_picks_a_past_run_from_the_list_and_sees_its_curves_and_table(open_page, app_url, request,
                                                                                screenshot):
    app = request.getfixturevalue("_app_served")[0]
    run = _paused_run(app)
    for name, width, height in (("desktop", 1400, 900), ("phone", 390, 844)):
        page = open_page(app_url, width, height)
        if name == "desktop":  # a fresh visitor's page watches the run that trains; after Reset, only newer runs
            page.wait_for_function("() => document.querySelector('#run-status')?.innerText.startsWith('Paused')",
                                   timeout=WAIT_MS)
            page.locator("#reset").click()
        # the page shows no run: the other visitor's is only in the list
        page.wait_for_function("() => document.querySelector('#run-status')?.innerText.includes('Ready')",
                               timeout=WAIT_MS)
        # the boxes read once the loss chart is drawn: before, it has no height and the list starts where it will
        page.wait_for_function("() => document.querySelector('#curves-plot .js-plotly-plot')?._fullLayout",
                               timeout=WAIT_MS)
        start, listed = page.locator("#start").bounding_box(), page.locator("#past-runs").bounding_box()
        assert start["y"] + start["height"] <= height  # the list leaves Start on the first screen
        if name == "phone":  # under the status line and the loss chart, which follow Start and the settings' summary
            # below the chart's bottom edge
            chart = page.locator("#curves-plot").bounding_box()
            assert listed["y"] >= chart["y"] + chart["height"] - 1, (listed, chart)
        choice = page.get_by_label("Runs on this server")
        choice.scroll_into_view_if_needed()
        choice.click()
        option = page.get_by_role("option", name=re.compile(re.escape(run.id)))
        option.wait_for(timeout=WAIT_MS)
        state = "Paused" if name == "desktop" else "Finished"
        assert option.inner_text().startswith(f"{state} · glyphs-mini, norm-softmax, N = 2, M = 1, 1 epoch · "
                                              "another visitor's · started ")
        option.click()
        if name == "desktop":  # picked as it trains (paused): followed to its end, its figures and model then
            page.wait_for_function("() => document.querySelector('#run-status').innerText.startsWith('Paused')",
                                   timeout=WAIT_MS)
            page.wait_for_function("() => document.querySelector('#past-run-summary').innerText"
                                   ".includes('come here when it ends')", timeout=WAIT_MS)
            app.run_manager.resume(run.id, run.owner)
        page.wait_for_function("() => document.querySelector('#run-status').innerText.startsWith('Finished')",
                               timeout=WAIT_MS)
        _wait_until(lambda: not run.training, run)
        final, steps = _final(run)
        assert "You are watching a run started by another visitor" in page.locator("#run-status").inner_text()
        page.wait_for_function("() => document.querySelector('#past-run-summary').innerText.includes('Recall@1')",
                               timeout=WAIT_MS)
        summary = page.locator("#past-run-summary").inner_text()
        assert f"Showing {run.id}" in summary
        assert re.search(rf"Recall@1 \(test\)\s+{100 * final['recall@1']:.2f}", summary), summary
        page.locator("#past-run-download").wait_for(state="visible", timeout=WAIT_MS)  # drawn a moment after the words
        # the loss curve as plotly drew it: every logged step of the run picked (plotly draws a moment after the
        # status line it came with)
        page.wait_for_function("(steps) => { const c = document.querySelector('#curves-plot .js-plotly-plot');"
                               " return c && c._fullData && c._fullData.some(t => t.x && t.x.length === steps); }",
                               arg=steps, timeout=WAIT_MS)
        assert steps in [trace["points"] for trace in _traces(page, "curves-plot")]
        box = choice.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1, box  # the list fits the screen's width
        screenshot(f"train-past-run-{name}", page, full_page=False)
        # gradio's footer: no "Runs" of its own (its API call history) for a visitor to take for these runs
        footer = page.locator("footer").inner_text()
        assert not re.search(r"\bRuns\b|Settings|Built with", footer), footer
        if name == "desktop":  # its link to the client API (a phone's footer leaves it out)
            assert "API" in footer, footer
