"""Runs in processes of their own (demo.runs.process, demo.runs.child) on glyphs-mini: what the process says and
in which order, live changes confirmed or refused, snapshots carried as files and cleaned up, a stopped run resumed
in a new process, and failures that end the run alone: a `kill -9` of its process while the server serves, and an
allocation past the process's memory limit. Waits poll against a deadline; nothing asserts how fast anything is."""

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from served_app import free_port, poll_status_until, step_of

from demo.common.cores import training_threads
from demo.common.settings import AppSettings
from demo.runs import snapshot_transport
from demo.runs.manager import RunManager
from demo.runs.messages import LaunchSpec
from demo.runs.process import RunProcess, TrainingRefused
from memvir.config import TrainConfig
from memvir.events import ControlEvent, ControlRefused, EvalEvent, SnapshotEvent, StepEvent

REPO_ROOT = Path(__file__).resolve().parents[3]
DEADLINE_S = 120.0


def quick(**overrides) -> dict:
    """glyphs-mini: 288 training images, 9 steps of 32 per epoch; a checkpoint at every epoch's end."""
    values = dict(dataset="glyphs-mini", batch_size=32, epochs=1, eval_at_start=False, snapshot_every=3, log_every=1)
    return TrainConfig(**{**values, **overrides}).to_dict()


def wait_for(condition, what: str, seconds: float = DEADLINE_S):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not before the deadline")


class Heard:
    """A listener that keeps every event it hears."""

    def __init__(self):
        self.events = []

    def __call__(self, event):
        self.events.append(event)

    def of(self, kind):
        return [event for event in self.events if isinstance(event, kind)]


# ---------------------------------------------------------------------------------------------- the process alone
def test_the_process_says_ready_then_sends_the_trainers_events_in_order(tmp_path):
    heard = Heard()
    folder = tmp_path / "run"
    threads = training_threads()
    process = RunProcess(LaunchSpec(str(folder), quick(), threads), heard)
    assert process.pid != os.getpid()
    ready = process.wait_ready()
    assert (ready.step, ready.total_steps, ready.history) == (0, 9, [])
    assert (ready.num_classes, ready.dim, ready.device, ready.threads) == (24, 128, "cpu", threads)
    assert ready.config == quick()
    assert not folder.exists(), "nothing is written before the server lets it train"
    process.go()
    process.join(DEADLINE_S)
    assert not process.alive

    kinds = [type(event).__name__ for event in heard.events]
    assert kinds[0] == "StatusEvent" and heard.events[0].state == "running"
    assert heard.events[-1].state == "finished" and heard.events[-1].checkpoint == str(folder / "trainer_state.pt")
    assert [event.step for event in heard.of(StepEvent)] == list(range(1, 10))
    assert [event.step for event in heard.of(EvalEvent)] == [9]
    snapshots = heard.of(SnapshotEvent)
    assert [snapshot.step for snapshot in snapshots] == [3, 6, 9]
    assert all(kind != "EventFile" for kind in kinds), "snapshots arrive as events again"
    last = snapshots[-1]
    assert last.embeddings.shape[1] == 128 and last.embeddings.shape[0] == last.labels.shape[0] == last.ages.shape[0]
    assert last.class_weights.shape == (24, 128) and last.probe_labels.shape[0] == last.probe_embeddings.shape[0]
    # each snapshot's file was deleted once read, and the folder went with the process
    assert not (folder / snapshot_transport.FOLDER).exists()


def test_the_process_sends_what_came_meanwhile_in_one_message_at_its_pace(tmp_path):
    from multiprocessing import Pipe

    from demo.runs.child import SEND_EVERY_S, _Outbox

    receiving, sending = Pipe(duplex=False)
    outbox = _Outbox(sending, tmp_path)
    steps = [StepEvent(step=step, epoch=0, loss=1.0, num_classes=4, num_virtual_sets=0, mean_target_cosine=0.5,
                       images_per_s=10.0, lr=0.1, warmup=False) for step in range(1, 23)]
    # queued within microseconds: the first goes at once, perhaps with a few of the others, the rest after the pause
    for event in steps[:20]:
        outbox.put(event)
    messages = []
    while sum(map(len, messages)) < 20:
        assert receiving.poll(10 * SEND_EVERY_S), f"{sum(map(len, messages))} of 20 steps sent"
        messages.append(receiving.recv())
    assert len(messages) <= 2 and [event for message in messages for event in message] == steps[:20]
    outbox.put(steps[20])
    outbox.put(steps[21])
    outbox.close()  # sends what is queued
    rest = []
    while receiving.poll(0.1):
        rest += receiving.recv()
    assert rest == steps[20:]


