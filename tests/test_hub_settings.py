"""The CLI and the app send the Hub only the requests they are asked for (memvir._hub_shims): no telemetry, so no
agent-harness look-up with its own 3 s timeout before the first request, unless the user set HF_HUB_DISABLE_TELEMETRY.

Each program runs in a process of its own, as a user starts it, since huggingface_hub reads the setting at import;
the Hub is a server on 127.0.0.1 that accepts connections and never answers.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
from hub_server import client_environment

from memvir._hub_shims import turn_off_side_requests
from memvir.hub import DEFAULT_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[1]
REPO = "someone/glyph-model"
LOOK_UP = f"GET /api/models/{REPO} HTTP/1.1"
"""The one request `pull` makes of a Hub that never answers: its repository look-up."""

TIMED_EVAL = f"""
import json, time
import memvir.hub, memvir.retrieval.evaluation  # what `eval` imports (huggingface_hub too), before the clock starts
from memvir.cli import main
started = time.monotonic()
code = main(["eval", "{REPO}"])
print(json.dumps({{"code": code, "seconds": time.monotonic() - started}}))
"""


def _python(args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
def test_the_cli_asks_a_silent_hub_only_for_the_repo(silent_server, tmp_path):
    result = _python(["-m", "memvir", "eval", REPO], client_environment(silent_server.url, tmp_path / "home"))
    assert result.returncode == 2, result.stderr
    assert (f"error: Could not pull '{REPO}': the Hub could not be reached within {DEFAULT_TIMEOUT_S} s "
            "(ReadTimeout: timed out), and the local Hub cache") in result.stderr
    assert silent_server.request_lines == [LOOK_UP]  # no /api/agent-harnesses first


@pytest.mark.slow
def test_pull_from_the_cli_against_a_silent_hub_returns_within_its_limit_plus_a_second(silent_server, tmp_path):
    """huggingface_hub is imported before the CLI's main() runs here: the setting reaches it all the same."""
    result = _python(["-c", TIMED_EVAL], client_environment(silent_server.url, tmp_path / "home"))
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["code"] == 2 and "the Hub could not be reached within" in result.stderr
    assert outcome["seconds"] < DEFAULT_TIMEOUT_S + 1
    assert silent_server.request_lines == [LOOK_UP]


@pytest.mark.parametrize(("program", "code"), [
    ("app", "import app"),
    ("cli", "from memvir.cli import main\ntry:\n    main(['--no-such-flag'])\nexcept SystemExit:\n    pass"),
])
@pytest.mark.slow
@pytest.mark.parametrize(("setting", "telemetry_off"), [(None, True), ("0", False), ("1", True)])
def test_the_app_and_the_cli_turn_telemetry_off_unless_the_user_chose(program, code, setting, telemetry_off):
    env = {name: value for name, value in os.environ.items() if name != "HF_HUB_DISABLE_TELEMETRY"}
    if setting is not None:
        env["HF_HUB_DISABLE_TELEMETRY"] = setting
    result = _python(["-c", f"{code}\nimport huggingface_hub.constants as c; print(c.HF_HUB_DISABLE_TELEMETRY)"],
                     env)
    assert result.stdout.strip().splitlines()[-1] == str(telemetry_off), result.stderr


def test_a_hub_imported_before_is_told_too(monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_TELEMETRY", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", False)
    turn_off_side_requests()
    assert huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY is True
    assert os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1"


def test_a_choice_made_before_stands(monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", False)
    turn_off_side_requests()
    assert huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY is False
    assert os.environ["HF_HUB_DISABLE_TELEMETRY"] == "0"
