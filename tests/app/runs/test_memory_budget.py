"""MemVir's memory budget from what the run's process may really use (issue 29, item 1): the least of the machine's
free memory, its cgroup's limit less its usage and its address-space limit less its size, the one that bounds it named.

Before, the budget was half of MemAvailable: a process under an address-space limit, or in a container whose cgroup
caps it, saw the host's free memory, and a run whose memory passed that budget failed at its first step. The cgroup
cases use a cgroup folder of the test's own (MEMVIR_CGROUP_ROOT); the address-space cases a real limit, set by
setrlimit, by `prlimit`, and by MEMVIR_RUN_MEMORY_LIMIT in the app's own run process."""

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError
from served_app import serving

from demo.common.cores import CGROUP_ROOT_ENV
from demo.common.settings import AppSettings
from demo.runs.memory_budget import memory_budget

REPO_ROOT = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")
DEADLINE_S = 90.0


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup paths as /proc/self/cgroup names them: "v2" and/or "v1" (the memory controller's)."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    return paths


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text)


def _vm_size(pid: int) -> int:
    return next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmSize:"))


# ---------------------------------------------------------------------------------------------- a cgroup folder
def test_a_cgroup_v2_limit_bounds_the_budget(tmp_path):
    """The limit less the usage, the usage less the inactive file cache the kernel reclaims first."""
    if "v2" not in _own_cgroups():
        pytest.skip("this process is in no cgroup v2 hierarchy")
    _write(tmp_path, memory__max="2000000000\n", memory__current="1700000000\n",
           memory__stat="anon 1500000000\ninactive_file 100000000\nactive_file 5\n")
    budget = memory_budget(None, CPU, root=tmp_path)
    assert budget.bytes == 200_000_000 and budget.bound == "cgroup"
    assert budget.source == ("50% of the 381.5 MiB that the memory limit of the run's cgroup leaves free, a limit of "
                             "1.9 GiB with 1.5 GiB in use; MEMVIR_MEMORY_BUDGET sets it")


def test_a_cgroup_v1_limit_bounds_the_budget(tmp_path):
    if "v1" not in _own_cgroups():
        pytest.skip("this process is in no cgroup v1 memory hierarchy")
    _write(tmp_path / "memory", memory__limit_in_bytes="3000000000\n", memory__usage_in_bytes="2500000000\n",
           memory__stat="cache 9\ntotal_inactive_file 0\n")
    budget = memory_budget(None, CPU, root=tmp_path)
    assert budget.bytes == 250_000_000 and budget.bound == "cgroup"
    assert "the 476.8 MiB that the memory limit of the run's cgroup leaves free, a limit of 2.8 GiB" in budget.source


def test_the_tightest_of_a_cgroup_and_its_parents_counts(tmp_path):
    """A parent's limit holds for its children: a container's cgroup inside a Space's."""
    version, path = next(((version, path) for version, path in _own_cgroups().items() if path.strip("/")),
                         (None, None))
    if version is None:
        pytest.skip("this process's cgroups are all at their hierarchy's root")
    base, limit, usage = ((tmp_path, "memory__max", "memory__current") if version == "v2" else
                          (tmp_path / "memory", "memory__limit_in_bytes", "memory__usage_in_bytes"))
    _write(base / path.strip("/"), **{limit: "8000000000", usage: "1000000000"})  # the process's own: 7 GB free
    _write(base, **{limit: "4000000000", usage: "3000000000"})  # its hierarchy's root: 1 GB free
    assert memory_budget(None, CPU, root=tmp_path).bytes == 500_000_000


def test_no_cgroup_limit_leaves_the_machines_free_memory(tmp_path):
    _write(tmp_path, memory__max="max\n", memory__current="1700000000\n")
    _write(tmp_path / "memory", memory__limit_in_bytes="9223372036854771712\n", memory__usage_in_bytes="5\n")
    budget = memory_budget(None, CPU, root=tmp_path)
    assert budget.bound == "MemAvailable" and "this machine's free memory" in budget.source


def test_the_cgroup_root_comes_from_the_environment(tmp_path, monkeypatch):
    if "v2" not in _own_cgroups():
        pytest.skip("this process is in no cgroup v2 hierarchy")
    _write(tmp_path, memory__max="1000000000", memory__current="600000000")
    monkeypatch.setenv(CGROUP_ROOT_ENV, str(tmp_path))
    assert memory_budget(None, CPU).bytes == 200_000_000


def test_a_start_past_a_cgroups_limit_is_refused_with_the_limit_named(tmp_path, monkeypatch):
    """The app's Start, with the run's cgroup (a fake one) leaving 300 MB free: N = 50, M = 200 (290.7 MB on
    glyphs-mini) passed the budget of half of MemAvailable before."""
    if "v2" not in _own_cgroups():
        pytest.skip("this process is in no cgroup v2 hierarchy")
    _write(tmp_path / "cgroup", memory__max="2000000000", memory__current="1700000000")
    monkeypatch.setenv(CGROUP_ROOT_ENV, str(tmp_path / "cgroup"))
    settings = AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "none", umap=False)
    with serving(settings) as (url, app):
        with pytest.raises(AppError) as refused:
            Client(url, verbose=False).predict(dataset="glyphs-mini", batch_size=32, epochs=50, memvir_n=50,
                                               memvir_m=200, warmup_epochs=0, api_name="/start_run")
        notice = str(refused.value)
        # the library's refusal, against the budget the run's process measured, and where that budget came from
        assert notice == (
            "MemVir: N=50, M=200 keep N(M+1) = 10,050 past steps: 277.3 MiB (290,726,400 bytes) at batch 32, 24 "
            "classes, dimension 128, float32, over the memory limit of 143.1 MiB (150,000,000 bytes). Lower N or M, "
            "store the memory in float16/bfloat16 (139.9 MiB), or raise the limit (max_memory_bytes=..., or the "
            "MEMVIR_MAX_MEMORY_BYTES environment variable, in bytes). Here the limit is the run's memory budget, 50% "
            "of the 286.1 MiB that the memory limit of the run's cgroup leaves free, a limit of 1.9 GiB with 1.6 GiB "
            "in use; MEMVIR_MEMORY_BUDGET sets it.")
        assert app.run_manager.runs() == []


