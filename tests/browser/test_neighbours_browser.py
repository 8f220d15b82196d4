"""Neighbours on a click, in a real chromium at a laptop's and a phone's size: a real mouse click on a dot of the
few-class picture and on a probe's cross in the all-classes picture opens that image beside its nearest neighbours,
and rings them in the picture."""

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from train_page import pick_glyphs_mini

pytestmark = pytest.mark.browser

WAIT_MS = 90_000


_POINT_AT = """(row) => {
    const chart = document.querySelector('#embedding-plot .js-plotly-plot');
    // the page's script listens on the chart's current emitter (demo/static/page.js, listenForPicks)
    if (!chart || !chart._fullData || chart.memvirPicks !== chart._ev) return null;
    const index = chart._fullData.findIndex(t => t.meta && t.meta.pick);
    const point = chart.querySelectorAll('.scatterlayer .trace')[index].querySelectorAll('.point')[row];
    point.scrollIntoView({block: 'center'});  // a mouse clicks only what the window shows
    const box = point.getBoundingClientRect();
    return [box.x + box.width / 2, box.y + box.height / 2];
}"""
_HOVERS_A_PICK = """() => { const chart = document.querySelector('#embedding-plot .js-plotly-plot');
    return !!(chart && chart._hoverdata && chart._hoverdata.some(p => p.data && p.data.meta && p.data.meta.pick)); }"""
_CAPTION = "() => (document.querySelector('#neighbours-caption .prose') || {innerText: ''}).innerText"
_TRIES = 3


def _click_point(page, row: int = 0) -> str:
    """A real mouse click on point `row` of the picture's clickable trace (its meta names a pick set); the caption it
    brings back. gradio draws a new picture twice and then resizes it, a tenth of a second apart and longer on a busy
    machine: the mouse clicks where the point lies when the picture holds still, once plotly's hover names a
    clickable point there (what plotly sends on a click), and clicks again, as a visitor would, when a redraw took
    the click (up to three times)."""
    before = page.evaluate(_CAPTION)
    for _ in range(_TRIES):
        at, previous = None, None
        for _ in range(50):  # the same place twice, 0.2 s apart
            at = page.evaluate(_POINT_AT, row)
            if at is not None and at == previous:
                break
            previous = at
            page.wait_for_timeout(200)
        assert at is not None, "the picture's clickable points never settled"
        page.mouse.move(*at)
        try:
            page.wait_for_function(_HOVERS_A_PICK, timeout=5_000)
        except PlaywrightTimeout:
            continue
        page.mouse.click(*at)
        try:
            page.wait_for_function(f"(before) => ({_CAPTION})() !== before", arg=before, timeout=30_000)
        except PlaywrightTimeout:
            continue
        return page.evaluate(_CAPTION)
    raise AssertionError(f"{_TRIES} clicks on point {row} of the picture left the neighbours' caption as it was: "
                         f"{before[:200]!r}")


def _ringed(page) -> bool:
    return page.evaluate("""() => {
        const chart = document.querySelector('#embedding-plot .js-plotly-plot');
        return !!(chart && chart._fullData && chart._fullData.some(t => t.name === 'the image clicked'));
    }""")


@pytest.mark.parametrize(("width", "height"), [(1400, 900), (390, 844)])
def test_a_click_on_a_point_opens_its_image_and_nearest_neighbours(open_page, app_url, screenshot, width, height):
    page = open_page(app_url, width, height)
    suffix = "" if width > 600 else "-phone"
    pick_glyphs_mini(page, WAIT_MS)
    page.get_by_label("Batch size", exact=True).fill("32")
    page.get_by_label("Epochs", exact=True).fill("300")
    page.locator("#start").click()
    page.wait_for_function(
        "() => document.querySelector('#snapshot-caption').innerText.includes('Snapshot')", timeout=WAIT_MS)
    page.locator("#stop").click()
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Stopped')",
                           timeout=WAIT_MS)
    page.wait_for_function("""() => { const c = document.querySelector('#embedding-plot .js-plotly-plot');
                                      return c && c._fullData && c._fullData.some(t => t.meta && t.meta.pick); }""",
                           timeout=WAIT_MS)

    caption = _click_point(page, 0)  # the few-class picture (the page's first): a training image's dot
    page.wait_for_function("() => document.querySelectorAll('#neighbours-gallery img').length >= 9",
                           timeout=WAIT_MS)
    assert "a training image of the few-class picture" in caption and "share its class" in caption
    assert page.locator("#neighbours-gallery").inner_text().count("cos ") == 8
    page.wait_for_function("""() => { const c = document.querySelector('#embedding-plot .js-plotly-plot');
                                      return c && c._fullData.some(t => t.name === 'the image clicked'); }""",
                           timeout=WAIT_MS)
    assert not page.locator("#follow input").is_checked()  # the picture stays while the visitor looks
    screenshot(f"train-neighbours{suffix}", page)

    page.get_by_label("all classes by class").check()  # the probe's crosses
    page.wait_for_function("""() => { const c = document.querySelector('#embedding-plot .js-plotly-plot');
                                      return c && c._fullData.some(t => t.name === 'probe (test classes)'); }""",
                           timeout=WAIT_MS)
    assert not _ringed(page)
    # the legend's rows sit under the plot: above it, they covered the title
    title, legend = (page.locator(f"#embedding-plot {part}").first.bounding_box() for part in (".gtitle", ".legend"))
    assert legend["y"] >= title["y"] + title["height"]
    assert "a probe image" in _click_point(page, 3)
    page.wait_for_function("""() => { const c = document.querySelector('#embedding-plot .js-plotly-plot');
                                      return c && c._fullData.some(t => t.name === 'the image clicked'); }""",
                           timeout=WAIT_MS)
    assert page.locator("#neighbours-gallery img").count() >= 9
    screenshot(f"train-neighbours-all-classes{suffix}", page)