def test_live_changes_are_confirmed_with_their_step_or_refused_with_the_trainers_reason(tmp_path):
    heard = Heard()
    process = RunProcess(LaunchSpec(str(tmp_path / "run"), quick(epochs=500, snapshot_every=0), 1), heard)
    process.wait_ready()
    process.go()
    wait_for(lambda: heard.of(StepEvent), "a first step")
    process.update({"memvir_n": 3})
    wait_for(lambda: heard.of(ControlEvent), "the change applied")
    (control,) = heard.of(ControlEvent)
    assert control.changes == {"memvir_n": 3}
    assert control.message == f"memvir_n 2 -> 3: applied at step {control.step + 1}"
    wait_for(lambda: heard.of(StepEvent)[-1].step > control.step, "a step after it")
    assert heard.of(StepEvent)[control.step].step == control.step + 1  # the step it named is the next one heard
    with pytest.raises(TrainingRefused, match="^N must be an integer >= 0, got -1$"):  # named as the page names it
        process.update({"memvir_n": -1})
    process.pause()
    wait_for(lambda: heard.events and getattr(heard.events[-1], "state", None) == "paused", "the run paused")
    process.stop()
    process.join(DEADLINE_S)
    assert heard.events[-1].state == "stopped" and len(heard.of(ControlEvent)) == 1


class HeldOnSnapshots(Heard):
    """A listener that, from the first snapshot on, holds the events until `release` (a page's figures drawn slowly
    on a busy machine)."""

    def __init__(self):
        super().__init__()
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, event):
        if isinstance(event, SnapshotEvent):
            self.holding.set()
            self.release.wait()
        super().__call__(event)


def test_a_live_change_is_answered_while_the_listener_is_still_busy_with_earlier_events(tmp_path):
    held = HeldOnSnapshots()
    process = RunProcess(LaunchSpec(str(tmp_path / "run"), quick(epochs=500, snapshot_every=1), 1), held)
    try:
        process.wait_ready()
        process.go()
        assert held.holding.wait(DEADLINE_S), "no snapshot came"
        process.update({"memvir_n": 3}, timeout=DEADLINE_S)  # answered although no event has been heard since
        assert not held.of(ControlEvent) and not held.release.is_set()
    finally:
        held.release.set()
        process.stop()
        process.join(DEADLINE_S)
    wait_for(lambda: not process.alive, "the run ended")
    (control,) = held.of(ControlEvent)  # the events held back were all delivered, in order, the change among them
    assert control.changes == {"memvir_n": 3}
    assert held.events[-1].state == "stopped"


def test_a_run_refused_by_the_server_before_its_go_ends_without_writing_anything(tmp_path):
    heard = Heard()
    process = RunProcess(LaunchSpec(str(tmp_path / "run"), quick(), 1), heard)
    process.wait_ready()
    process.stop()  # the budget said no
    process.join(DEADLINE_S)
    assert heard.events == [] and not (tmp_path / "run").exists()


@dataclasses.dataclass(frozen=True)
class _FewClassSnapshot(SnapshotEvent):
    """A SnapshotEvent with fields added, as the few-class view will add them."""

    few_class_embeddings: torch.Tensor = None
    few_classes: tuple = ()


