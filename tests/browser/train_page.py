"""The Train tab's first move, as a visitor makes it: pick glyphs-mini and wait until the settings the page suggests
for it have landed."""


def pick_glyphs_mini(page, timeout_ms: float) -> None:
    """Pick glyphs-mini in the Dataset box and wait for its suggested settings (the notice and the boxes come in one
    answer). A box typed into before they land has them land under the typing: a fill of "32" between its select-all
    and its typing became "3232", and Start refused the batch size."""
    page.get_by_label("Dataset").click()
    page.get_by_role("option", name="glyphs-mini: 48 characters").click()
    page.wait_for_function("() => document.querySelector('#notice').innerText.includes('Settings for glyphs-mini')",
                           timeout=timeout_ms)
