"""The README's screenshots of the few-class view, taken from a glyphs-mini run in a real chromium (not a test: run it
by hand when the picture changes).

    .venv/bin/python tests/browser/take_screenshots.py [--out docs/screenshots]

Serves the app on a free port (its own data folder, UMAP on), picks glyphs-mini, whose preset the page puts in
(demo.train.presets: batch 32, N = 3, M = 10, warm-up 1 epoch, the library's 8 epochs; 9 steps an epoch, so the virtual
sets arrive at steps 21, 32 and 43 and the run ends at step 72), starts it with snapshots every 10 steps (the page's
default) and shoots the picture at three moments: the first snapshot with a virtual set, the first with all three,
and the last. At each moment the run is paused, so that the snapshot gets its UMAP, and the picture is shot in PCA and
in UMAP before the run resumes. Each PNG is quantised to a palette so it stays small.
"""

import argparse
import socket
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]  # the app, and the browser tests' chromium settings

# (file name stem, the snapshot step to shoot)
MOMENTS = (("few-classes-1-first-virtual-set", 30), ("few-classes-2-three-virtual-sets", 50),
           ("few-classes-3-end", 70))
PICTURES = (("pca", "a few classes, PCA"), ("umap", "a few classes, UMAP"))
WAIT_MS = 1_800_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def shoot(page, path: Path) -> None:
    from PIL import Image

    page.locator("#embedding-plot").screenshot(path=str(path))
    Image.open(path).convert("RGB").quantize(colors=128).save(path, optimize=True)


def caption(page) -> str:
    return " ".join(page.locator("#snapshot-caption").inner_text().split())


def wait_for_caption(page, pattern: str) -> None:
    page.wait_for_function("(pattern) => new RegExp(pattern).test(document.querySelector('#snapshot-caption')"
                           ".innerText.replace(/\\s+/g, ' '))", arg=pattern, timeout=WAIT_MS)


def wait_for_status(page, word: str) -> None:
    page.wait_for_function("(word) => document.querySelector('#run-status').innerText.includes(word)", arg=word,
                           timeout=WAIT_MS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from conftest import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    from demo.common.settings import AppSettings
    from demo.page import build_app

    with tempfile.TemporaryDirectory(prefix="screenshots-") as tmp:
        app = build_app(AppSettings(data_dir=Path(tmp) / "data", checkpoints_dir=Path(tmp) / "none", umap=True))
        port = free_port()
        app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/")
                page.get_by_label("Dataset").click()
                page.get_by_role("option", name="glyphs-mini: 48 characters").click()
                page.wait_for_function(
                    "() => document.querySelector('#notice').innerText.includes('Settings for glyphs-mini')",
                    timeout=WAIT_MS)
                page.locator("#start").click()
                for name, step in MOMENTS:
                    wait_for_caption(page, f"step {step} · PCA")
                    last = name.endswith("end")
                    if last:
                        wait_for_status(page, "Finished")
                    else:
                        page.locator("#pause").click()
                        wait_for_status(page, "Paused")
                    for method, label in PICTURES:
                        page.get_by_label(label).check()
                        # the UMAP picture once the paused (or finished) run's snapshot has its layout; a poll may
                        # still replace a picture just chosen with "no snapshot yet" for a moment, so the caption
                        # must hold both before and after the shot
                        wanted = f"step {step} · {method.upper()} · training"
                        for _ in range(10):
                            wait_for_caption(page, wanted)
                            page.wait_for_timeout(3000)
                            if wanted in caption(page):
                                shoot(page, args.out / f"{name}-{method}.png")
                                if wanted in caption(page):
                                    break
                        print(f"{name}-{method}.png: {caption(page)}")
                    page.get_by_label(PICTURES[0][1]).check()
                    if not last:
                        page.locator("#resume").click()
                        wait_for_status(page, "Training")
                browser.close()
        finally:
            app.close()


if __name__ == "__main__":
    main()