def test_snapshots_travel_as_files_whatever_fields_their_dataclass_has(tmp_path):
    event = _FewClassSnapshot(
        step=7, margin=2, embeddings=torch.randn(5, 4), labels=torch.arange(5), ages=torch.zeros(5).long(),
        class_weights=torch.randn(3, 4), class_weight_labels=torch.arange(3), class_weight_ages=torch.zeros(3).long(),
        probe_embeddings=torch.randn(2, 4), probe_labels=torch.tensor([0, 1]),
        few_class_embeddings=torch.randn(6, 4), few_classes=(0, 2))
    message = snapshot_transport.to_message(event, tmp_path)
    assert isinstance(message, snapshot_transport.EventFile)
    assert message.fields == {"step": 7, "margin": 2, "few_classes": (0, 2)}  # every other field as it is
    path = Path(message.path)
    assert path.parent == tmp_path / snapshot_transport.FOLDER and path.is_file()
    assert [entry.name for entry in path.parent.iterdir()] == [path.name], "no partial file left beside it"
    back = snapshot_transport.from_message(message)
    assert type(back) is _FewClassSnapshot and not path.exists()
    for field in dataclasses.fields(event):
        assert torch.equal(getattr(back, field.name), getattr(event, field.name)) if isinstance(
            getattr(event, field.name), torch.Tensor) else getattr(back, field.name) == getattr(event, field.name)
    step = StepEvent(step=1, epoch=0, loss=1.0, num_classes=3, num_virtual_sets=0, mean_target_cosine=0.1,
                     images_per_s=10.0, lr=1e-3, warmup=True)
    assert snapshot_transport.to_message(step, tmp_path) is step  # no tensors: it travels as it is
    left = Path(snapshot_transport.to_message(event, tmp_path).path)  # a file its reader never got
    (tmp_path / snapshot_transport.FOLDER / "snapshotevent-000000007-1.pt").write_bytes(b"another process's")
    snapshot_transport.remove_files(tmp_path, os.getpid())
    assert not left.exists() and (tmp_path / snapshot_transport.FOLDER).is_dir()
    snapshot_transport.remove_files(tmp_path, 1)
    assert not (tmp_path / snapshot_transport.FOLDER).exists()


# ---------------------------------------------------------------------------------------------- through the manager
def _settings(tmp_path, **limits) -> AppSettings:
    return AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints", umap=False,
                       train_threads=1, **limits)


@pytest.fixture
def manager(tmp_path):
    manager = RunManager(_settings(tmp_path))
    yield manager
    manager.close()


def test_a_stopped_run_resumes_in_a_new_process(manager):
    run = manager.start(TrainConfig.from_dict(quick(epochs=200, snapshot_every=5)), "alice")
    wait_for(lambda: run.last_step is not None and run.last_step.step >= 3, "three steps")
    first_pid = run.process.pid
    manager.stop(run.id, "alice")
    run.join(DEADLINE_S)
    stopped_at = run.last_step.step
    assert run.state == "stopped" and run.can_resume
    assert not (run.folder / snapshot_transport.FOLDER).exists()

    manager.resume(run.id, "alice")
    assert run.process.pid != first_pid and run.ready.step == stopped_at
    wait_for(lambda: run.last_step.step >= stopped_at + 3, "three steps after the stop")
    manager.stop(run.id, "alice")
    run.join(DEADLINE_S)
    steps = [record["step"] for record in run.records if record["type"] == "step"]
    assert steps == list(range(1, steps[-1] + 1))  # no step twice, none missing


def test_a_starting_run_shows_as_starting_until_its_process_is_ready(manager):
    import threading

    from demo.train import live_view

    started = threading.Thread(target=manager.start, args=(TrainConfig.from_dict(quick(epochs=200)), "alice"))
    started.start()
    wait_for(lambda: manager.runs(), "the run listed")
    (run,) = manager.runs()
    status = live_view.status_markdown(run, "alice")
    assert status.startswith(("**Starting** · its training process is loading the dataset and the model",
                              "**Training**")), status
    started.join(DEADLINE_S)
    wait_for(lambda: run.state == "running", "the run training")
    manager.stop(run.id, "alice")
    run.join(DEADLINE_S)


def _serving(settings):
    from gradio_client import Client

    from demo.page import build_app

    app = build_app(settings)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return app, Client(f"http://127.0.0.1:{port}/", verbose=False)


