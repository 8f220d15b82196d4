"""The Retrieve tab's threshold view, its similarity cut-off and the gallery export, in a real headless chromium on the
app as app.py serves it (the bundled checkpoints): the FNMR shown for the bundled MemVir checkpoint at FMR 1 in 100
equals a hand computation from its shipped gallery embeddings, the threshold becomes the cut-off, a cut-off dims the
result tiles below it, and the export downloads a zip holding the projector bundle. Desktop 1400 x 900 and phone
390 x 844. Waits are Playwright's, bounded; nothing asserts speed."""

import json
import math
import re
import zipfile

import numpy as np
import pytest

pytestmark = pytest.mark.browser

WAIT_MS = 120_000
PHONE = (390, 844)
BUNDLED = "checkpoints/glyphs-norm-softmax-memvir"
FMR = 0.01
CUTOFF = "#cutoff textarea, #cutoff input"


def _hand_computed_fnmr(fmr):
    """(threshold's other-class cosine, false non-matches, same-class pairs) at `fmr` over every pair i < j of the
    bundled MemVir checkpoint's shipped gallery: float64 cosines; the largest number of other-class pairs the FMR
    allows may match, so the threshold lies just above the next one, and a same-class pair at or below it is a
    non-match."""
    vectors = np.load(f"{BUNDLED}/gallery/vectors.npy").astype(np.float64)
    labels = np.asarray(json.load(open(f"{BUNDLED}/gallery/gallery.json", encoding="utf-8"))["labels"])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    same, high_other, other_pairs = [], [], 0
    for start in range(0, len(labels), 512):
        block = vectors[start:start + 512] @ vectors.T
        rows = np.arange(start, min(start + 512, len(labels)))[:, None]
        later = np.arange(len(labels))[None, :] > rows
        same_class = labels[rows] == labels[None, :]
        same.append(block[later & same_class])
        other = later & ~same_class
        other_pairs += int(other.sum())
        high_other.append(block[other & (block > 0.3)])  # the top 1 % lies far above 0.3
    same, high_other = np.concatenate(same), np.sort(np.concatenate(high_other))[::-1]
    allowed = int(np.floor(fmr * other_pairs))
    while (allowed + 1) / other_pairs <= fmr:
        allowed += 1
    while allowed / other_pairs > fmr:
        allowed -= 1
    at = high_other[allowed]  # the (allowed + 1)-th largest
    return at, int((same <= at).sum()), len(same)


def _threshold_view(page):
    page.get_by_role("tab", name="Retrieve").click()
    # Every view's tab in sight, on a phone too (none folded into a "..." menu).
    assert page.get_by_role("tab", name="Metrics").is_visible()
    page.get_by_role("tab", name="Metrics").click()
    page.get_by_role("tab", name="Threshold").click()
    page.locator("#show-threshold").click()
    page.wait_for_function("() => document.querySelector('#threshold-summary').innerText.includes('FNMR at FMR')",
                           timeout=WAIT_MS)
    page.locator("#threshold-plot .plot-container").first.wait_for(timeout=WAIT_MS)
    return page.locator("#threshold-summary").inner_text()


def _scores(page):
    captions = page.locator("#results .result-tile img").evaluate_all("images => images.map(i => i.alt)")
    return [float(caption.split(" ")[1]) for caption in captions], captions


