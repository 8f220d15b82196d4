"""A real headless chromium on the page: train and watch the curves and a snapshot appear, stop; search with an
uploaded image and see k results. Waits are Playwright's, bounded; nothing asserts speed."""

import pytest
from train_page import pick_glyphs_mini

pytestmark = pytest.mark.browser

WAIT_MS = 90_000


def _plot_points(page, plot_id: str, trace_name: str | None = None) -> int:
    """Points in a trace of the plotly chart inside #plot_id (the first trace when no name), 0 when not drawn."""
    return page.evaluate(
        """([plotId, name]) => {
            const chart = document.querySelector(`#${plotId} .js-plotly-plot`);
            if (!chart || !chart._fullData) return 0;
            const trace = name ? chart._fullData.find(t => t.name === name) : chart._fullData[0];
            return trace && trace.x ? trace.x.length : 0;
        }""",
        [plot_id, trace_name],
    )


def test_train_then_stop(page, screenshot):
    pick_glyphs_mini(page, WAIT_MS)
    page.get_by_label("Batch size", exact=True).fill("32")
    page.get_by_label("Epochs", exact=True).fill("300")
    page.locator("#start").click()
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Training')",
                           timeout=WAIT_MS)
    page.wait_for_function(
        """() => { const c = document.querySelector('#curves-plot .js-plotly-plot');
                   const t = c && c._fullData && c._fullData.find(t => t.name === 'loss');
                   return t && t.x.length >= 3; }""", timeout=WAIT_MS)
    first = _plot_points(page, "curves-plot", "loss")
    page.wait_for_function(
        """(n) => { const c = document.querySelector('#curves-plot .js-plotly-plot');
                    const t = c && c._fullData && c._fullData.find(t => t.name === 'loss');
                    return t && t.x.length > n; }""", arg=first, timeout=WAIT_MS)
    page.wait_for_function(
        "() => document.querySelector('#snapshot-caption').innerText.includes('Snapshot')", timeout=WAIT_MS)
    assert _plot_points(page, "embedding-plot") > 0
    screenshot("train-running")

    page.locator("#stop").click()
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Stopped')",
                           timeout=WAIT_MS)
    assert "press Resume to continue" in page.locator("#run-status").inner_text()
    screenshot("train-stopped")

    # Resume's one listener says so and ticks "follow" again (a scrub while it rested unticks it)
    page.locator("#follow input").uncheck()
    page.locator("#resume").click()
    page.wait_for_function("() => document.querySelector('#notice').innerText.includes('Resumed.')",
                           timeout=WAIT_MS)
    page.wait_for_function("() => document.querySelector('#follow input').checked", timeout=WAIT_MS)
    # the status line still says Stopped until the resumed run's status reaches it: a wait for Stopped before that
    # passed at once, the page closed with the Stop unsent, and the run trained its 300 epochs behind the next tests
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Training')",
                           timeout=WAIT_MS)
    page.locator("#stop").click()
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Stopped')",
                           timeout=WAIT_MS)


def test_search_with_an_uploaded_image(page, screenshot, tmp_path):
    from memvir.data import load_dataset

    query = tmp_path / "query.png"
    load_dataset("glyphs-mini").test.image(40).resize((64, 64)).save(query)
    page.get_by_role("tab", name="Retrieve").click()
    page.locator("#query-file input[type=file]").set_input_files(str(query))
    page.locator("#search-upload").click()
    results = page.locator("#results .result-tile")
    page.wait_for_function("() => document.querySelectorAll('#results .result-tile').length >= 8",
                           timeout=WAIT_MS)
    assert results.count() == 8  # k defaults to 8
    assert "similarity" in page.locator("#results").inner_text() or results.first.is_visible()
    assert "Recall@1" in page.locator("#retrieval-summary").inner_text()
    assert "share the query's class" not in page.locator("#retrieval-summary").inner_text()  # no class typed
    # the model input's label sits above the image, not over its corner
    label, shown = page.locator("#model-input-label").bounding_box(), page.locator("#model-input img").bounding_box()
    assert label["y"] + label["height"] <= shown["y"] + 1
    screenshot("retrieval-results")

    # a click on a result searches with that gallery image, whose class the gallery knows
    second = results.nth(1).get_attribute("data-item")
    results.nth(1).click()
    page.wait_for_function(
        "() => document.querySelector('#retrieval-summary').innerText.includes(\"share the query's class\")",
        timeout=WAIT_MS)
    assert results.count() == 8
    assert second not in [results.nth(i).get_attribute("data-item") for i in range(8)]  # itself left out


def test_search_with_a_drawing(page, screenshot):
    """The browser's editor sends the drawing as blobs; the app decodes it only after checking its size. The brush
    is chosen from the start: the stroke draws without a tool picked first."""
    page.get_by_role("tab", name="Retrieve").click()
    page.get_by_role("tab", name="Draw").click()
    page.locator("#sketch button[aria-label='Brush'].highlight").wait_for(timeout=WAIT_MS)  # chosen, not clicked
    box = page.locator("#sketch canvas").first.bounding_box()
    middle_x, middle_y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2  # the paper sits in the middle
    page.mouse.move(middle_x, middle_y - 80)
    page.mouse.down()
    page.mouse.move(middle_x, middle_y + 80, steps=12)
    page.mouse.move(middle_x + 50, middle_y + 80, steps=6)
    page.mouse.up()
    page.locator("#search-drawing").click()
    page.wait_for_function("() => document.querySelectorAll('#results .result-tile').length >= 8",
                           timeout=WAIT_MS)
    assert "nearest of" in page.locator("#retrieval-summary").inner_text()
    screenshot("retrieval-drawing")


def test_a_page_that_stops_hearing_from_the_server_says_so_and_recovers_by_itself(page, screenshot):
    import re

    page.wait_for_function("() => document.querySelector('#run-status')?.innerText.includes('Ready')",
                           timeout=WAIT_MS)
    notice = page.locator("#stale-notice")
    assert notice.is_hidden()
    # the unqueued events' requests, the poll's among them, held on their way and never answered, as on a connection
    # that hangs (a failed request makes gradio reload the page, which starts afresh)
    cut_off, held = re.compile(r"/gradio_api/run/predict"), []
    page.route(cut_off, lambda route: held.append(route))
    notice.wait_for(state="visible", timeout=30_000)
    assert re.fullmatch(r"No update from the server for \d+ s\. This page keeps asking and catches up by itself "
                        r"when the answers come again; a run trains on meanwhile\.", notice.inner_text().strip())
    screenshot("stale-notice", full_page=False)
    marker = page.evaluate("() => window.memvirMarker = Math.random()")
    page.unroute(cut_off)  # the held requests go on to the server, late, and so do the next polls
    assert held
    notice.wait_for(state="hidden", timeout=30_000)  # the next answer takes it down...
    assert page.evaluate("() => window.memvirMarker") == marker  # ...in the same page, not a reloaded one
