"""Neighbours on a click, in a real chromium at a laptop's and a phone's size: a real mouse click on a dot of the
few-class picture and on a probe's cross in the all-classes picture opens that image beside its nearest neighbours,
and rings them in the picture."""

import pytest
from train_page import pick_glyphs_mini

pytestmark = pytest.mark.browser

WAIT_MS = 90_000


def _click_point(page, row: int = 0) -> None:
    """A real mouse click on point `row` of the picture's clickable trace (its meta names a pick set)."""
    at = page.evaluate(
        """(row) => {
            const chart = document.querySelector('#embedding-plot .js-plotly-plot');
            const index = chart._fullData.findIndex(t => t.meta && t.meta.pick);
            const point = chart.querySelectorAll('.scatterlayer .trace')[index].querySelectorAll('.point')[row];
            point.scrollIntoView({block: 'center'});  // a mouse clicks only what the window shows
            const box = point.getBoundingClientRect();
            return [box.x + box.width / 2, box.y + box.height / 2];
        }""", row)
    page.mouse.move(*at)
    page.mouse.click(*at)


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

    _click_point(page, 0)  # the few-class picture (the page's first): a training image's dot
    page.wait_for_function("() => document.querySelectorAll('#neighbours-gallery img').length >= 9",
                           timeout=WAIT_MS)
    caption = page.locator("#neighbours-caption").inner_text()
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
    _click_point(page, 3)
    page.wait_for_function(
        "() => document.querySelector('#neighbours-caption').innerText.includes('a probe image')", timeout=WAIT_MS)
    page.wait_for_function("""() => { const c = document.querySelector('#embedding-plot .js-plotly-plot');
                                      return c && c._fullData.some(t => t.name === 'the image clicked'); }""",
                           timeout=WAIT_MS)
    assert page.locator("#neighbours-gallery img").count() >= 9
    screenshot(f"train-neighbours-all-classes{suffix}", page)