@pytest.mark.slow
def test_a_run_whose_process_is_killed_fails_alone_and_keeps_its_checkpoint(tmp_path):
    app, client = _serving(_settings(tmp_path))
    try:
        started = client.predict(dataset="glyphs-mini", batch_size=32, epochs=500, memvir_n=2, memvir_m=2,
                                 warmup_epochs=0, snapshot_every=2, api_name="/start_run")
        assert started["run_id"] and started["yours"] is True, started
        poll_status_until(client, lambda status: status.startswith("**Training**") and step_of(status) >= 12,
                          "a checkpoint's epoch behind it", DEADLINE_S)
        (run,) = app.run_manager.runs()
        os.kill(run.process.pid, signal.SIGKILL)

        failed = poll_status_until(client, lambda status: status.startswith("**Failed**"), "the run failed", DEADLINE_S)
        # the server answered every poll; the run says what happened and what it kept
        match = re.search(r"the training process was killed \(SIGKILL: the machine may have run out of memory, or "
                          r"it was ended from outside\) at step (\d+); its last checkpoint, at step (\d+), is kept "
                          r"· press \*\*Resume\*\* to continue", failed)
        assert match, failed
        killed_at, saved_at = int(match.group(1)), int(match.group(2))
        assert saved_at % 9 == 0 and 9 <= saved_at <= killed_at
        assert not (run.folder / snapshot_transport.FOLDER).exists(), "its unread snapshot files are gone"
        last = (run.folder / "metrics.jsonl").read_text().splitlines()[-1]
        assert '"state": "failed"' in last, "the run folder says how it ended"

        # the slot is free: a new run starts and trains
        again = client.predict(dataset="glyphs-mini", batch_size=32, epochs=500, snapshot_every=0,
                               api_name="/start_run")
        assert again["run_id"] not in (None, run.id) and again["yours"] is True, again
        poll_status_until(client, lambda status: status.startswith("**Training**") and step_of(status) >= 2,
                          "the new run", DEADLINE_S)
        client.predict(api_name="/stop_run")
        poll_status_until(client, lambda status: status.startswith("**Stopped**"), "the new run stopped", DEADLINE_S)
        wait_for(lambda: not app.run_manager.busy_runs(), "its process ended")

        # and the killed run continues from its checkpoint in a new process
        app.run_manager.resume(run.id, run.owner)
        assert run.ready.step == saved_at

        def steps_logged():
            return [record["step"] for record in run.records if record["type"] == "step"]

        wait_for(lambda: steps_logged()[-1] > saved_at + 2, "the killed run resumed")
        assert run.state == "running" and steps_logged() == sorted(set(steps_logged()))
    finally:
        app.close()


@pytest.mark.slow
def test_a_live_change_that_allocates_past_the_memory_limit_is_refused_and_the_run_trains_on(tmp_path):
    """The budget (here far above) lets N = 50, M = 6000 through; the process's address space, capped at 6 GB,
    cannot hold its 8.7 GB memory, so the allocation fails inside the training process. Before (issue 29), the run
    failed with it; now it keeps its memory and trains on, the change refused with the allocator's reason."""
    manager = RunManager(_settings(tmp_path, memory_budget=10**12, run_memory_limit=6 * 10**9))
    try:
        run = manager.start(TrainConfig.from_dict(quick(epochs=500, memvir_n=2, memvir_m=2, warmup_epochs=0,
                                                        snapshot_every=0)), "alice")
        wait_for(lambda: run.last_step is not None and run.last_step.step >= 10, "a checkpoint's epoch behind it")
        manager.update(run.id, "alice", {"memvir_n": 50, "memvir_m": 6000})
        with run.lock:
            refused_already = run.control_message is not None
            assert refused_already or run.pending["memvir_n"] == 50  # asked for, until the run says it could not be had
        wait_for(lambda: run.control_message is not None, "the change refused")
        assert re.fullmatch(r"N 2 -> 50, M 2 -> 6000 refused at step (\d+): its memory could not be allocated "
                            r"\(.*can't allocate memory.*\); the run trains on with N = 2, M = 2",
                            run.control_message), run.control_message
        refused_at = run.last_step.step
        wait_for(lambda: run.last_step.step > refused_at + 3, "the run training on")
        assert run.state == "running" and run.live_values["memvir_n"] == 2 and "memvir_n" not in run.pending
        assert run.last_step.num_virtual_sets == 2
        manager.stop(run.id, "alice")
        run.join(DEADLINE_S)
        assert run.state == "stopped"
    finally:
        manager.close()


