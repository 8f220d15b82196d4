"""Talking to an app a test serves: a free port to serve it on, the app served in-process, and the page's status line,
polled until it shows what the test waits for (shared by the app tests that start a server)."""

import contextlib
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serving(settings):
    """The app of `settings` served on a free port of 127.0.0.1 while the block runs: (its URL, the App)."""
    from demo.page import build_app

    app = build_app(settings)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
               max_file_size=settings.max_zip_bytes)
    try:
        yield f"http://127.0.0.1:{port}/", app
    finally:
        app.close()


@contextlib.contextmanager
def app_py(env: dict, log_path: Path, start_s: float):
    """`python app.py` in a process of its own with `env` (its GRADIO_SERVER_PORT on 127.0.0.1), its output in
    `log_path`, while the block runs: its URL once it serves, or an AssertionError with the log if it does not."""
    port = env["GRADIO_SERVER_PORT"]
    with log_path.open("w") as log:
        app = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + start_s
            while True:
                if app.poll() is not None:
                    raise AssertionError(f"app.py exited with {app.returncode}:\n{log_path.read_text()}")
                try:
                    urllib.request.urlopen(url, timeout=5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"app.py did not serve {url} in {start_s:g} s") from None
                    time.sleep(0.5)
            yield url
        finally:
            app.terminate()
            try:
                app.wait(timeout=30)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait()


def page_status(client) -> str:
    """The Train tab's status line, as the client API's /run_status gives it (the page's own)."""
    return client.predict(api_name="/run_status")["status_line"]


def poll_status_until(client, condition, what: str, seconds: float) -> str:
    """The first status line for which `condition` holds; AssertionError naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = page_status(client)
        if condition(status):
            return status
        time.sleep(0.3)
    raise AssertionError(f"the page never showed {what}; last status: {status!r}")


def step_of(status: str) -> int:
    """The step a status line reports ("... step 1,234 of ...")."""
    return int(re.search(r"step ([\d,]+) of", status).group(1).replace(",", ""))
