"""demo.retrieve.index_builds: a key builds once at a time (a second request joins the build in flight), its progress
and its error are readable, and only the latest outcomes are remembered. Threads are synchronised by events; nothing is
timed."""

import sys
import threading
import time

import pytest

from demo.retrieve.index_builds import IndexBuilds

DEADLINE_S = 30.0


def _waiting_for_a_build(thread: threading.Thread) -> bool:
    """True once `thread` is blocked inside IndexBuilds.run, waiting for another thread's build."""
    frame = sys._current_frames().get(thread.ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return bool(names) and names[0] == "wait" and "run" in names


def _until(condition, what):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {DEADLINE_S} s")
        time.sleep(0.005)


def test_a_second_request_joins_the_build_in_flight_and_progress_is_readable():
    builds = IndexBuilds()
    building, release = threading.Event(), threading.Event()
    calls, results = [], []

    def slow(report):
        calls.append("first")
        report(0.25)
        building.set()
        assert release.wait(DEADLINE_S)
        report(0.75)
        return "the index"

    def second_build(report):
        calls.append("second")
        return "another index"

    assert builds.progress("gallery") is None
    first = threading.Thread(target=lambda: results.append(builds.run("gallery", slow)))
    first.start()
    assert building.wait(DEADLINE_S)
    assert builds.progress("gallery") == (0.25, None)
    second = threading.Thread(target=lambda: results.append(builds.run("gallery", second_build)))
    second.start()
    _until(lambda: _waiting_for_a_build(second), "the second request waiting")
    release.set()
    first.join(DEADLINE_S)
    second.join(DEADLINE_S)
    assert results == ["the index", "the index"] and calls == ["first"]
    assert builds.progress("gallery") == (1.0, None)


def test_a_failed_build_reports_its_error_and_the_next_request_builds_again():
    builds = IndexBuilds()

    def failing(report):
        report(0.5)
        raise ValueError("the dataset is gone")

    with pytest.raises(ValueError, match="the dataset is gone"):
        builds.run("gallery", failing)
    fraction, error = builds.progress("gallery")
    assert fraction == 0.0 and str(error) == "the dataset is gone"
    assert builds.run("gallery", lambda report: "rebuilt") == "rebuilt"
    assert builds.progress("gallery") == (1.0, None)


def test_reported_fractions_are_clipped_to_0_1():
    builds = IndexBuilds()
    seen = []

    def build(report):
        report(1.5)
        seen.append(builds.progress("gallery"))
        report(-1)
        seen.append(builds.progress("gallery"))
        return None

    builds.run("gallery", build)
    assert seen == [(1.0, None), (0.0, None)]


def test_only_the_latest_32_outcomes_are_remembered():
    builds = IndexBuilds()
    for number in range(33):
        builds.run(number, lambda report: None)
    assert builds.progress(0) is None
    assert builds.progress(1) == builds.progress(32) == (1.0, None)
