"""The Retrieve tab's offers as a visitor meets them (issue 31, item 7), in a real headless chromium on the app as
app.py serves it (the bundled checkpoints): the Pick tab's images whole (opened before Load, too) and their captions
uncut at 1400 x 900 and 390 x 844, the query's drop zone before any gallery drop zone on a phone, the query's
class picked from the gallery's classes, and an unreachable Hub said in one toast in a visitor's words (the tests run
with HF_HUB_OFFLINE=1). Waits are Playwright's, bounded; nothing asserts speed."""

import pytest

pytestmark = pytest.mark.browser

WAIT_MS = 120_000
PHONE = (390, 844)
# Each Pick image's fit in its square tile, whether the tile lies whole inside the gallery's box (gradio's grid of
# eight columns at least 100 px wide cut the eighth off beside the settings), and whether its caption's text is wider
# than the caption's box.
PICK_BOXES = """() => [...document.querySelectorAll('#sample .thumbnail-item')].map(tile => {
    const image = tile.querySelector('img'), label = tile.querySelector('.caption-label');
    const box = tile.closest('#sample').getBoundingClientRect(), own = tile.getBoundingClientRect();
    return {fit: getComputedStyle(image).objectFit, inside: own.left >= box.left - 0.5 && own.right <= box.right + 0.5,
            caption: label ? label.textContent.trim() : null,
            cut: label ? label.scrollWidth > label.clientWidth : null};
})"""


def _open_pick(page, load_first):
    page.get_by_role("tab", name="Retrieve").click()
    if load_first:
        page.locator("#load").click()
    page.get_by_role("tab", name="Pick").click()  # before Load, Pick loads the chosen checkpoint's gallery itself
    page.locator("#sample img").nth(5).wait_for(timeout=WAIT_MS)
    return page.evaluate(PICK_BOXES)


def _pick_images_are_whole_and_their_captions_uncut(page, screenshot, size, load_first=True):
    tiles = _open_pick(page, load_first)
    assert len(tiles) == 48
    assert all(tile["fit"] == "contain" for tile in tiles)  # not cropped to the square tile
    assert all(tile["inside"] for tile in tiles), sum(not tile["inside"] for tile in tiles)  # no column cut off
    assert all(tile["caption"] and not tile["cut"] for tile in tiles), [t for t in tiles if t["cut"]][:3]
    screenshot(f"retrieve-pick-{'phone' if size == PHONE else 'desktop'}", page, full_page=False)


def _on_a_phone_the_query_comes_before_the_gallery(page, screenshot):
    page.get_by_role("tab", name="Retrieve").click()
    page.locator("#query-file").wait_for(timeout=WAIT_MS)
    drop_zones = page.evaluate("""() => [...document.querySelectorAll('input[type=file]')]
        .filter(input => input.closest('#query-file, #gallery-files'))
        .filter(input => input.closest('.block').getBoundingClientRect().height > 0)
        .map(input => [input.closest('#query-file') ? 'query' : 'gallery',
                       input.closest('.block').getBoundingClientRect().top])""")
    assert [name for name, _ in drop_zones] == ["query"]  # the gallery's waits until uploads are chosen
    page.get_by_label("my uploaded images or zip").check()
    page.locator("#gallery-files").wait_for(state="visible", timeout=WAIT_MS)
    screenshot("retrieve-phone-query-first", page, full_page=False)


def _the_query_class_is_picked_from_the_gallery_s_classes(page):
    page.get_by_role("tab", name="Retrieve").click()
    page.locator("#query-class-list input").click()
    page.locator("#query-class-list input").fill("O U+004F")
    page.get_by_role("option", name="O U+004F", exact=True).click()
    page.wait_for_function("() => document.querySelector('#query-class input, #query-class textarea').value === 'O'",
                           timeout=WAIT_MS)


def _an_unreachable_hub_is_one_toast_in_a_visitor_s_words(page):
    page.get_by_role("tab", name="Retrieve").click()
    checkpoint = page.locator("#checkpoint input")
    checkpoint.fill("someone/some-model")
    checkpoint.press("Enter")
    page.locator("#load").click()
    page.wait_for_function("() => document.querySelector('#retrieval-summary').innerText.includes('⚠️')",
                           timeout=WAIT_MS)
    page.wait_for_timeout(2_000)  # a second toast, if any, has come by now
    toasts = page.locator("[data-testid='toast-body']").all_inner_texts()
    assert len(toasts) == 1, toasts
    assert "the Hub cannot be reached from this server; pick a bundled checkpoint" in toasts[0]
    assert "HF_HUB_OFFLINE" not in toasts[0] and "cache" not in toasts[0]


# One page for each size, its checks in turn: each page load costs the suite seconds of chromium's time
# (docs/benchmarks.md, "The test suite"). The Hub's comes last, since it leaves a Hub repo id in the checkpoint box.
def test_on_a_desktop_pick_images_whole_the_query_class_from_the_gallery_and_an_unreachable_hub_in_one_toast(
        open_page, bundled_app_url, screenshot):
    page = open_page(bundled_app_url, 1400, 900)
    page.wait_for_selector("#start")
    _the_query_class_is_picked_from_the_gallery_s_classes(page)
    _pick_images_are_whole_and_their_captions_uncut(page, screenshot, (1400, 900), load_first=False)
    _an_unreachable_hub_is_one_toast_in_a_visitor_s_words(page)


def test_on_a_phone_pick_images_whole_and_the_query_before_the_gallery(open_page, bundled_app_url, screenshot):
    page = open_page(bundled_app_url, *PHONE)
    page.wait_for_selector("#start")
    _pick_images_are_whole_and_their_captions_uncut(page, screenshot, PHONE)
    page.get_by_role("tab", name="Upload").click()  # back from Pick to where a query is uploaded
    _on_a_phone_the_query_comes_before_the_gallery(page, screenshot)
