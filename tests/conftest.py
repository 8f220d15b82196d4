"""Test-wide settings: no test may touch the network, and gradio must not phone home. The only servers a test
talks to are its own on 127.0.0.1: `loopback_hub` (a Hugging Face Hub) and `silent_server` (one that never answers),
from tests/hub_server.py."""

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ.setdefault("TQDM_DISABLE", "1")
# One torch thread a process, set before anything imports torch, and inherited by every process a test starts (the
# CLI, app.py, a run's process: demo.common.cores.training_threads reads it): the suite runs two workers on two cores,
# and their trainings' OpenMP threads only waited for one another (docs/benchmarks.md, "The test suite").
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Test files that share a session fixture's server, by the fixture's name: pytest-xdist runs each group on one worker
# (`pytest_xdist_make_scheduler`), so the server is started once; every other file is a group of its own.
SHARED_SERVERS = {"tests/app/test_space.py": "space_app", "tests/app/test_hostile_uploads.py": "space_app"}


def pytest_configure(config):
    # pytest-xdist's --dist loadfile hands out files with the most tests first (its --loadscope-reorder default), so
    # the files of one or three long tests (an app.py start, a kill and a restart) came last, run by one worker while
    # the other had nothing left: keep the order `pytest_collection_modifyitems` gives instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the files of SHARED_SERVERS grouped as one file: one worker runs them all."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedServerScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SHARED_SERVERS.get(file, file)

    return SharedServerScheduling(config, log)


def pytest_collection_modifyitems(items):
    """The files holding a test marked slow or browser first, each file's tests together and in their order: the
    long ones start while both workers are busy, and the many short files fill the end."""
    long_files = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.path not in long_files)  # stable: the rest keeps pytest's order


@pytest.fixture
def loopback_hub():
    """A Hub on 127.0.0.1 (tests/hub_server.py) knowing hub_server.TOKENS; the test fails if it could not handle a
    request it was sent."""
    from hub_server import READ_TOKEN, TOKENS, LoopbackHub

    with LoopbackHub(TOKENS, read_only=(READ_TOKEN,)) as hub:
        yield hub
    assert hub.server_errors == []


@pytest.fixture
def silent_server():
    """A server on 127.0.0.1 that accepts connections and never answers."""
    from hub_server import SilentServer

    with SilentServer() as server:
        yield server
