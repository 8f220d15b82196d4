"""Browser tests: Playwright for Python driving Debian's chromium (never Playwright's own browser download).

With CI=true these tests must run: a missing chromium fails them with the command that installs it. Elsewhere they
skip when chromium is missing. The app runs in-process on a free port with a tiny checkpoint of its own (`app_url`),
or as `python app.py` serves it, with the bundled checkpoints and their warm-up (`bundled_app_url`); the screenshots
land in test-output/browser/ for people to look at.
"""

import contextlib
import os
import socket
import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# One renderer process for every page, and no browser features a test page never uses: less CPU for each browser
# test file (docs/benchmarks.md, "The test suite").
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
                 "--mute-audio", "--disable-site-isolation-trials", "--renderer-process-limit=1",
                 "--disable-features=IsolateOrigins,site-per-process,Translate,MediaRouter,OptimizationHints"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "browser"
PROBE_MS = 3000
STOPPING_S = 20.0  # a stopped run's process saves its checkpoint and ends within this


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=["TimeoutError"]))


def _page_health(page) -> str:
    """Whether `page` runs its script (a timer fires) and draws (an animation frame fires), each within PROBE_MS."""
    from playwright.sync_api import Error

    try:
        page.wait_for_function("""() => {
            if (!window.memvirProbe) {
                window.memvirProbe = {timer: false, frame: false};
                setTimeout(() => { window.memvirProbe.timer = true; });
                requestAnimationFrame(() => { window.memvirProbe.frame = true; });
            }
            return window.memvirProbe.timer;
        }""", polling=100, timeout=PROBE_MS)
    except Error:
        return f"its script ran no timer within {PROBE_MS / 1000:g} s (its main thread is busy or the page is gone)"
    try:
        page.wait_for_function("() => window.memvirProbe.frame", polling=100, timeout=PROBE_MS)
    except Error:
        return f"its timers run, but it drew no frame within {PROBE_MS / 1000:g} s"
    return "its timers run and it draws frames"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    browser = item.funcargs.get("browser") if hasattr(item, "funcargs") else None
    if report.when != "call" or not report.failed or browser is None:
        return
    lines = []
    pages = [page for context in browser.contexts for page in context.pages]
    for number, page in enumerate(pages):
        health = _page_health(page)
        shot = SCREENSHOTS / "failed" / f"{item.name}-{number}.png"
        try:
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), timeout=PROBE_MS)
            saved = f"screenshot {shot.relative_to(SCREENSHOTS.parents[1])}"
        except Exception as error:  # a page that draws no frame cannot be photographed either
            saved = f"no screenshot ({type(error).__name__})"
        lines.append(f"page {number} ({page.url}): {health}; {saved}")
    report.sections.append(("browser pages at the failure", "\n".join(lines) or "no page was open"))


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


def _serve(app):
    """Launch `app` on a free port of 127.0.0.1 (with the page's theme, styles and script); its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return f"http://127.0.0.1:{port}/"


@pytest.fixture
def serve():
    """Serve an app of a test's own (`_serve`); the test closes it."""
    return _serve


@pytest.fixture(scope="session")
def app_root(tmp_path_factory):
    """The app's folder: its runs are under data/runs."""
    return tmp_path_factory.mktemp("browser-app")


@pytest.fixture(scope="session")
def _app_served(app_root):
    """(the app, its URL) behind `app_url`."""
    from demo.common.settings import AppSettings
    from demo.page import build_app
    from memvir import TrainConfig, Trainer

    root = app_root
    Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, max_steps=5, eval_at_start=False, snapshot_every=0,
                        embedding_dim=32), root / "checkpoints" / "glyphs-mini-tiny").run()
    settings = AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False)
    app = build_app(settings)
    try:
        yield app, _serve(app)
    finally:
        app.close()


@pytest.fixture(scope="session")
def app_url(_app_served):
    """The app with a tiny checkpoint of its own, served in-process, one for the session (`_app_served`)."""
    return _app_served[1]


@pytest.fixture(autouse=True)
def _no_run_left_training(request):
    """A test on the shared app (`app_url`) ends with none of its runs training: one left behind trained on for
    minutes, taking a core from the tests after it, and the next test's Start was refused as another visitor's."""
    app = request.getfixturevalue("_app_served")[0] if "app_url" in request.fixturenames else None
    yield
    if app is None:
        return
    from demo.runs.manager import RunError

    deadline = time.monotonic() + STOPPING_S
    while (left := [run for run in app.run_manager.runs() if run.busy]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for run in left:
        with contextlib.suppress(RunError):  # it may have ended meanwhile
            app.run_manager.stop(run.id, run.owner)
    assert not left, f"the test left run(s) training on the shared app: {[run.id for run in left]}"


@pytest.fixture(scope="session")
def bundled_app_url(tmp_path_factory):
    """The app as app.py starts it: the repository's bundled checkpoints, the retrieval warm-up begun as it
    launches."""
    from app import import_lazy_dependencies
    from demo.common.settings import REPO_ROOT, AppSettings
    from demo.page import build_app

    import_lazy_dependencies()
    settings = AppSettings(data_dir=tmp_path_factory.mktemp("bundled-app") / "data",
                           checkpoints_dir=REPO_ROOT / "checkpoints", umap=False)
    app = build_app(settings)
    app.retrieval_service.warm_up()
    try:
        yield _serve(app)
    finally:
        app.close()


@pytest.fixture
def open_page(browser):
    """open_page(url, width, height): a page of its own at that viewport, open at `url`; closed after the test."""
    contexts = []

    def open_(url: str, width: int = 1400, height: int = 1000):
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        page = context.new_page()
        page.goto(url)
        return page

    yield open_
    for context in contexts:
        context.close()


@pytest.fixture
def page(open_page, app_url):
    return open_page(app_url)


@pytest.fixture
def screenshot(request):
    def save(name: str, shown=None, full_page: bool = True) -> Path:
        """`shown` (default: the test's `page`) as test-output/browser/<name>.png, whole or the viewport."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        (shown or request.getfixturevalue("page")).screenshot(path=str(path), full_page=full_page)
        return path

    return save


GLYPH_QUERY_CLASS = "O"  # a class of the glyphs test split, with look-alikes in other classes


@pytest.fixture(scope="module")
def glyph_query(tmp_path_factory):
    """An image of the glyphs test split's class GLYPH_QUERY_CLASS ("O"), as a visitor would upload it."""
    from memvir.data import load_dataset

    split = load_dataset("glyphs").test
    index = next(i for i, label in enumerate(split.labels)
                 if split.class_names[label].split(" ")[0] == GLYPH_QUERY_CLASS)
    path = tmp_path_factory.mktemp("query") / "query.png"
    split.image(index).save(path)
    return path
