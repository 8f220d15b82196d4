"""The page's UMAP service (demo/umap_process.py) with a stand-in for the child process: the pacing arithmetic,
few-class layouts only as the pacer allows while a run trains and all of them at rest, the all-classes picture
through the same process. The real child (umap, numba) runs only in the opt-in slow test."""

import os
import time

import numpy as np
import pytest
import torch

from demo.few_class_view import FocusTrack
from demo.umap_process import Pacer, UmapFailed, UmapProcess, UmapService
from memvir.events import SnapshotEvent


class StandInProcess:
    """What UmapService asks of UmapProcess; lays points out at their first two coordinates, at a stated CPU cost."""

    def __init__(self, cost=0.01, fail=False):
        self.calls, self.cost, self.fail = [], cost, fail
        self.last_cpu_s, self.started, self.closed = 0.0, False, False

    def start(self):
        self.started = True

    def layout(self, points, seed, init=None):
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
    track = FocusTrack(lambda: resting["value"])
    assert process.started  # the child starts (and compiles) before the first snapshot needs it
    track.add(snapshot(10), 60)
    service.watch(track)
    assert track.umap_expected
    wait_for(lambda: track.view(10, umap=True).projection.method == "umap")
    assert process.calls == [(len(track.view(10).projection.embedding_xy) + 6 + 4, True)]  # PCA as the start
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
        track = FocusTrack(lambda: True)
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


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MEMVIR_SLOW") != "1", reason="the child compiles numba (~15 s); set MEMVIR_SLOW=1")
def test_the_real_child_lays_points_out_and_ends_with_the_pipe():
    process = UmapProcess()
    try:
        points = np.random.default_rng(0).normal(size=(40, 8))
        xy = process.layout(points, seed=0)
        assert xy.shape == (40, 2) and np.isfinite(xy).all()
        assert process.compile_cpu_s > 0 and process.last_cpu_s > 0
        assert (process.layouts, process.layout_cpu_s) == (1, process.last_cpu_s)
        with pytest.raises(UmapFailed, match="at least 4 points"):
            process.layout(points[:3], seed=0)
        np.testing.assert_allclose(process.layout(points, seed=0), xy)  # seeded: the same layout again
    finally:
        process.close()
    with pytest.raises(UmapFailed, match="closed"):
        process.layout(points, seed=0)
