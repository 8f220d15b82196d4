"""The live controls in a real chromium: a number typed over a slider's box and Enter apply exactly that number to
the running run (not the box's previous value), leaving a box with Tab sends nothing, the note beside the controls
says a change is pending until the run says the step it applied at, the last of two quick changes wins, a reloaded
page shows the run's values, and another visitor's page shows them read-only. Waits are Playwright's, bounded;
nothing asserts speed."""

import json
import re

import pytest
from train_page import pick_glyphs_mini

pytestmark = pytest.mark.browser

WAIT_MS = 240_000
BOXES = {"N": "N: past steps used as virtual classes (0 = baseline)", "M": "M: steps between the past steps used",
         "warm-up": "Warm-up (epochs) before virtual classes"}


def _box(page, label):
    return page.get_by_label(f"number input for {label}", exact=True)


def _live_updates(page, sent):
    """Record the live-change requests the page sends, by their event's api_name."""
    names = page.evaluate("() => Object.fromEntries(window.gradio_config.dependencies.map(d => [d.id, d.api_name]))")

    def seen(request):
        if request.method == "POST" and request.post_data:
            body = json.loads(request.post_data)
            name = names.get(str(body.get("fn_index")))
            if name in ("update_n", "update_m", "update_warmup"):
                sent.append((name, body.get("data")))
    page.on("request", seen)


def _start_long_run(page) -> list:
    """Start a 300-epoch glyphs-mini run (preset N 3, M 10, warm-up 1) and wait until it trains; the list the live
    changes the page sends from then on are recorded in."""
    pick_glyphs_mini(page, WAIT_MS)
    page.get_by_label("Epochs", exact=True).fill("300")
    page.get_by_label("Epochs", exact=True).press("Tab")
    page.locator("#start").click()
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Training')",
                           timeout=WAIT_MS)
    sent = []
    _live_updates(page, sent)
    return sent


def test_typed_values_apply_exactly_the_last_change_wins_and_a_reloaded_page_shows_the_run(page, app_root):
    sent = _start_long_run(page)

    # a click into a box and a Tab out of it, its value unchanged: no live change goes out
    _box(page, BOXES["N"]).click()
    _box(page, BOXES["N"]).press("Tab")
    page.wait_for_timeout(1500)
    assert sent == []

    # the glyphs-mini preset is N 3, M 10, warm-up 1: each typed over and applied with Enter; beside the controls,
    # the step it applied at, and the status line lists it among the run's changes
    for _name, label, typed, words in (("update_n", BOXES["N"], "5", r"N 3 -> 5: applied at step \d+"),
                                      ("update_m", BOXES["M"], "7", r"M 10 -> 7: applied at step \d+"),
                                      ("update_warmup", BOXES["warm-up"], "2",
                                       r"warm-up \(epochs\) 1(\.0)? -> 2(\.0)?: applied at step \d+")):
        box = _box(page, label)
        box.click()  # into the box, as a visitor does: the click alone sends nothing
        box.press("Control+a")
        box.press_sequentially(typed)  # typed over the old value, key by key, as a visitor does
        box.press("Enter")
        _note_shows(page, words)
        assert box.input_value() == typed
    status = page.locator("#run-status").inner_text()
    assert re.search(r"Live changes: N 3 -> 5 at step [\d,]+, M 10 -> 7 at step [\d,]+, warm-up \(epochs\) 1 -> 2 "
                     r"at step [\d,]+", status), status
    assert [name for name, _ in sent] == ["update_n", "update_m", "update_warmup"]
    # each request carried its own control's value alone: the setting it changes is the event's
    assert [data[2] for _, data in sent] == [5, 7, 2]

    # Two changes within a second: the second is sent once the first is answered (gradio's default dropped it while
    # the first was pending) and the run ends at the second. A reload then shows the run's N and M, and a change of
    # M leaves N alone (before, the reloaded page's defaults went out with it). In the same run: a start costs the
    # suite a page and a run's process.
    sent.clear()
    _type(page, BOXES["N"], "6")
    _type(page, BOXES["N"], "4")  # at once: the first is still on its way
    # applied one after the other (N 6 -> 4), or together before one step (N 5 -> 4): the run ends at 4
    _note_shows(page, r"N [56] -> 4: applied at step \d+")
    assert [(name, data[2]) for name, data in sent] == [("update_n", 6), ("update_n", 4)]

    page.reload()
    page.wait_for_function("() => (document.querySelector('#run-status')?.innerText || '').includes('Training')",
                           timeout=WAIT_MS)
    page.wait_for_function("(label) => document.querySelector(`input[aria-label=\"number input for ${label}\"]`)"
                           "?.value === '4'", arg=BOXES["N"], timeout=WAIT_MS)
    assert _box(page, BOXES["M"]).input_value() == "7"  # the run's M, not the preset's 10

    # another visitor's page (a browser of its own) shows the run's values, read-only
    watcher = page.context.browser.new_context().new_page()
    watcher.goto(page.url)
    watcher.wait_for_function("(label) => { const box = document.querySelector("
                              "`input[aria-label=\"number input for ${label}\"]`); "
                              "return box && box.value === '4' && box.disabled; }", arg=BOXES["N"], timeout=WAIT_MS)
    assert _box(watcher, BOXES["M"]).input_value() == "7" and _box(watcher, BOXES["M"]).is_disabled()

    _type(page, BOXES["M"], "12")
    _note_shows(page, r"M 7 -> 12: applied at step \d+")
    assert "N 4 ->" not in page.locator("#run-status").inner_text()  # N was not sent back to a default
    # the watcher's page follows the run's confirmed change
    watcher.wait_for_function("(label) => document.querySelector(`input[aria-label=\"number input for ${label}\"]`)"
                              "?.value === '12'", arg=BOXES["M"], timeout=WAIT_MS)
    watcher.context.close()
    page.locator("#stop").click()
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Stopped')",
                           timeout=WAIT_MS)
    # the run rests: nothing stays beside the controls
    page.wait_for_function("() => (document.querySelector('#memvir-notice')?.innerText || '').trim() === ''",
                           timeout=WAIT_MS)


def _type(page, label, value):
    box = _box(page, label)
    box.click()
    box.press("Control+a")
    box.press_sequentially(value)
    box.press("Enter")


def _note_shows(page, words):
    """Wait until the note beside the live controls matches `words`."""
    page.wait_for_function("(words) => new RegExp(words).test(document.querySelector('#memvir-notice').innerText)",
                           arg=words, timeout=WAIT_MS)
