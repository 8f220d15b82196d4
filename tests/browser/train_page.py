"""The Train tab's first moves, as a visitor makes them: open the settings where a phone folds them, pick glyphs-mini
and wait until the settings the page suggests for it have landed."""


def open_settings(page, timeout_ms: float) -> None:
    """Open the settings' fold (#train-settings) if it is closed, as a phone's page shows it (demo/static/page.js
    folds it as it is first drawn there), and wait until the Dataset box shows."""
    header = page.locator("#train-settings > .label-wrap")
    # drawn, and page.js has folded it on a phone (a click before that could be undone by page.js's fold)
    page.locator("#train-settings[data-fold-checked]").wait_for(state="attached", timeout=timeout_ms)
    if "open" not in (header.get_attribute("class") or "").split():
        header.click()
    page.locator("#dataset").wait_for(state="visible", timeout=timeout_ms)


def pick_glyphs_mini(page, timeout_ms: float) -> None:
    """Pick glyphs-mini in the Dataset box (the settings opened first) and wait for its suggested settings (the
    notice and the boxes come in one answer). A box typed into before they land has them land under the typing: a
    fill of "32" between its select-all and its typing became "3232", and Start refused the batch size."""
    open_settings(page, timeout_ms)
    page.get_by_label("Dataset").click()
    page.get_by_role("option", name="glyphs-mini: 48 characters").click()
    page.wait_for_function("() => document.querySelector('#notice').innerText.includes('Settings for glyphs-mini')",
                           timeout=timeout_ms)
