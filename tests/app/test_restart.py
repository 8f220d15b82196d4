"""A restart loses no run: `python app.py` killed with SIGKILL while a run trains (a Space restarting, say); the run's
process, having lost its server, stops with a checkpoint; the next server on the same data lists the run, says what
happened, and a visitor (any: who started it was the previous server's to know) resumes it from the page, from that
checkpoint, as the CLI's --resume does. Waits poll against a deadline; nothing asserts how fast.

The killed server is `python app.py` itself (a SIGKILL needs a process of its own). The next one is the same page
built from the same data folder, served in this process (tests/served_app.py): a server that never saw the run, which
is all a restart is to the data folder, without a second interpreter's imports; the Space's start and the
hostile-uploads tests start `python app.py` end to end."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client
from served_app import free_port, poll_status_until, serving, step_of

from demo.common.settings import AppSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0


def _serve(data: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_PORT=str(port), MEMVIR_APP_DATA=str(data), MEMVIR_UMAP="0",
               HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    server = subprocess.Popen([sys.executable, "app.py"], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}/", time.monotonic() + DEADLINE_S
    while True:
        assert server.poll() is None, f"app.py exited with {server.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return server, url
        except OSError:
            assert time.monotonic() < deadline, "app.py never served its page"
            time.sleep(0.1)


def _last_status(folder: Path) -> str | None:
    statuses = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
                if '"type": "status"' in line]
    return statuses[-1]["state"] if statuses else None


@pytest.mark.slow
def test_a_run_cut_off_by_the_servers_kill_is_listed_after_the_restart_and_resumes_from_its_checkpoint(tmp_path):
    data = tmp_path / "data"
    server, url = _serve(data)
    try:
        client = Client(url, verbose=False)
        started = client.predict(dataset="glyphs-mini", batch_size=32, epochs=500, snapshot_every=0,
                                 api_name="/start_run")
        assert started["run_id"] and started["yours"] is True, started
        poll_status_until(client, lambda status: status.startswith("**Training**") and step_of(status) >= 12,
                          "a checkpoint's epoch behind it", DEADLINE_S)
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(30)
    (folder,) = (data / "runs").iterdir()
    deadline = time.monotonic() + DEADLINE_S
    while _last_status(folder) != "stopped":  # its process saves and stops once its server is gone
        assert time.monotonic() < deadline, f"the run's last word: {_last_status(folder)}"
        time.sleep(0.2)
    from memvir.checkpoint import load_state

    saved_at = int(load_state(folder / "trainer_state.pt")["step"])
    assert saved_at >= 9

    settings = AppSettings(data_dir=data, checkpoints_dir=REPO_ROOT / "checkpoints", umap=False)  # as _serve's
    with serving(settings) as (url, _):  # the server after the restart
        client = Client(url, verbose=False)  # a new visitor's page
        status = poll_status_until(client, lambda status: status.startswith("**Stopped**"), "the run listed again",
                                   DEADLINE_S)
        assert "by an earlier server; its last checkpoint is kept · press **Resume** to continue" in status
        assert ("An earlier server started this run, so it is nobody's now: whoever presses **Resume** continues "
                "it.") in status
        resuming = client.predict(api_name="/resume_run")
        assert (resuming["run_id"], resuming["yours"]) == (started["run_id"], True), resuming  # the resumer's now
        resumed = poll_status_until(client, lambda status: status.startswith("**Training**") and
                                    step_of(status) > saved_at, "the run training on", DEADLINE_S)
        assert "another visitor" not in resumed and "whoever presses" not in resumed  # the visitor's run now
        client.predict(api_name="/stop_run")
        poll_status_until(client, lambda status: status.startswith("**Stopped**"), "the run stopped", DEADLINE_S)
