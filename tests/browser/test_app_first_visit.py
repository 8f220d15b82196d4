"""What a new visitor meets, in a real headless chromium: the first search with the default bundled checkpoint (its
time printed, never asserted), result captions whole at desktop and phone widths, the phone layout of both tabs
(390 x 844), and a checkpoint downloaded as a zip. Screenshots land in test-output/browser/."""

import io
import time
import zipfile

import pytest

pytestmark = pytest.mark.browser

WAIT_MS = 90_000
PHONE = (390, 844)
QUERY_CLASS = "O"  # the class of conftest's glyph_query (GLYPH_QUERY_CLASS)


def _search(page, query) -> float:
    """Upload `query` on the Retrieve tab, naming its class, and search; seconds from the click to the tiles."""
    page.get_by_role("tab", name="Retrieve").click()
    page.locator("#query-class input, #query-class textarea").first.fill(QUERY_CLASS)
    page.locator("#query-file input[type=file]").set_input_files(str(query))
    started = time.perf_counter()
    page.locator("#search-upload").click()
    page.wait_for_function("() => document.querySelectorAll('#results .result-tile').length >= 8", timeout=WAIT_MS)
    return time.perf_counter() - started


def _assert_captions_whole(page):
    """Every caption shows rank, similarity, class and mark, none of it cut off."""
    captions = page.locator("#results figcaption")
    assert captions.count() == 8
    for text in captions.all_inner_texts():
        assert text.startswith("#") and "U+" in text and ("same class" in text or "other class" in text), text
    clipped = page.evaluate("""() => [...document.querySelectorAll('#results figcaption, #results figcaption *')]
        .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right
                     > e.closest('.result-tile').getBoundingClientRect().right + 1).length""")
    assert clipped == 0


def test_the_first_search_with_the_default_bundled_checkpoint(open_page, bundled_app_url, glyph_query, screenshot,
                                                              capsys):
    page = open_page(bundled_app_url, 1400, 900)
    page.wait_for_selector("#start")
    page.get_by_role("tab", name="Retrieve").click()
    assert "glyphs-norm-softmax-memvir" in page.locator("#checkpoint input").input_value()
    assert page.locator("#query-class input, #query-class textarea").first.get_attribute("placeholder") == "e.g. A"
    seconds = _search(page, glyph_query)
    with capsys.disabled():
        print(f"\nfirst search in the browser, default bundled checkpoint: {seconds:.2f} s from the click to the "
              "results")
    _assert_captions_whole(page)
    assert page.locator("#results .hit-mark.same").count() >= 1
    assert "share the query's class (O U+004F)" in page.locator("#retrieval-summary").inner_text()
    page.locator("#results").scroll_into_view_if_needed()
    screenshot("retrieval-desktop", page, full_page=False)


def test_results_on_a_phone(open_page, bundled_app_url, glyph_query, screenshot):
    page = open_page(bundled_app_url, *PHONE)
    page.wait_for_selector("#start")
    _search(page, glyph_query)
    _assert_captions_whole(page)
    page.evaluate("document.querySelector('#results').scrollIntoView({block: 'start'})")
    screenshot("retrieval-phone", page, full_page=False)


def test_the_phone_layout(open_page, app_url, screenshot):
    page = open_page(app_url, *PHONE)
    start, status = page.locator("#start"), page.locator("#run-status")
    start.wait_for()
    # the page laid out and live: its first poll answered (on a busy machine gradio renders in steps)
    page.wait_for_function("() => document.querySelector('#run-status')?.innerText.includes('Ready')", timeout=90_000)
    # the status in view after Start, once the layout settles: under load the first poll's answer came once before
    # gradio had laid the settings out (the status 1,250 px below Start; in its place in the screenshot after)
    page.wait_for_function("""(height) => {
        const top = (selector) => document.querySelector(selector).getBoundingClientRect().top;
        return Math.abs(top('#run-status') - top('#start')) < height; }""", arg=PHONE[1], timeout=WAIT_MS)
    assert abs(status.bounding_box()["y"] - start.bounding_box()["y"]) < PHONE[1]
    assert page.locator("#curves-plot").bounding_box()["y"] < page.locator("#stop").bounding_box()["y"]
    # The empty snapshot's message is broken into lines that fit its chart (demo/static/page.js).
    page.wait_for_function("""() => { const t = document.querySelector('#embedding-plot .annotation-text');
                                      return t && t.querySelectorAll('tspan.line').length > 1; }""", timeout=WAIT_MS)
    chart = page.locator("#embedding-plot .js-plotly-plot").bounding_box()
    message = page.locator("#embedding-plot .annotation-text").bounding_box()
    assert chart["x"] <= message["x"] and message["x"] + message["width"] <= chart["x"] + chart["width"]
    page.locator("#curves-plot .js-plotly-plot").hover()  # where plotly shows its mode bar, over the title
    assert not page.locator("#curves-plot .modebar-container").is_visible()
    screenshot("train-phone", page)

    page.get_by_role("tab", name="Retrieve").click()
    for name in ("Upload", "Draw", "Pick"):
        assert page.get_by_role("tab", name=name, exact=True).is_visible()


def test_download_a_checkpoint(page):
    page.get_by_role("tab", name="Retrieve").click()
    assert not page.locator("#checkpoint-zip").is_visible()  # no empty box before there is a zip
    page.locator("#download-checkpoint").click()
    link = page.locator("#checkpoint-zip a[href$='/glyphs-mini-tiny.zip']")
    link.wait_for(timeout=WAIT_MS)
    assert "unzip it" in page.locator("#download-note").inner_text()
    body = page.request.get(link.get_attribute("href")).body()  # what the link saves
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        assert sorted(archive.namelist()) == [f"glyphs-mini-tiny/{name}"
                                              for name in ("README.md", "config.json", "model.safetensors")]
