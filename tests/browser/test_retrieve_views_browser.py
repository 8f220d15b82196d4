"""The Retrieve tab's views of what a checkpoint gets wrong, in a real headless chromium on the app as app.py serves
it (the bundled checkpoints): an uploaded query side by side for the bundled MemVir checkpoint and its baseline with
both AP@R values shown, the hardest queries of the MemVir checkpoint whose first row's AP@R and first correct rank
equal a hand computation from its shipped gallery embeddings, and the per-class table. Desktop 1400 x 900, and the
side by side on a phone (390 x 844). Waits are Playwright's, bounded; nothing asserts speed."""

import json
import re

import numpy as np
import pytest

pytestmark = pytest.mark.browser

WAIT_MS = 120_000
PHONE = (390, 844)
QUERY_CLASS = "O"  # the class of conftest's glyph_query (GLYPH_QUERY_CLASS)
BUNDLED = "checkpoints/glyphs-norm-softmax-memvir"


def _side_by_side(page, query):
    page.get_by_role("tab", name="Retrieve").click()
    page.locator("#query-class input, #query-class textarea").first.fill(QUERY_CLASS)
    page.locator("#query-file input[type=file]").set_input_files(str(query))
    page.locator("#compare-upload").click()
    page.wait_for_function("() => document.querySelectorAll('#results .side-figures').length === 2",
                           timeout=WAIT_MS)
    return page.locator("#results .side-figures").all_inner_texts()


def test_an_uploaded_query_side_by_side_with_both_ap_at_r(open_page, bundled_app_url, glyph_query, screenshot):
    page = open_page(bundled_app_url, 1400, 900)
    page.wait_for_selector("#start")
    page.get_by_role("tab", name="Retrieve").click()
    assert "glyphs-norm-softmax-baseline" in page.locator("#second-checkpoint input").input_value()
    figures = _side_by_side(page, glyph_query)
    for text in figures:
        assert re.search(r"AP@R [01]\.\d{3} · first correct #\d+", text), text
    names = page.locator("#results .side-name").all_inner_texts()
    assert names == ["glyphs-norm-softmax-memvir", "glyphs-norm-softmax-baseline"]
    summary = page.locator("#retrieval-summary").inner_text()
    assert summary.count("AP@R") == 2
    columns = page.evaluate("""() => [...document.querySelectorAll('#results .side-column')]
        .map(c => c.getBoundingClientRect().left)""")
    assert len(columns) == 2 and columns[1] > columns[0]  # next to each other on a desktop
    screenshot("retrieve-side-by-side", page)


def test_a_clicked_gallery_image_side_by_side(open_page, bundled_app_url, screenshot):
    """Load, click a sample image (its class is the gallery's), then ask for it side by side: both AP@R values, the
    query left out of the galleries (R = its class's other 11 images)."""
    page = open_page(bundled_app_url, 1400, 900)
    page.wait_for_selector("#start")
    page.get_by_role("tab", name="Retrieve").click()
    page.locator("#load").click()
    page.get_by_role("tab", name="Pick").click()
    page.locator("#sample img").nth(5).wait_for(timeout=WAIT_MS)
    page.locator("#sample img").nth(5).click()
    page.wait_for_function("() => document.querySelectorAll('#results .result-tile').length >= 8", timeout=WAIT_MS)
    page.locator("#compare-pick").click()
    page.wait_for_function("() => document.querySelectorAll('#results .side-figures').length === 2",
                           timeout=WAIT_MS)
    for text in page.locator("#results .side-figures").all_inner_texts():
        assert re.search(r"AP@R [01]\.\d{3} · first correct #\d+ · 11 of its class", text), text


def _side_by_side_on_a_phone(page, glyph_query, screenshot):
    assert len(_side_by_side(page, glyph_query)) == 2
    boxes = page.evaluate("""() => [...document.querySelectorAll('#results .side-column')]
        .map(c => { const b = c.getBoundingClientRect(); return [b.left, b.top, b.right]; })""")
    assert boxes[1][1] > boxes[0][1]  # one above the other
    assert all(right <= PHONE[0] + 1 for _, _, right in boxes)  # nothing runs off the screen
    screenshot("retrieve-side-by-side-phone", page)


def _hand_computed_ap_at_r(item):
    """AP@R and first correct rank of gallery item `item` querying all others of the bundled MemVir checkpoint's
    shipped gallery: cosine similarities in float64, the whole gallery sorted by (similarity, index)."""
    vectors = np.load(f"{BUNDLED}/gallery/vectors.npy").astype(np.float64)
    labels = np.asarray(json.load(open(f"{BUNDLED}/gallery/gallery.json", encoding="utf-8"))["labels"])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = vectors @ vectors[item]
    order = np.lexsort((np.arange(len(labels)), -similarity))
    order = order[order != item]
    correct = labels[order] == labels[item]
    same = int(correct.sum())
    precision = np.cumsum(correct[:same]) / np.arange(1, same + 1)
    return float((precision * correct[:same]).sum() / same), int(np.argmax(correct)) + 1, vectors, labels