class _RefusesBeforeItReplies:
    """A run's process at its quickest: the Trainer refuses the change (its memory could not be had) and the
    refusal reaches the listener before the reply to the ask does, as the reader thread can deliver it."""

    def __init__(self, run):
        self.run = run

    def update(self, changes):
        self.run._on_event(ControlRefused(step=7, changes=changes, reason="can't allocate memory", message=""))


class _Gone:
    def update(self, changes):
        raise TrainingRefused("the run is no longer training")


def _live_run(tmp_path):
    from demo.runs.live_run import LiveRun

    return LiveRun("r", "alice", tmp_path, TrainConfig.from_dict(quick(memvir_n=2, memvir_m=2)))


def test_a_refusal_that_arrives_before_the_reply_is_not_undone_by_the_ask(tmp_path):
    """The CI failure of stop 34: N 2 -> 50 was refused, yet the page kept 50 as asked for, because the ask was
    recorded after its reply returned and the refusal came in between."""
    run = _live_run(tmp_path)
    run.process = _RefusesBeforeItReplies(run)
    RunManager._ask(run, {"memvir_n": 50, "memvir_m": 6000})
    assert run.pending == {} and (run.live_values["memvir_n"], run.live_values["memvir_m"]) == (2, 2)
    assert run.control_message.startswith("N 2 -> 50, M 2 -> 6000 refused at step 8")


def test_an_ask_the_process_never_took_is_withdrawn(tmp_path):
    run = _live_run(tmp_path)
    run.process = _Gone()
    run.asked({"memvir_n": 4})
    with pytest.raises(ValueError, match="the run is no longer training"):
        RunManager._ask(run, {"memvir_n": 8, "focus_classes": [1, 2]})
    assert run.pending == {"memvir_n": 4}  # the ask before it stands; the classes asked for are not pending


def test_the_server_keeps_torch_and_faiss_to_one_thread():
    code = ("from demo.common.cores import limit_server_threads; limit_server_threads(); import torch, faiss; "
            "print(torch.get_num_threads(), faiss.omp_get_max_threads())")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["1", "1"]


@pytest.mark.parametrize(("configured", "cores", "threads"), [
    (None, 1, 1), (None, 2, 2), (None, 4, 4), (None, 8, 7), (None, 64, 63), (3, 64, 3)])
