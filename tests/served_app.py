"""Talking to an app a test serves: a free port to serve it on, the app served in-process, `python app.py` started as
it is locally or as a Space starts it, and the page's status line, polled until it shows what the test waits for
(shared by the app tests that start a server)."""

import contextlib
import dataclasses
import http.client
import os
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


SPACE_START_S = 120.0


def listening_on_all_interfaces(port: int) -> bool:
    """A listening IPv4 socket bound to 0.0.0.0:port, as the kernel lists it (state 0A is LISTEN)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(row.split()[1] == f"00000000:{port:04X}" and row.split()[3] == "0A" for row in rows)


def space_environment(port: int, data: Path, checkpoints: Path) -> dict:
    """The environment a Space gives `python app.py` (GRADIO_SERVER_NAME=0.0.0.0, its port, SPACE_ID), serving
    `checkpoints` from the data folder `data`; gradio's files in that folder, as on a Space (no GRADIO_TEMP_DIR)."""
    # The server at the runs' priority: below them (the default) it starts at the pace the suite's other worker
    # leaves it, past the deadline while that worker trains; the race tested is the warm-up's, not priority's.
    env = dict(os.environ, GRADIO_SERVER_NAME="0.0.0.0", GRADIO_SERVER_PORT=str(port), SPACE_ID="someone/memvir",
               MEMVIR_APP_DATA=str(data), MEMVIR_CHECKPOINTS=str(checkpoints), MEMVIR_UMAP="0",
               HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", MEMVIR_SERVER_PRIORITY="normal",
               PYTHONUNBUFFERED="1")  # its log holds what it printed while it still serves
    env.pop("GRADIO_TEMP_DIR", None)
    return env


@dataclasses.dataclass
class SpaceStart:
    """`python app.py` started as a Space starts it, and what it answered to the requests sent the moment it served;
    it serves on until `close`."""

    process: subprocess.Popen
    port: int
    data: Path
    log: Path
    checkpoints: Path  # the folder it serves (MEMVIR_CHECKPOINTS)
    checkpoint: str  # the one its first search used
    query: Path  # the image that search sent
    starting_pages: int = 0  # answers of the page that says the app is starting (demo.common.starting_page)
    found: dict = dataclasses.field(default_factory=dict)  # the first /search's answer, or {"refused": its text}
    status: int = 0  # the page's HTTP status, then
    page: str = ""
    config: str = ""  # gradio's /config, then
    on_all_interfaces: bool = False  # reachable through the Space's proxy, not only on loopback

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def output(self) -> str:
        return self.log.read_text()

    def close(self) -> str:
        """Stop the server; all it printed."""
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.output()


def _first_answer(start: SpaceStart) -> None:
    """Ask for the page every 10 ms until the app's own server answers it (the starting page answers 503 until then,
    and a refused connection is the moment between the two), counting the starting pages that answered first."""
    deadline = time.monotonic() + SPACE_START_S
    while True:
        assert start.process.poll() is None, f"app.py exited with {start.process.returncode}:\n{start.output()}"
        connection = http.client.HTTPConnection("127.0.0.1", start.port, timeout=5)
        try:
            connection.request("GET", "/")
            response = connection.getresponse()
            if response.status != 503:
                return
            assert "MemVir Studio is starting" in response.read().decode()
            assert start.starting_pages or listening_on_all_interfaces(start.port)  # where the Space's proxy finds it
            start.starting_pages += 1
        except OSError:
            pass
        finally:
            connection.close()
        assert time.monotonic() < deadline, f"app.py never served its page:\n{start.output()}"
        time.sleep(0.01)


def start_as_space(env: dict, log_path: Path, checkpoint: str, query: Path) -> SpaceStart:
    """`python app.py` with `env` (space_environment's), its output in `log_path`; a search of `query` with
    `checkpoint` sent the moment its page is served, then the page and its config read."""
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    start = SpaceStart(process, int(env["GRADIO_SERVER_PORT"]), Path(env["MEMVIR_APP_DATA"]), log_path,
                       Path(env["MEMVIR_CHECKPOINTS"]), checkpoint, query)
    try:
        _first_answer(start)
        client = Client(start.url, verbose=False)
        try:
            start.found = client.predict(checkpoint=checkpoint, query_image=handle_file(query), k=3,
                                         api_name="/search")
        except AppError as refused:  # said with the server's output by the test
            start.found = {"refused": str(refused)}
        with urllib.request.urlopen(start.url, timeout=30) as response:
            start.status, start.page = response.status, response.read().decode()
        with urllib.request.urlopen(start.url + "config", timeout=30) as response:
            start.config = response.read().decode()
        start.on_all_interfaces = listening_on_all_interfaces(start.port)
    except BaseException:
        start.close()
        raise
    return start


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
