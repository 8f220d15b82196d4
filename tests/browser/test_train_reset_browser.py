"""Reset in a real chromium: every field it owns shows its default again, the "Classes shown" box included, and the
answers beside the sliders and the classes box go, whether the visitor pressed Enter in a box or left a typed value
there. Waits are Playwright's, bounded; nothing asserts speed."""

import pytest

pytestmark = pytest.mark.browser

WAIT_MS = 60_000
N_BOX = "number input for N: past steps used as virtual classes (0 = baseline)"
M_BOX = "number input for M: steps between the past steps used"


def _type_over(box, text):
    box.click()
    box.press("Control+a")
    box.press_sequentially(text)


def test_reset_puts_back_every_field_it_owns_and_clears_the_answers_beside_them(page):
    from demo.train.presets import PRESETS

    glyphs = PRESETS["glyphs"]  # the page opens with glyphs' preset
    page.wait_for_function("() => document.querySelector('#run-status')?.innerText.includes('Ready')",
                           timeout=WAIT_MS)
    n_box, m_box = page.get_by_label(N_BOX, exact=True), page.get_by_label(M_BOX, exact=True)
    epochs, classes = page.get_by_label("Epochs", exact=True), page.locator("#focus-classes textarea, "
                                                                             "#focus-classes input").first
    _type_over(n_box, "7")
    n_box.press("Enter")  # no run: the answer says when it applies, beside the sliders
    page.wait_for_function("() => document.querySelector('#memvir-notice').innerText.includes('press Start')",
                           timeout=WAIT_MS)
    _type_over(m_box, "33")  # left in its box, no Enter
    _type_over(epochs, "40")
    _type_over(classes, "3, 17, 40")
    classes.press("Enter")
    page.wait_for_function("() => document.querySelector('#classes-notice').innerText.includes('next run')",
                           timeout=WAIT_MS)
    _type_over(classes, "5, 6")  # typed again, left there

    page.locator("#reset").click()
    page.wait_for_function("() => document.querySelector('#notice').innerText.includes('Reset')", timeout=WAIT_MS)
    page.wait_for_function("() => !document.querySelector('#memvir-notice').innerText.trim()"
                           " && !document.querySelector('#classes-notice').innerText.trim()", timeout=WAIT_MS)
    assert n_box.input_value() == str(glyphs.memvir_n) and m_box.input_value() == str(glyphs.memvir_m)
    assert epochs.input_value() == str(glyphs.epochs)
    assert classes.input_value() == ""
