"""The page's UMAP service (demo.umap.service) with a stand-in for the child process: the pacing arithmetic,
few-class layouts only as the pacer allows while a run trains and all of them at rest, the all-classes picture
through the same process, the process held while a run trains. The real child is held and ends with a killed server
here; it lays points out (umap, numba) only in the opt-in slow test."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from demo.common.settings import REPO_ROOT
from demo.runs.few_class_track import FewClassTrack
from demo.umap.service import Pacer, UmapFailed, UmapProcess, UmapService
from memvir.analysis.projection import umap_layout
from memvir.events import SnapshotEvent


class StandInProcess:
    """What UmapService asks of UmapProcess; lays points out at their first two coordinates, at a stated CPU cost."""

    def __init__(self, cost=0.01, fail=False):
        self.calls, self.cost, self.fail = [], cost, fail
        self.last_cpu_s, self.started, self.closed = 0.0, False, False
        self.held = False

    def start(self):
        self.started = True

    def hold(self, held):
        self.held = held

    def layout(self, points, seed, init=None, **options):
        self.calls.append((len(points), init is not None))
        self.last_cpu_s = self.cost
        if self.fail:
            raise UmapFailed("ValueError: no layout today")
        return np.asarray(points)[:, :2].copy()

    def close(self):
        self.closed = True


def snapshot(step):
    gen = torch.Generator().manual_seed(step)
    return SnapshotEvent(
        step=step, margin=3, embeddings=torch.randn(6, 4, generator=gen), labels=torch.tensor([0, 1, 0, 1, 0, 1]),
        ages=torch.tensor([0, 0, 1, 1, 2, 2]), class_weights=torch.randn(6, 4, generator=gen),
        class_weight_labels=torch.arange(6) % 2, class_weight_ages=torch.arange(6) // 2,
        probe_embeddings=torch.randn(4, 4, generator=gen), probe_labels=torch.tensor([3, 3, 4, 4]),
        focus_classes=torch.tensor([0, 1]), focus_embeddings=torch.randn(6, 4, generator=gen),
        focus_labels=torch.tensor([0, 0, 0, 1, 1, 1]))


def wait_for(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    raise AssertionError("condition not met before the deadline")


def test_the_pacer_keeps_layouts_to_their_share_of_one_core():
    pacer = Pacer(share=0.1)
    assert pacer.ready_in(now=100.0) == 0.0
    pacer.spent(cost=0.2, ended=100.0)  # 0.2 s of CPU at a tenth of a core: the next starts 1.8 s later
    assert pacer.ready_in(now=100.5) == pytest.approx(1.3)
    assert pacer.ready_in(now=101.8) == 0.0
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\], got 0"):
        Pacer(share=0)


@pytest.fixture
def service():
    process = StandInProcess(cost=1000.0)  # after one layout, a training run's pacer waits 9,000 s
    made = UmapService(process=process, pacer=Pacer(share=0.1))
    yield made, process
    made.close()
    assert process.closed


def test_while_training_the_pacer_holds_layouts_back_and_at_rest_all_are_made(service):
    service, process = service
    resting = {"value": False}
    track = FewClassTrack(lambda: resting["value"])
    wait_for(lambda: process.started)  # the child starts (and compiles) before the first snapshot needs it
    track.add(snapshot(10), 60)
    service.watch(track)
    assert track.umap_expected
    wait_for(lambda: track.view(10, umap=True).projection.method == "umap")
    # every point of the view, from the PCA picture: the 6 images, the 6 class weights (2 classes, live and 2 stored
    # each) and the 4 stored embeddings
    assert process.calls == [(6 + 6 + 4, True)]
    track.add(snapshot(20), 60)
    track.add(snapshot(30), 60)
    time.sleep(1.2)  # more than the service's idle wait: it looked, and the pacer said no
    assert len(process.calls) == 1 and track.view(30, umap=True).projection.method == "pca"
    resting["value"] = True  # paused: no pacing, every snapshot left is laid out
    wait_for(lambda: all(track.view(step, umap=True).projection.method == "umap" for step in (20, 30)))
    assert len(process.calls) == 3


def test_a_failed_layout_is_not_tried_again_and_the_service_goes_on():
    process = StandInProcess(fail=True)
    service = UmapService(process=process)
    try:
        track = FewClassTrack(lambda: True)
        track.add(snapshot(10), 60)
        service.watch(track)
        wait_for(lambda: len(process.calls) == 1)
        time.sleep(0.8)
        assert len(process.calls) == 1 and track.view(10, umap=True).projection.method == "pca"
        process.fail = False
        track.add(snapshot(20), 60)
        wait_for(lambda: track.view(20, umap=True).projection.method == "umap")
    finally:
        service.close()


def test_the_all_classes_picture_is_laid_out_in_the_same_process():
    process = StandInProcess()
    service = UmapService(process=process)
    try:
        service.submit(("run", 10), snapshot(10))
        assert service.wait(("run", 10), timeout=20)
        projected = service.result(("run", 10))
        assert projected.method == "umap" and projected.xy.shape == (6, 2)
        assert process.calls == [(6 + 6 + 4, False)]  # rows, weights and probe together, from UMAP's own start
    finally:
        service.close()


def test_while_a_run_trains_the_process_is_held_between_layouts():
    process, training = StandInProcess(), {"value": False}
    service = UmapService(process=process, training=lambda: training["value"])
    try:
        time.sleep(0.7)  # more than the service's idle wait
        assert not process.held
        training["value"] = True
        wait_for(lambda: process.held)
        training["value"] = False
        wait_for(lambda: not process.held)
    finally:
        service.close()


def _process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat: T while stopped."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads the child's state from /proc")
def test_a_held_child_is_stopped_until_released_and_closes_held():
    process = UmapProcess()
    try:
        process.start()  # it imports umap and compiles: the work a held child must not do
        pid = process._process.pid
        process.hold(True)
        wait_for(lambda: _process_state(pid) == "T")
        cpu = _cpu_ticks(pid)
        time.sleep(0.5)
        assert _cpu_ticks(pid) == cpu  # stopped: not a tick of CPU
        process.hold(False)
        wait_for(lambda: _process_state(pid) != "T")
        process.hold(True)
        wait_for(lambda: _process_state(pid) == "T")
    finally:
        process.close()  # a held child is continued to read the end of its input
    assert process._process.poll() is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel ends the child with the server on Linux")
def test_a_held_child_ends_with_a_server_killed_with_minus_9():
    code = (f"import sys, time; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
            "from demo.umap.service import UmapProcess\n"
            "process = UmapProcess(); process.start(); process.hold(True)\n"
            "print(process._process.pid, flush=True); time.sleep(120)\n")
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(server.stdout.readline())
        wait_for(lambda: _process_state(child) == "T")
    finally:
        server.kill()
        server.wait()
    # gone, or dead and waiting to be reaped by whoever inherited it: not stopped, nor compiling on
    wait_for(lambda: not os.path.exists(f"/proc/{child}") or _process_state(child) in ("Z", "X"))


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MEMVIR_SLOW") != "1", reason="the child compiles numba (~15 s); set MEMVIR_SLOW=1")
def test_the_real_child_lays_points_out_and_ends_with_the_pipe():
    process = UmapProcess()
    try:
        process.hold(True)  # held, as while a run trains: a layout asked for still runs
        points = np.random.default_rng(0).normal(size=(40, 8))
        xy = process.layout(points, seed=0)
        assert _process_state(process._process.pid) == "T"  # and the child holds still again after it
        assert xy.shape == (40, 2) and np.isfinite(xy).all()
        assert process.compile_cpu_s > 0 and process.last_cpu_s > 0
        assert (process.layouts, process.layout_cpu_s) == (1, process.last_cpu_s)
        with pytest.raises(UmapFailed, match="at least 4 points"):
            process.layout(points[:3], seed=0)
        np.testing.assert_allclose(process.layout(points, seed=0), xy)  # seeded: the same layout again
        # umap_layout's keywords reach the child: the layout is the one made here with them
        wide = process.layout(points, seed=0, n_neighbors=39, min_dist=0.99)
        np.testing.assert_allclose(wide, umap_layout(points, 0, n_neighbors=39, min_dist=0.99))
    finally:
        process.close()
    with pytest.raises(UmapFailed, match="closed"):
        process.layout(points, seed=0)
