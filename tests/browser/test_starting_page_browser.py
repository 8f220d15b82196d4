"""The starting page in a real headless chromium: a visitor who opens the address while `python app.py` loads sees
that the app is starting, and the page turns into the app by itself once the app's server answers, across the moment
between the two servers when the port refuses connections (demo.common.starting_page). The app here is a stand-in
server on the same port that answers the config and a page with a mark; waits are Playwright's, bounded."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from served_app import free_port

from demo.common.starting_page import open_starting_page

pytestmark = pytest.mark.browser

WAIT_MS = 30_000
GAP_S = 1.5  # the port refuses connections this long: the page's script asks every half second meanwhile


class _App(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's names)
        body = b'{"components": []}' if self.path.startswith("/config") else b'<h1 id="the-app">the app</h1>'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002
        pass


def test_the_starting_page_says_so_then_opens_the_app_by_itself(open_page, screenshot):
    port = free_port()
    starting = open_starting_page({"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)})
    page = open_page(f"http://127.0.0.1:{port}/")
    assert page.locator("h1").inner_text().startswith("MemVir Studio is starting")
    assert "opens the app by itself" in page.locator("#memvir-starting").inner_text()
    screenshot("starting-page", page)
    starting.close()
    time.sleep(GAP_S)  # the page's script meets refused connections now
    assert page.locator("#memvir-starting").is_visible()  # and keeps its page
    app = ThreadingHTTPServer(("127.0.0.1", port), _App)
    threading.Thread(target=app.serve_forever, daemon=True).start()
    try:
        page.wait_for_selector("#the-app", timeout=WAIT_MS)
    finally:
        app.shutdown()
        app.server_close()
