"""The page a visitor sees while `python app.py` starts: served on the app's port before gradio and torch are
imported, which takes the app seconds (docs/benchmarks.md, "First impressions"), so that a visitor who opens the
address, or a Space's first visitor, sees at once that the app is coming rather than an error or a blank tab.

Every request is answered "503 Service Unavailable" with `Retry-After`, so that scripts and health checks that wait
for the page keep waiting; a browser shows the page, whose script asks for the app's config every half second and
reloads once the app answers it. The app closes this server just before gradio opens the same port (`close`); a
request in between is refused and the page's script asks again.
"""

from __future__ import annotations

import html
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_HOST = "127.0.0.1"  # gradio's defaults, which GRADIO_SERVER_NAME and GRADIO_SERVER_PORT override
DEFAULT_PORT = 7860
RETRY_S = 1

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>MemVir Studio is starting</title>
<noscript><meta http-equiv="refresh" content="5"></noscript>
<style>
  body {{ font-family: system-ui, sans-serif; margin: 0; min-height: 100vh; display: grid; place-items: center;
         background: #fafafa; color: #27272a; }}
  main {{ max-width: 32rem; padding: 2rem; text-align: center; }}
  h1 {{ font-size: 1.5rem; margin: 0 0 0.5rem; }}
  p {{ margin: 0.25rem 0; color: #52525b; }}
  .dots::after {{ content: "…"; animation: blink 1.2s steps(4) infinite; }}
  @keyframes blink {{ 0% {{ opacity: 0.2; }} 50% {{ opacity: 1; }} 100% {{ opacity: 0.2; }} }}
</style>
</head>
<body>
<main id="memvir-starting">
  <h1>MemVir Studio is starting<span class="dots"></span></h1>
  <p>{detail}</p>
  <p>This page opens the app by itself as soon as it is ready.</p>
</main>
<script>
  const config = new URL("config", window.location.href);
  async function ready() {{
    try {{
      const answer = await fetch(config, {{cache: "no-store"}});
      if (answer.ok) {{ window.location.reload(); return; }}
    }} catch (refused) {{}}  // the moment between this server and the app's: ask again
    setTimeout(ready, 500);
  }}
  setTimeout(ready, 500);
</script>
</body>
</html>
"""
DETAIL = "It loads its libraries (PyTorch, Gradio), which takes a few seconds."


class _Handler(BaseHTTPRequestHandler):
    body = PAGE.format(detail=html.escape(DETAIL)).encode()

    def _answer(self, with_body: bool) -> None:
        self.send_response(503)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("Retry-After", str(RETRY_S))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if with_body:
            self.wfile.write(self.body)

    def do_GET(self):  # noqa: N802 (http.server's names)
        self._answer(True)

    def do_HEAD(self):  # noqa: N802
        self._answer(False)

    def do_POST(self):  # noqa: N802
        self._answer(True)

    def log_message(self, format, *args):  # noqa: A002 - the app's log stays its own
        pass


class StartingPage:
    """The starting page served on `host`:`port` from a thread of its own until `close`. Its socket is bound with
    SO_REUSEADDR (http.server's default), so gradio can bind the port as soon as it is closed."""

    def __init__(self, host: str, port: int):
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="memvir-starting-page", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop answering and free the port for the app."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def open_starting_page(environ=os.environ) -> StartingPage | None:
    """The starting page on the address the app will serve (GRADIO_SERVER_NAME, GRADIO_SERVER_PORT, else gradio's
    127.0.0.1:7860); None where that address cannot be bound (in use, say): the app's launch then says why, as it
    would without this page."""
    host = environ.get("GRADIO_SERVER_NAME") or DEFAULT_HOST
    try:
        port = int(environ.get("GRADIO_SERVER_PORT") or DEFAULT_PORT)
        return StartingPage(host, port)
    except (OSError, ValueError, OverflowError):
        return None