# ---------------------------------------------------------------------------------------------- a real limit
def test_an_address_space_limit_set_by_the_process_bounds_its_budget():
    code = textwrap.dedent("""
        import resource
        from pathlib import Path
        import torch
        from demo.runs.memory_budget import memory_budget

        size = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("VmSize:"))
        limit = size + 600_000_000
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        budget = memory_budget(None, torch.device("cpu"))
        print(limit, budget.bytes, budget.bound, budget.source, sep="\\n")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    limit, budget, bound, source = result.stdout.splitlines()
    # the headroom is the 600 MB given, less what the process took since it measured itself
    assert bound == "RLIMIT_AS" and 250_000_000 < int(budget) <= 300_000_000, result.stdout
    assert re.fullmatch(r"50% of the (4|5)\d\d\.\d MiB that the address-space limit of the run's process "
                        rf"\(RLIMIT_AS\) leaves it, a limit of {int(limit) / 2**30:.1f} GiB of which it takes "
                        r"\d+\.\d GiB; MEMVIR_MEMORY_BUDGET sets it", source), source


def test_an_address_space_limit_set_by_prlimit_bounds_the_budget_of_that_process():
    """As the server sees a run's process: the limit another tool (`prlimit`) put on it."""
    child = subprocess.Popen([sys.executable, "-c", "import sys, torch; print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        limit = _vm_size(child.pid) + 400_000_000
        subprocess.run(["prlimit", f"--pid={child.pid}", f"--as={limit}"], check=True)
        budget = memory_budget(None, CPU, pid=child.pid)
        assert budget.bound == "RLIMIT_AS" and budget.bytes == 200_000_000, budget
    finally:
        child.stdin.close()
        child.wait(30)


@pytest.mark.slow
def test_a_start_past_the_run_processs_address_space_is_refused_with_the_limit_named(tmp_path):
    """The app with each run's process capped at 5 GB of address space (MEMVIR_RUN_MEMORY_LIMIT), of which the run's
    process takes most before it trains (torch's libraries and threads): a 1.6 GB memory passed the budget before,
    and the run failed at its first stored step."""
    settings = AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "none", umap=False,
                           run_memory_limit=5 * 10**9)
    with serving(settings) as (url, app):
        with pytest.raises(AppError) as refused:
            Client(url, verbose=False).predict(dataset="glyphs-mini", batch_size=288, epochs=50, memvir_n=50,
                                               memvir_m=200, warmup_epochs=0, api_name="/start_run")
        notice = str(refused.value)
        assert re.fullmatch(
            r"MemVir: N=50, M=200 keep N\(M\+1\) = 10,050 past steps: 1\.5 GiB \([\d,]+ bytes\) at batch 288, 24 "
            r"classes, dimension 128, float32, over the memory limit of \d+\.\d (MiB|GiB) \([\d,]+ bytes\)\. Lower N "
            r"or M(, store the memory in float16/bfloat16 \(787\.6 MiB\))?, or raise the limit .*\. Here the limit "
            r"is the run's memory budget, 50% of the \d+\.\d (MiB|GiB) that the address-space limit of the run's "
            r"process \(RLIMIT_AS\) leaves it, a limit of 4\.7 GiB of which it takes \d\.\d GiB; "
            r"MEMVIR_MEMORY_BUDGET sets it\.", notice), notice
        assert app.run_manager.runs() == []


@pytest.mark.slow
def test_a_live_change_past_the_run_processs_address_space_is_refused_and_the_run_trains_on(tmp_path):
    from demo.runs.manager import RunManager
    from memvir.config import TrainConfig

    settings = AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "none", umap=False,
                           run_memory_limit=6 * 10**9)
    manager = RunManager(settings)
    try:
        run = manager.start(TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=500, memvir_n=2, memvir_m=2,
                                        warmup_epochs=0, snapshot_every=0, eval_at_start=False), "alice")
        deadline = time.monotonic() + DEADLINE_S
        while (run.last_step is None or run.last_step.step < 3) and time.monotonic() < deadline:
            time.sleep(0.2)
        with pytest.raises(ValueError) as refused:
            manager.update(run.id, "alice", {"memvir_n": 50, "memvir_m": 6000})  # 8.7 GB
        assert re.fullmatch(r"MemVir: N=50, M=6000 keep N\(M\+1\) = 300,050 past steps: 8\.1 GiB .*over the memory "
                            r"limit of .*the address-space limit of the run's process \(RLIMIT_AS\) leaves it, a limit "
                            r"of 5\.6 GiB .* The run trains on with N = 2 and M = 2\.", str(refused.value)), (
            str(refused.value))
        assert run.training and run.pending == {} and run.live_values["memvir_n"] == 2
    finally:
        manager.close()

