"""The cores the app counts are the least of its CPU affinity set and its cgroup's CPU quota: a Space's container
limited by `cpu.max` can show every core of its host. Fake cgroup folders (MEMVIR_CGROUP_ROOT) stand in for the
container's, as the memory budget's tests do."""

import os
from pathlib import Path

import pytest

from demo.common import cores
from demo.common.cores import CGROUP_ROOT_ENV, Cores, available_cores, machine_cores, training_threads


def _own_cgroup(version: str) -> str | None:
    """This process's cgroup path in cgroup v2 ("v2") or in v1's cpu hierarchy ("v1"), as /proc/self/cgroup says."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if version == "v2" and hierarchy == "0" and controllers == "":
            return path
        if version == "v1" and "cpu" in controllers.split(","):
            return path
    return None


@pytest.fixture
def sixteen_visible_cores(monkeypatch):
    """A host's 16 cores in the affinity set, as a Space's container may show them."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_a_v2_quota_of_two_cores_gives_a_run_two_threads(tmp_path, monkeypatch, sixteen_visible_cores):
    path = _own_cgroup("v2")
    if path is None:
        pytest.skip("this process is in no cgroup v2 hierarchy")
    folder = tmp_path / path.strip("/")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.max").write_text("200000 100000\n")
    monkeypatch.setenv(CGROUP_ROOT_ENV, str(tmp_path))
    assert available_cores() == Cores(affinity=16, quota=2.0)
    assert machine_cores() == 2 and training_threads() == 2  # every core of 2 (<= 4): none kept for the server
    assert available_cores().describe() == "16 cores in the affinity set, a CPU quota of 2 cores: 2 cores to use"
    (folder / "cpu.max").write_text("max 100000\n")  # no quota: the affinity set's 16, less the server's one
    assert available_cores() == Cores(16, None) and training_threads() == 15


def test_a_v1_quota_is_rounded_up_and_a_parents_tighter_quota_counts(tmp_path, monkeypatch, sixteen_visible_cores):
    path = _own_cgroup("v1")
    if path is None:
        pytest.skip("this process is in no cgroup v1 cpu hierarchy")
    controllers = next(line.split(":")[1] for line in Path("/proc/self/cgroup").read_text().splitlines()
                       if "cpu" in line.split(":")[1].split(","))
    own = tmp_path / controllers / path.strip("/")
    own.mkdir(parents=True, exist_ok=True)
    (own / "cpu.cfs_quota_us").write_text("450000\n")
    (own / "cpu.cfs_period_us").write_text("100000\n")
    monkeypatch.setenv(CGROUP_ROOT_ENV, str(tmp_path))
    assert available_cores() == Cores(16, 4.5) and machine_cores() == 5  # as joblib.cpu_count rounds
    if own != tmp_path / controllers:  # a parent (the container's) with a tighter quota
        (tmp_path / controllers / "cpu.cfs_quota_us").write_text("150000\n")
        (tmp_path / controllers / "cpu.cfs_period_us").write_text("100000\n")
        assert machine_cores() == 2
    (own / "cpu.cfs_quota_us").write_text("-1\n")  # v1's "no quota"
    for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
        (tmp_path / controllers / name).unlink(missing_ok=True)
    assert available_cores().quota is None


def test_no_cgroup_files_leave_the_affinity_set(tmp_path, monkeypatch, sixteen_visible_cores):
    monkeypatch.setenv(CGROUP_ROOT_ENV, str(tmp_path / "nothing-here"))
    assert available_cores() == Cores(16, None)
    assert Cores(2, 0.5).count == 1 and Cores(4, 8.0).count == 4  # at least one; never above the affinity set
    assert cores.cgroup_root() == tmp_path / "nothing-here"
