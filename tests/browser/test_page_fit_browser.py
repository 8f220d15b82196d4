"""What the page shows fits where it is shown, in a real chromium at a laptop's and a phone's size: every text box
shows its whole value or placeholder (the dataset's name and the bundled checkpoints' were cut off), and a dropdown
left by Tab closes its list."""

import pytest

pytestmark = pytest.mark.browser

# Each visible text box whose value (or, empty, its placeholder) is wider than the room inside it, in the box's font
CLIPPED = """() => [...document.querySelectorAll('input[type=text], input:not([type]), textarea')]
    .filter(box => box.offsetParent)
    .map(box => {
        const text = box.value || box.placeholder;
        const style = getComputedStyle(box);
        const measure = document.createElement('canvas').getContext('2d');
        measure.font = style.font;
        const room = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
        const where = box.closest('[id]');
        return {box: where ? where.id : '', text, width: Math.round(measure.measureText(text).width),
                room: Math.round(room)};
    })
    .filter(found => found.width > found.room)"""


@pytest.mark.parametrize(("width", "height"), [(1400, 900), (390, 844)])
def test_every_text_box_shows_its_whole_value_or_placeholder(open_page, bundled_app_url, width, height):
    page = open_page(bundled_app_url, width, height)
    page.locator("#start").wait_for(timeout=90_000)
    page.locator("#dataset input").wait_for(timeout=90_000)
    assert page.evaluate(CLIPPED) == []
    page.get_by_role("tab", name="Retrieve").click()
    page.wait_for_function("() => document.querySelector('#checkpoint input') && "
                           "document.querySelector('#checkpoint input').value.includes('bundled')", timeout=90_000)
    assert page.evaluate(CLIPPED) == []


def test_a_dropdown_opened_by_focus_closes_when_tab_leaves_it(page):
    """Gradio opens a dropdown's list when it takes focus; left by Tab, each stayed open over the page."""
    expanded = ("() => [...document.querySelectorAll('input[role=combobox]')]"
                ".filter(box => box.getAttribute('aria-expanded') === 'true').length")
    shown = "() => [...document.querySelectorAll('[role=listbox]')].filter(list => list.offsetParent).length"
    # beside it, why the paper's regime is not among the choices (docs/reproduction.md, section 10)
    assert "The paper's own setting, a pretrained backbone fine-tuned" in page.locator("#dataset").inner_text()
    page.locator("#dataset input").focus()
    page.wait_for_function(f"() => ({expanded})() === 1", timeout=30_000)  # opened by focus, as gradio does
    for _ in range(3):  # the dataset's, the backbone's and the loss's dropdowns, one after another
        page.keyboard.press("Tab")
        page.wait_for_function(f"() => ({expanded})() <= 1", timeout=30_000)
    page.keyboard.press("Tab")
    page.wait_for_function(f"() => ({expanded})() === 0 && ({shown})() === 0", timeout=30_000)
    # a pick with the mouse still works
    page.locator("#dataset input").click()
    page.get_by_role("option", name="glyphs-mini: 48 characters").click()
    assert page.locator("#dataset input").input_value() == "glyphs-mini: 48 characters"
