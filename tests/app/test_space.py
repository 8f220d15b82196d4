"""The app as a Hugging Face Space runs it: `python app.py` with GRADIO_SERVER_NAME=0.0.0.0 and a GRADIO_SERVER_PORT
serves a page that says it is starting at once and the app's page once it has loaded (and serves the first request
sent the moment it does), resting runs go to the Space's persistent storage when it has some, and the Space's
build installs the CPU builds of exactly the torch and torchvision that requirements.txt pins."""

import re
from pathlib import Path

import pytest
from served_app import free_port, space_environment, start_as_space

from demo.common import settings as app_settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def _check_start(start, output: str, attempt: int, signing_in: bool) -> None:
    # the page said the app was starting while it imported (seconds, polled every 10 ms), then the app took the port
    # over
    assert start.starting_pages > 0, output
    assert start.on_all_interfaces, output  # reachable through the Space's proxy, not only on loopback
    assert start.status == 200, output
    assert '<meta property="og:title" content="MemVir Studio" />' in start.page  # the app's title, from gr.Blocks
    assert (start.data / "gradio").is_dir()  # MEMVIR_APP_DATA holds the app's files
    assert "refused" not in start.found, f"start {attempt + 1}: {start.found}\n{output}"
    assert len(start.found["hits"]) == 3
    assert "ImportError" not in output and "partially initialized" not in output, output
    assert ('"Sign in with Hugging Face"' in start.config) is signing_in, output  # gr.LoginButton's label
    assert re.search(r"MemVir Studio: \d+ cores? in the affinity set, ", output), output
    if signing_in and "\n0::" in "\n" + Path("/proc/self/cgroup").read_text():  # the fake quota is v2's
        assert "a CPU quota of 1 core: 1 core to use; each run trains with 1 thread\n" in output, output


@pytest.mark.slow
def test_app_py_as_a_space_starts_it_says_it_is_starting_then_serves_its_first_request(space_app, tmp_path):
    """Three fresh starts. The first request arrives the moment the app's server answers (its starting page gone):
    before, it raced the warm-up thread's imports of torchvision and failed in 2 of 3 starts ('cannot import name ...
    from partially initialized module'). The first start is the session's `space_app` (tests/app/conftest.py), which
    serves on for the hostile-uploads tests. The last start has the variables a Space with `hf_oauth: true` sets: the
    page then offers gradio's "Sign in with Hugging Face" (demo.common.hub_access), and its sign-in routes start."""
    _check_start(space_app, space_app.output(), 0, signing_in=False)
    for attempt in (1, 2):
        data = tmp_path / f"data-{attempt}"
        env = space_environment(free_port(), data, space_app.checkpoints)
        signing_in = attempt == 2
        if signing_in:  # never reached: gradio asks the provider only when a visitor signs in
            env |= dict(SYSTEM="spaces", OAUTH_CLIENT_ID="an-id", OAUTH_CLIENT_SECRET="a-secret",
                        OAUTH_SCOPES="openid profile contribute-repos", OPENID_PROVIDER_URL="http://127.0.0.1:9",
                        SPACE_HOST="someone-memvir.hf.space")
            # and a container whose CPU quota is one core (a fake cgroup: demo.common.cores), the threads not set
            (tmp_path / "cgroup").mkdir()
            (tmp_path / "cgroup" / "cpu.max").write_text("100000 100000\n")
            env["MEMVIR_CGROUP_ROOT"] = str(tmp_path / "cgroup")
            env.pop("OMP_NUM_THREADS", None)
        start = start_as_space(env, tmp_path / f"app-{attempt}.log", space_app.checkpoint, space_app.query)
        _check_start(start, start.close(), attempt, signing_in)


def test_live_runs_stay_local_and_a_mounted_volume_keeps_the_resting_ones(tmp_path, monkeypatch):
    """A Space's Storage Bucket (a volume mounted at /data) has no file locking and uploads files as they close: the
    data folder stays on the local disk, and /data/memvir-studio becomes where resting runs are kept
    (demo.runs.persist)."""
    storage = tmp_path / "storage"
    storage.mkdir()
    monkeypatch.setattr(app_settings, "SPACE_STORAGE", storage)
    for name in ("MEMVIR_APP_DATA", "MEMVIR_PERSIST_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/memvir")
    monkeypatch.setattr(app_settings, "_is_mount", lambda path: False)  # a plain folder: nothing persists
    assert app_settings.default_data_dir() == app_settings.REPO_ROOT / "runs" / "app"
    assert app_settings.AppSettings.from_env().persist_dir is None
    monkeypatch.setattr(app_settings, "_is_mount", lambda path: path == storage)  # a mounted volume
    settings = app_settings.AppSettings.from_env()
    assert settings.runs_dir == app_settings.REPO_ROOT / "runs" / "app" / "runs"  # live runs: the local disk
    assert settings.persist_dir == storage / "memvir-studio"
    monkeypatch.setenv("MEMVIR_PERSIST_DIR", str(tmp_path / "chosen"))
    assert app_settings.AppSettings.from_env().persist_dir == tmp_path / "chosen"  # the setting wins
    monkeypatch.setenv("MEMVIR_PERSIST_DIR", "")
    assert app_settings.AppSettings.from_env().persist_dir is None  # and can turn it off
    monkeypatch.setenv("MEMVIR_APP_DATA", str(tmp_path / "data"))
    assert app_settings.default_data_dir() == tmp_path / "data"


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if match:
            pins[match.group(1)] = match.group(2)
    return pins


def test_the_space_installs_the_cpu_builds_of_the_pinned_torch_and_torchvision():
    pre = REPO_ROOT / "pre-requirements.txt"
    lines = [line.strip() for line in pre.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert lines[0] == "--extra-index-url https://download.pytorch.org/whl/cpu"
    pinned = _pins(REPO_ROOT / "requirements.txt")
    assert _pins(pre) == {"torch": pinned["torch"], "torchvision": pinned["torchvision"]}
