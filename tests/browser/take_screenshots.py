"""The README's screenshots of the few-class view, taken from a default run in a real chromium (not a test: run it by
hand when the picture changes).

    .venv/bin/python tests/browser/take_screenshots.py [--out docs/screenshots]

Serves the app on a free port (its own data folder, UMAP off: the default picture is PCA), starts the page's default
run (glyphs' preset, demo.train.presets: 12 epochs, N = 2, M = 50, warm-up 2 epochs, balanced reduction; 95 steps an
epoch, so the warm-up ends at step 190, the first virtual set arrives at step 242 and the run ends at step 1,140), and
shoots the picture live at three moments: a snapshot before the warm-up ends, the first snapshot after the first
virtual set arrives, and the last one. Each PNG is quantised to a palette so it stays small.
"""

import argparse
import socket
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]  # the app, and the browser tests' chromium settings

# (file name, the first snapshot step to shoot: at least `low`, below `high`)
MOMENTS = (("few-classes-1-warm-up.png", 150, 190), ("few-classes-2-first-virtual-set.png", 250, 300),
           ("few-classes-3-end.png", 1140, 1141))
WAIT_MS = 1_800_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def shoot(page, path: Path) -> None:
    from PIL import Image

    page.locator("#embedding-plot").screenshot(path=str(path))
    Image.open(path).convert("RGB").quantize(colors=128).save(path, optimize=True)


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
        app = build_app(AppSettings(data_dir=Path(tmp) / "data", checkpoints_dir=Path(tmp) / "none", umap=False))
        port = free_port()
        app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/")
                page.locator("#start").click()
                for name, low, high in MOMENTS:
                    page.wait_for_function(
                        """([low, high]) => {
                            const m = document.querySelector('#snapshot-caption').innerText.match(/step ([0-9,]+)/);
                            const step = m && parseInt(m[1].replace(/,/g, ''));
                            return step >= low && step < high;
                        }""", arg=[low, high], timeout=WAIT_MS)
                    caption = " ".join(page.locator("#snapshot-caption").inner_text().split())
                    shoot(page, args.out / name)
                    print(f"{name}: {caption}")
                browser.close()
        finally:
            app.close()


if __name__ == "__main__":
    main()
