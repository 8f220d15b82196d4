"""The Train tab's first screen in a real chromium at 1400 x 900: Start and the status line lie in the first viewport
(their bounding boxes), a click on Start from further down the page brings the status line and the loss chart into
view, a live change's answer appears beside the sliders that sent it, and numbers typed into boxes (epochs, N) and
left there, neither Enter nor Tab pressed, are the ones Start trains with. Waits are Playwright's, bounded; nothing
asserts speed."""

import json
import re

import pytest
from train_page import pick_glyphs_mini

pytestmark = pytest.mark.browser

WAIT_MS = 240_000
SCROLL_MS = 20_000
DESKTOP = (1400, 900)
N_BOX = "number input for N: past steps used as virtual classes (0 = baseline)"


def _inside_viewport(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    width, height = DESKTOP
    return box is not None and box["y"] >= -1 and box["y"] + box["height"] <= height + 1 and box["x"] >= 0 \
        and box["x"] + box["width"] <= width  # a pixel's slack: scrolled-to boxes end at fractions of one


def _stop(page):
    page.locator("#stop").click()
    page.wait_for_function("() => /Stopped|Finished/.test(document.querySelector('#run-status').innerText)",
                           timeout=WAIT_MS)


def test_start_and_the_status_line_are_in_the_first_viewport(open_page, app_url, screenshot):
    page = open_page(app_url, *DESKTOP)
    page.wait_for_function("() => document.querySelector('#run-status')?.innerText.includes('Ready')",
                           timeout=WAIT_MS)
    assert page.evaluate("() => window.scrollY") == 0
    for selector in ("#start", "#run-status", "#notice"):
        assert _inside_viewport(page, selector), (selector, page.locator(selector).bounding_box())
    screenshot("train-first-screen", page, full_page=False)


def test_typed_numbers_left_in_their_boxes_are_what_start_trains_and_the_status_comes_into_view(
        open_page, app_url, app_root):
    page = open_page(app_url, *DESKTOP)
    pick_glyphs_mini(page, WAIT_MS)  # N 3, M 10, warm-up 1, 8 epochs
    epochs = page.get_by_label("Epochs", exact=True)
    epochs.click()
    epochs.press("Control+a")
    epochs.press_sequentially("300")  # neither Enter nor Tab: the visitor goes straight to Start
    n_box = page.get_by_label(N_BOX, exact=True)
    n_box.scroll_into_view_if_needed()  # the sliders lie further down: the status line leaves the screen
    n_box.click()
    n_box.press("Control+a")
    n_box.press_sequentially("5")
    page.evaluate("() => window.scrollBy(0, 400)")
    assert not _inside_viewport(page, "#run-status")
    assert _inside_viewport(page, "#start")  # the run's buttons stay in sight down the settings
    page.locator("#start").click()
    page.wait_for_function("() => document.querySelector('#notice').innerText.includes('Started run')",
                           timeout=WAIT_MS)
    run_id = re.search(r"Started run `?([\w-]+)`?", page.locator("#notice").inner_text()).group(1)
    # the click scrolls the page back up (smoothly: a bounded wait, not a measure of speed), the status line to the
    # window's top edge now that the runs list lies above it (scrollIntoView's sub-pixel rounding: -0.31 px measured)
    page.wait_for_function("() => { const r = document.querySelector('#run-status').getBoundingClientRect();"
                           " return r.top >= -1 && r.bottom <= window.innerHeight + 1; }", timeout=SCROLL_MS)
    assert _inside_viewport(page, "#run-status")
    chart = page.locator("#curves-plot").bounding_box()
    assert chart["y"] < DESKTOP[1], chart  # the loss chart begins on the screen, under the status line
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Training')",
                           timeout=WAIT_MS)  # its process has written the configuration it trains
    config = json.loads((app_root / "data" / "runs" / run_id / "train_config.json").read_text())
    assert (config["epochs"], config["memvir_n"]) == (300, 5)
    assert n_box.input_value() == "5" and epochs.input_value() == "300"

    # a live change's answer appears beside the sliders, not at the top of the page
    n_box.click()
    n_box.press("Control+a")
    n_box.press_sequentially("5")
    n_box.press("Enter")  # the value the run has: nothing to change
    page.wait_for_function("() => document.querySelector('#memvir-notice').innerText.includes('already uses')",
                           timeout=WAIT_MS)
    # under the sliders, and scrolled to: on the screen with the box typed into (the top of the page is not)
    page.wait_for_function("() => { const r = document.querySelector('#memvir-notice').getBoundingClientRect();"
                           " return r.top >= 0 && r.bottom <= window.innerHeight + 1; }", timeout=SCROLL_MS)
    assert not _inside_viewport(page, "#notice")
    memvir = page.locator("#memvir-controls").bounding_box()
    notice = page.locator("#memvir-notice").bounding_box()
    assert memvir["y"] < notice["y"] < memvir["y"] + memvir["height"]
    _stop(page)


def test_the_sticky_run_buttons_are_never_overdrawn_by_the_settings_scrolling_under_them(open_page, app_url):
    """Scrolled in steps through the settings, the element at each of the sticky bar's buttons' centres is that
    button (or inside it): the settings' labels drew over Start and Stop ("Batch size" over Start)."""
    page = open_page(app_url, *DESKTOP)
    page.wait_for_function("() => document.querySelector('#run-status')?.innerText.includes('Ready')",
                           timeout=WAIT_MS)
    covered = page.evaluate("""async () => {
        const covered = [];
        for (let y = 0; y <= 1600; y += 40) {
            window.scrollTo(0, y);
            await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
            for (const id of ['start', 'stop']) {
                // gradio may be redrawing the button when the page's poll updates it (seen once under load, three
                // workers on two cores): wait for it to be back rather than read a missing element
                let button = document.getElementById(id);
                while (!button) {
                    await new Promise(r => requestAnimationFrame(r));
                    button = document.getElementById(id);
                }
                const box = button.getBoundingClientRect();
                if (box.bottom <= 0 || box.top >= window.innerHeight) continue;
                const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
                if (hit !== button && !button.contains(hit)) {
                    const what = hit ? (hit.innerText || hit.tagName).slice(0, 40) : 'nothing';
                    covered.push(`${id} at scroll ${y}: ${what}`);
                }
            }
        }
        return covered;
    }""")
    assert covered == [], covered
