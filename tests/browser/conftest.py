"""Browser tests: Playwright for Python driving Debian's chromium (never Playwright's own browser download).

With CI=true these tests must run: a missing chromium fails them with the command that installs it. Elsewhere they
skip when chromium is missing. The app runs in-process on a free port with a tiny checkpoint of its own, and the
screenshots land in test-output/browser/ for people to look at.
"""

import os
import socket
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "browser"


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.is_file():
        message = f"{CHROMIUM} is missing: install it with `apt-get install -y chromium` (make test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def app_root(tmp_path_factory):
    """The app's folder: its runs are under data/runs."""
    return tmp_path_factory.mktemp("browser-app")


@pytest.fixture(scope="session")
def app_url(app_root):
    from demo.settings import AppSettings
    from demo.ui import build_app
    from memvir.train import TrainConfig, Trainer

    root = app_root
    Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, max_steps=5, eval_at_start=False, snapshot_every=0,
                        embedding_dim=32), root / "checkpoints" / "glyphs-mini-tiny").run()
    settings = AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False)
    app = build_app(settings)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)  # with the theme
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        app.close()


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(app_url)
    yield page
    context.close()


@pytest.fixture
def screenshot(page):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def save(name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save