def _lowest_ap_at_r(vectors, labels):
    """The lowest AP@R over every item querying the others (float64; each query's first R by a full sort)."""
    lowest = 1.0
    ids = np.arange(len(labels))
    for start in range(0, len(labels), 1024):
        block = vectors[start:start + 1024] @ vectors.T
        block[np.arange(len(block)), ids[start:start + 1024]] = -np.inf
        for row, similarity in enumerate(block):
            query = start + row
            same = int((labels == labels[query]).sum()) - 1
            if same == 0:
                continue
            near = np.argpartition(-similarity, same + 64)[: same + 64]
            near = near[np.lexsort((near, -similarity[near]))][:same]
            correct = labels[near] == labels[query]
            precision = np.cumsum(correct) / np.arange(1, same + 1)
            lowest = min(lowest, float((precision * correct).sum() / same))
    return lowest


# The views inside the Metrics tab.
METRICS_VIEWS = {"Per class", "Threshold"}


def _retrieve_view(page, view):
    """The Retrieve tab's `view` (its inner tab; Metrics first for those inside it)."""
    page.get_by_role("tab", name="Retrieve").click()
    if view in METRICS_VIEWS:
        page.get_by_role("tab", name="Metrics").click()
    page.get_by_role("tab", name=view).click()


def _the_hardest_queries_of_the_bundled_memvir_checkpoint(page, screenshot):
    _retrieve_view(page, "Hardest")
    page.locator("#show-hardest").click()
    page.wait_for_function("() => document.querySelectorAll('#hardest .hard-row').length >= 8", timeout=WAIT_MS)
    first = page.locator("#hardest .hard-row").first
    item = int(first.locator(".hard-query").get_attribute("data-item"))
    shown = re.search(r"AP@R ([0-9.]+) · first correct #(\d+)", first.locator(".hard-figures").inner_text())
    average_precision, first_correct, vectors, labels = _hand_computed_ap_at_r(item)
    assert float(shown.group(1)) == round(average_precision, 3)
    assert int(shown.group(2)) == first_correct
    assert round(_lowest_ap_at_r(vectors, labels), 3) == float(shown.group(1))  # no query does worse
    assert first.locator(".result-tile.missed").count() >= 1  # what it should have found, greyed
    screenshot("retrieve-hardest", page)


def _the_per_class_table(page, screenshot):
    _retrieve_view(page, "Per class")
    page.locator("#per-class-compare input").check()
    page.locator("#show-per-class").click()
    page.wait_for_function("() => document.querySelector('#per-class-summary').innerText.includes('classes of')",
                           timeout=WAIT_MS)
    headers = page.locator("#per-class-table th").all_inner_texts()
    joined = " ".join(headers)
    for column in ("class", "queries", "Recall@1", "R-Precision", "MAP@R", "Δ MAP@R"):
        assert column in joined, headers
    # The table draws only the rows in view; the grid states how many it holds: a header and one row per class.
    classes = len(set(json.load(open(f"{BUNDLED}/gallery/gallery.json", encoding="utf-8"))["labels"]))
    rows = page.locator("#per-class-table [role=grid]").get_attribute("aria-rowcount")
    assert int(rows) == classes + 1
    assert page.locator("#per-class-table tbody tr").count() >= 1
    assert "Over all queries" in page.locator("#per-class-summary").inner_text()
    page.locator("#per-class-csv a").first.wait_for(timeout=WAIT_MS)
    assert int(page.locator("#confused-pairs [role=grid]").get_attribute("aria-rowcount")) > 1
    screenshot("retrieve-per-class", page)


def _hardest_and_per_class_on_a_phone(page, screenshot):
    page.get_by_role("tab", name="Retrieve").click()
    page.get_by_role("tab", name="Hardest").click()
    page.locator("#show-hardest").click()
    page.wait_for_function("() => document.querySelectorAll('#hardest .hard-row').length >= 8", timeout=WAIT_MS)
    widest = page.evaluate("""() => Math.max(...[...document.querySelectorAll('#hardest .result-tile')]
        .map(t => t.getBoundingClientRect().right))""")
    assert widest <= PHONE[0] + 1  # every tile on the screen: the rows wrap
    page.evaluate("document.querySelector('#hardest').scrollIntoView({block: 'start'})")
    screenshot("retrieve-hardest-phone", page, full_page=False)
    page.get_by_role("tab", name="Metrics").click()
    page.get_by_role("tab", name="Per class").click()
    page.locator("#show-per-class").click()
    page.wait_for_function("() => document.querySelector('#per-class-summary').innerText.includes('classes of')",
                           timeout=WAIT_MS)
    box = page.locator("#per-class-table").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE[0] + 1  # the table scrolls inside its box
    screenshot("retrieve-per-class-phone", page)


# One page for each size, its checks in turn: each page load costs the suite seconds of chromium's time
# (docs/benchmarks.md, "The test suite").
def test_the_hardest_queries_and_the_per_class_table_of_the_bundled_memvir_checkpoint(open_page, bundled_app_url,
                                                                                      screenshot):
    page = open_page(bundled_app_url, 1400, 900)
    page.wait_for_selector("#start")
    _the_hardest_queries_of_the_bundled_memvir_checkpoint(page, screenshot)
    _the_per_class_table(page, screenshot)


def test_side_by_side_hardest_and_per_class_on_a_phone(open_page, bundled_app_url, glyph_query, screenshot):
    page = open_page(bundled_app_url, *PHONE)
    page.wait_for_selector("#start")
    _side_by_side_on_a_phone(page, glyph_query, screenshot)
    _hardest_and_per_class_on_a_phone(page, screenshot)