def test_a_run_takes_the_cores_less_the_servers_share(configured, cores, threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # tests/conftest.py sets it
    assert training_threads(configured, cores) == threads


@pytest.mark.parametrize(("omp", "threads"), [("3", 3), ("0", 1), (" 2 ", 2), ("", 7), ("many", 7)])
def test_omp_num_threads_stands_in_for_an_unset_thread_count(omp, threads, monkeypatch):
    """Where the environment sets OMP_NUM_THREADS, a run takes those threads, as torch would on the command line;
    MEMVIR_TRAIN_THREADS (`configured`) still wins, and a value that is not a whole number is ignored."""
    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert training_threads(None, 8) == threads
    assert training_threads(5, 8) == 5


def test_the_snapshot_of_a_run_is_kept_from_its_file(manager):
    run = manager.start(TrainConfig.from_dict(quick(snapshot_every=3)), "alice")
    run.join(DEADLINE_S)
    assert run.state == "finished" and [view.step for view in run.snapshots] == [3, 6, 9]
    assert isinstance(run.latest_raw_snapshot, SnapshotEvent) and run.latest_raw_snapshot.step == 9
    assert isinstance(run.process, RunProcess) and not run.process.alive
    assert run.records[-1]["state"] == "finished"  # the Trainer's own last word, nothing added by the server


def _niceness(pid: int, thread: int) -> int:
    """A thread's niceness, field 19 of /proc/PID/task/TID/stat."""
    return int(Path(f"/proc/{pid}/task/{thread}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
def test_background_threads_run_below_the_threads_that_serve_and_train(manager):
    import threading

    from demo.common.cores import BACKGROUND_NICENESS
    from demo.train.live_view import FigureBuilder

    figures = FigureBuilder()
    run = manager.start(TrainConfig.from_dict(quick(epochs=200)), "alice")
    try:
        wait_for(lambda: run.last_step is not None, "a step")
        server, child = os.getpid(), run.process.pid
        base = _niceness(server, threading.main_thread().native_id)
        by_name = {thread.name: thread.native_id for thread in threading.enumerate()}
        # in the server: drawing the figures and reading the run's events, below the threads that serve pages
        assert _niceness(server, by_name["memvir-figures"]) == min(19, base + BACKGROUND_NICENESS)
        readers = [tid for name, tid in by_name.items() if name.endswith(("-reader", "-events"))]
        assert len(readers) == 2  # the one that receives, the one that hands the events on
        assert [_niceness(server, tid) for tid in readers] == [min(19, base + BACKGROUND_NICENESS)] * 2
        # in the run's process: only the thread that sends the events; the training threads keep their priority
        niceness = sorted(_niceness(child, int(task.name)) for task in Path(f"/proc/{child}/task").iterdir())
        assert niceness.count(min(19, base + BACKGROUND_NICENESS)) == 1
        assert niceness[0] == base
    finally:
        figures.close()
        manager.stop(run.id, "alice")
        run.join(DEADLINE_S)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
def test_on_a_small_machine_the_server_yields_to_the_processes_it_launches():
    # in a process of its own: yielding lowers the calling thread for good
    code = """
import os, subprocess, sys, threading
from demo.common.cores import SERVER_NICENESS, launch, yield_to_training
def mine():  # (niceness, scheduling policy) of the calling thread
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), os.sched_getscheduler(threading.get_native_id())
first = mine()
assert yield_to_training("idle", cores=2)
assert not yield_to_training("idle", cores=2)  # once
here = mine()
later = []
thread = threading.Thread(target=lambda: later.append(mine()))
thread.start(); thread.join()
ask = [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))"]
launched = launch(lambda: subprocess.run(ask, capture_output=True, text=True, check=True)).stdout.split()
plain = subprocess.run(ask, capture_output=True, text=True, check=True).stdout.split()
print(*first, *here, *later[0], *launched, *plain, SERVER_NICENESS, os.SCHED_IDLE)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    first, first_policy, *lowered, lowered_by, idle = map(int, result.stdout.split())
    here, later, launched, plain = zip(lowered[::2], lowered[1::2], strict=True)
    # the server and whatever it starts itself: lower, and scheduled only where a core is left idle
    assert here == later == plain == (min(19, first + lowered_by), idle)
    assert launched == (first, first_policy) != (first, idle)  # a launched process keeps the server's first priority


@pytest.mark.parametrize(("priority", "cores", "lowered", "idle_class"), [
    ("idle", 8, False, False), ("normal", 2, False, False), ("low", 2, True, False)])
def test_the_server_keeps_its_priority_on_larger_machines_and_lowers_as_asked_on_small_ones(priority, cores, lowered,
                                                                                          idle_class):
    code = ("import os, threading; from demo.common.cores import yield_to_training; me = threading.get_native_id(); "
            "before = os.getpriority(os.PRIO_PROCESS, me); "
            f"print(yield_to_training({priority!r}, cores={cores}), os.getpriority(os.PRIO_PROCESS, me) > before, "
            "os.sched_getscheduler(me) == os.SCHED_IDLE)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.split() == [str(lowered), str(lowered), str(idle_class)]


def test_an_unknown_server_priority_is_refused():
    from demo.common.cores import yield_to_training

    with pytest.raises(ValueError, match="the server's priority is one of idle, low, normal, got 'high'"):
        yield_to_training("high")


def _wake_ups() -> int:
    """Context switches of every thread of this process so far (each is a thread going to sleep or pre-empted)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_an_idle_server_wakes_up_tens_of_times_a_second_not_a_thousand(tmp_path):
    # gradio's queue would look for events every millisecond; each wake-up takes a core from a training thread
    app, _ = _serving(_settings(tmp_path))
    try:
        time.sleep(2.0)  # started
        before, began = _wake_ups(), time.monotonic()
        time.sleep(2.0)
        per_second = (_wake_ups() - before) / (time.monotonic() - began)
    finally:
        app.close()
    assert per_second < 100, f"{per_second:.0f} wake-ups a second"  # about 22 measured (0.1 s queue checks)
