"""tests/conftest.py hands the test files that share a session's server to one pytest-xdist worker (SHARED_SERVERS):
`--dist loadfile` with those files as one scope. Each file it names exists and asks for that server, and the scheduler
it makes gives those files one scope and every other file a scope of its own."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def suite_conftest():
    """tests/conftest.py as a module of its own name (every conftest here is called `conftest`)."""
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Config:
    """What the scheduler reads of pytest's config, as `-n 2 --dist DIST` sets it."""

    def __init__(self, dist: str):
        self.values = {"dist": dist, "tx": ["2*popen"]}

    def getvalue(self, name: str):
        return self.values[name]


def test_each_file_of_a_shared_server_exists_and_asks_for_it(suite_conftest):
    servers = list(suite_conftest.SHARED_SERVERS.values())
    assert all(servers.count(server) >= 2 for server in servers)  # a server of one file needs no grouping
    for file, server in suite_conftest.SHARED_SERVERS.items():
        assert re.search(rf"\b{server}\b", (ROOT / file).read_text()), f"{file} does not use {server}"


def test_the_files_of_a_shared_server_are_one_scope_and_every_other_file_its_own(suite_conftest):
    scope = suite_conftest.pytest_xdist_make_scheduler(_Config("loadfile"), None)._split_scope
    assert scope("tests/app/test_space.py::test_a") == "space_app"
    assert scope("tests/app/test_hostile_uploads.py::test_b[query file]") == "space_app"
    assert scope("tests/test_cli.py::test_a") == scope("tests/test_cli.py::test_b") == "tests/test_cli.py"
    assert scope("tests/app/test_api.py::Case::test_a") == "tests/app/test_api.py"
    assert suite_conftest.pytest_xdist_make_scheduler(_Config("load"), None) is None  # xdist's own scheduling