def _the_threshold_view_and_its_cut_off_for_the_bundled_memvir_checkpoint(page, screenshot):
    summary = _threshold_view(page)
    shown = re.search(r"FNMR at FMR 0\.01: ([0-9.]+) for .*?: ([0-9,]+) of its ([0-9,]+) same-class pairs fall "
                      r"below the threshold, cosine ([0-9.]+)", summary)
    assert shown, summary
    at, non_matches, same_pairs = _hand_computed_fnmr(FMR)
    assert int(shown[2].replace(",", "")) == non_matches and int(shown[3].replace(",", "")) == same_pairs
    assert float(shown[1]) == round(non_matches / same_pairs, 4)
    assert float(shown[4]) == round(at, 4)
    screenshot("retrieve-threshold", page)

    # The threshold as the cut-off: the box holds it, the view says what it gives there.
    page.locator("#use-threshold").click()
    page.wait_for_function("() => document.querySelector('#threshold-summary').innerText.includes('At the cut-off')",
                           timeout=WAIT_MS)
    # rounded up to 4 decimals, so that the cut-off's false-match rate stays at most the threshold's
    cutoff = float(page.locator(CUTOFF).first.input_value())
    assert cutoff == math.ceil(at * 10_000) / 10_000 and at <= cutoff < at + 1e-4

    # A search without a cut-off, then with one between the 4th and 5th hits: those after it are dimmed, in place.
    page.locator(CUTOFF).first.fill("")
    page.get_by_role("tab", name="Search").click()
    page.locator("#load").click()
    page.get_by_role("tab", name="Pick").click()
    page.locator("#sample img").nth(3).wait_for(timeout=WAIT_MS)
    page.locator("#sample img").nth(3).click()
    page.wait_for_function("() => document.querySelectorAll('#results .result-tile').length === 8", timeout=WAIT_MS)
    scores, before = _scores(page)
    assert page.locator("#results .below-cutoff").count() == 0
    cut = round((scores[3] + scores[4]) / 2, 4)
    assert scores[3] > cut > scores[4]  # distinct at the 3 digits shown
    page.locator(CUTOFF).first.fill(str(cut))
    page.locator("#sample img").nth(3).click()
    page.wait_for_function("() => document.querySelectorAll('#results figure.below-cutoff').length > 0",
                           timeout=WAIT_MS)
    _, after = _scores(page)
    assert [caption.replace(" below the cut-off", "") for caption in after] == before  # the same hits, in order
    assert [caption.endswith("below the cut-off") for caption in after] == [False] * 4 + [True] * 4
    opacity = page.locator("#results figure.below-cutoff").first.evaluate("f => getComputedStyle(f).opacity")
    assert float(opacity) < 1
    assert "4 of 8 below the cut-off" in page.locator("#retrieval-summary").inner_text()
    screenshot("retrieve-cutoff", page)


def _the_export_downloads_a_projector_zip(page, tmp_path):
    page.get_by_role("tab", name="Retrieve").click()
    page.locator("#export-gallery").click()
    link = page.locator("#export-zip a").first
    link.wait_for(timeout=WAIT_MS)
    with page.expect_download(timeout=WAIT_MS) as download:
        link.click()
    path = tmp_path / download.value.suggested_filename
    download.value.save_as(path)
    assert path.suffix == ".zip" and zipfile.is_zipfile(path)
    with zipfile.ZipFile(path) as archive:
        names = {name.split("/")[-1] for name in archive.namelist()}
        size = len(json.load(open(f"{BUNDLED}/gallery/gallery.json", encoding="utf-8"))["labels"])
        tensor_rows = archive.read(next(n for n in archive.namelist() if n.endswith("tensors.tsv"))).count(b"\n")
    assert names == {"tensors.tsv", "metadata.tsv", "sprite.png", "projector_config.pbtxt"}
    assert tensor_rows == size
    page.locator("#export-npz a").first.wait_for(timeout=WAIT_MS)
    assert ".npz" in page.locator("#export-note").inner_text()


# One page for the desktop's checks, in turn: each page load costs the suite seconds of chromium's time
# (docs/benchmarks.md, "The test suite"). The export comes first: the threshold's checks leave a cut-off set.
def test_the_export_then_the_threshold_view_and_its_cut_off_for_the_bundled_memvir_checkpoint(
        open_page, bundled_app_url, screenshot, tmp_path):
    page = open_page(bundled_app_url, 1400, 900)
    page.wait_for_selector("#start")
    _the_export_downloads_a_projector_zip(page, tmp_path)
    _the_threshold_view_and_its_cut_off_for_the_bundled_memvir_checkpoint(page, screenshot)


def test_the_threshold_view_on_a_phone(open_page, bundled_app_url, screenshot):
    page = open_page(bundled_app_url, *PHONE)
    page.wait_for_selector("#start")
    summary = _threshold_view(page)
    assert "FNMR at FMR 0.01" in summary
    for selector in ("#threshold-plot", "#threshold-summary", "#show-threshold"):
        box = page.locator(selector).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE[0] + 1, selector  # nothing runs off the screen
    page.evaluate("document.querySelector('#threshold-summary').scrollIntoView({block: 'start'})")
    screenshot("retrieve-threshold-phone", page, full_page=False)
