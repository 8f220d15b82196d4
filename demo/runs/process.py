"""RunProcess: one run's Trainer in a training process of its own, as the server sees it.

Each run trains in a child process running demo.runs.child, with no copy of the server's threads or state, and
talks to the server over a pipe (demo.runs.messages): trained in a thread of the web server, it would compete with
every poll, figure and request for the interpreter lock, share torch's and faiss's thread pools, and, dying (an
out-of-memory kill), take every visitor's page with it. The process forks from
multiprocessing's forkserver, which imported torch and the Trainer once (`prepare_run_processes` starts it with the
server): a run's process is ready in a fraction of a second rather than the seconds a fresh interpreter (spawn, off
Linux) spends importing them. The server holds no Trainer: what it needs of one comes up in the
first message, `Ready`.

A reader thread per process receives the process's messages: it answers the replies to live changes at once, and
queues the Trainer's events for a second thread, which hands them in order to a listener (a LiveRun's `_on_event`),
snapshots read back from their files (demo.runs.snapshot_transport): a reply never waits behind the snapshots the
listener projects, however busy the machine is. When the process ends without having said how its run ended (it
crashed, was killed, ran out of memory), its event thread says so with a 'failed' StatusEvent naming the reason and
the last checkpoint, and appends it to the run's metrics.jsonl, as the Trainer would have; the server itself goes on
serving.
"""

from __future__ import annotations

import itertools
import logging
import queue
import signal
import sys
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from demo.common.cores import launch, run_in_background
from demo.runs import snapshot_transport
from demo.runs.messages import GO, PAUSE, RESUME, STOP, UPDATE, Crash, LaunchSpec, Ready, Reply
from memvir.checkpoint import CheckpointError, RunFolder, append_record
from memvir.events import StatusEvent, StepEvent

log = logging.getLogger(__name__)

ENDED_STATES = ("finished", "stopped", "failed")  # a StatusEvent in one of these is the run's last word
REPLY_TIMEOUT_S = 30.0  # a live change is answered by the process's command thread, not its training loop


# What the forkserver imports once for every run's process: the child's module, the Trainer (torch, torchvision) and
# the model the Trainer builds (huggingface_hub's Hub format: about 170 modules a run's process would otherwise import
# before its Ready, docs/benchmarks.md "First impressions"). huggingface_hub reads its settings from the environment
# as it loads, here the forkserver's, the server's as it started; a run's process never uses them: it reads and writes
# local folders only. Not faiss: it reads its thread count when it loads, which each process sets for itself
# (demo.runs.child).
PRELOADED_MODULES = ("demo.runs.child", "memvir.train.trainer", "memvir.models.embedding_model")


def _start_context():
    """multiprocessing's forkserver context, preloading PRELOADED_MODULES, on Linux; spawn elsewhere: macOS's
    system libraries are not safe to use in a process forked after they loaded (why Python spawns there by
    default), and Windows has no fork."""
    import torch.multiprocessing

    if sys.platform != "linux" or "forkserver" not in torch.multiprocessing.get_all_start_methods():
        return torch.multiprocessing.get_context("spawn")
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED_MODULES))
    return context


def prepare_run_processes() -> None:
    """Start the forkserver now, at the runs' priority (demo.common.cores.launch), so that the first Start need not
    wait for its imports: they run beside the server's own start. Returns at once; a no-op where there is none."""
    if _start_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        launch(forkserver.ensure_running)


class TrainingRefused(ValueError):
    """The run's process refused its settings, dataset or checkpoint (the Trainer's ValueError), or a live change."""


class TrainingProcessFailed(RuntimeError):
    """The run's process died, or failed for a reason other than its settings, before it was ready."""


@dataclass
class _Pending:
    """A live change waiting for its reply."""

    answered: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class RunProcess:
    """Starts the process at once; `wait_ready`, then `go` to train (or `stop` not to). `stop`, `pause`, `resume`
    and `update` steer it from any thread."""

    def __init__(self, spec: LaunchSpec, listener, name: str = "memvir-run"):
        context = _start_context()
        self._connection, child_end = context.Pipe()
        # imported at a run's start, not with this module, because it brings the trainer: app.py starts the
        # forkserver (prepare_run_processes) before the server imports the trainer, so that both import side by side
        from demo.runs import child as run_child

        self._process = context.Process(target=run_child.main, args=(child_end, spec), name=name, daemon=True)
        # at the training priority (demo.common.cores.yield_to_training): the forkserver, started then if not before,
        # gives its processes its own
        launch(self._process.start)
        child_end.close()  # so that the child's end closing (its death) reads as the end of the pipe here
        self.pid = self._process.pid
        self._folder = Path(spec.folder)
        self._listener = listener
        self._lock = threading.Lock()  # sends, and the go against the process's end
        self._ready_or_ended = threading.Event()
        self.ready: Ready | None = None
        self._crash: Crash | None = None
        self._last_word: str | None = None  # the ended state the Trainer reported, if it did
        self._last_step = 0
        self._went = False
        self._ended = False
        self._pending: dict[int, _Pending] = {}
        self._requests = itertools.count()
        self._events: queue.SimpleQueue = queue.SimpleQueue()  # the reader's to the deliverer's, None at the end
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._deliverer = threading.Thread(target=self._deliver, name=f"{name}-events", daemon=True)
        self._reader.start()
        self._deliverer.start()

    # ---------------------------------------------------------------------------------------------- steering
    def wait_ready(self) -> Ready:
        """Block until the Trainer is built (loading the dataset and the model takes a few seconds); its facts.
        TrainingRefused when its settings, dataset or checkpoint are refused; TrainingProcessFailed otherwise."""
        self._ready_or_ended.wait()
        if self.ready is not None:
            return self.ready
        if self._crash is not None and self._crash.refused:
            raise TrainingRefused(self._crash.message)
        if self._crash is not None:
            raise TrainingProcessFailed(f"the training process failed while starting ({self._crash.error})")
        raise TrainingProcessFailed(f"the training process {self._exit_reason()} while starting")

    def go(self) -> None:
        """Start training (after `wait_ready`); TrainingProcessFailed when the process died meanwhile."""
        with self._lock:
            if self._ended:
                raise TrainingProcessFailed(f"the training process {self._exit_reason()} while starting")
            self._went = True
            self._send((GO,))

    def stop(self) -> None:
        """Stop before the next step, saving a checkpoint; before the go, end the process instead."""
        with self._lock:
            self._send((STOP,))

    def pause(self) -> None:
        with self._lock:
            self._send((PAUSE,))

    def resume(self) -> None:
        with self._lock:
            self._send((RESUME,))

    def update(self, changes: dict, timeout: float = REPLY_TIMEOUT_S) -> None:
        """Ask the Trainer for live changes (Trainer.update); TrainingRefused with its reason when it refuses."""
        request = next(self._requests)
        pending = self._pending[request] = _Pending()
        with self._lock:
            sent = not self._ended and self._send((UPDATE, request, changes))
        try:
            if not sent:
                raise TrainingRefused("the run is no longer training")
            if not pending.answered.wait(timeout):
                raise TrainingProcessFailed(f"the training process did not answer within {timeout:.0f} s")
        finally:
            self._pending.pop(request, None)
        if pending.error is not None:
            raise TrainingRefused(pending.error)

    def _send(self, command: tuple) -> bool:
        """False when the process is gone (its event thread reports why)."""
        try:
            self._connection.send(command)
        except OSError:
            return False
        return True

    @property
    def alive(self) -> bool:
        """True until its run has ended: the Trainer's last word (finished, stopped, failed) has reached the listener,
        or the process is gone. A process may take a second to exit after its last word, its checkpoint saved: the
        run need not hold its training slot meanwhile."""
        return self._last_word is None and self._deliverer.is_alive()

    @property
    def exited(self) -> bool:
        """True once the process has exited and its every message has been handled."""
        return not self._deliverer.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait until it has `exited`."""
        self._deliverer.join(timeout)

    def kill(self) -> None:
        """End the process at once (no checkpoint): for a process that did not stop when asked."""
        self._process.kill()

    # ---------------------------------------------------------------------------------------------- the reader
    def _read(self) -> None:
        """Receive until the process has ended and everything it sent is read; events go to the deliverer."""
        run_in_background()
        try:
            while True:
                ready = wait([self._connection, self._process.sentinel])
                if self._connection not in ready and not self._connection.poll():
                    break  # the process ended and everything it sent has been read
                try:
                    messages = self._connection.recv()  # what the process sent in one go (demo.runs.child._Outbox)
                except (EOFError, OSError):
                    break
                for message in messages:
                    if isinstance(message, Ready | Reply | Crash):
                        self._handle(message)
                    else:
                        self._events.put(message)
        finally:
            self._process.join()
            self._events.put(None)

    def _deliver(self) -> None:
        """Hand the Trainer's events to the listener in the order they were sent; then end."""
        run_in_background()
        try:
            while (message := self._events.get()) is not None:
                event = snapshot_transport.from_message(message) if isinstance(
                    message, snapshot_transport.EventFile) else message
                self._tell(event)
                self._note(event)  # after the listener has it: a run is shown ended before it counts as ended
        finally:
            self._end()

    def _handle(self, message) -> None:
        if isinstance(message, Ready):
            self.ready = message
            self._last_step = message.step
            self._ready_or_ended.set()
        elif isinstance(message, Reply):
            pending = self._pending.get(message.request)
            if pending is not None:
                pending.error = message.error
                pending.answered.set()
        elif isinstance(message, Crash):
            if message.refused:  # its settings, dataset or checkpoint: the handler that started it logs the refusal
                log.info("training process %s refused its run: %s", self.pid, message.error.splitlines()[0])
            else:
                log.error("training process %s failed:\n%s", self.pid, message.trace)
            self._crash = message

    def _note(self, event) -> None:
        if isinstance(event, StepEvent):
            self._last_step = event.step
        elif isinstance(event, StatusEvent) and event.state in ENDED_STATES:
            self._last_word = event.state

    def _tell(self, event) -> None:
        try:
            self._listener(event)
        except Exception:  # noqa: BLE001 - a listener's bug must not stop the messages of the run
            log.exception("the listener of training process %s failed on %s", self.pid, type(event).__name__)

    def _end(self) -> None:
        """The process has ended: say how, if its Trainer did not, and clean up after it."""
        with self._lock:
            self._ended = True
            went = self._went
        self._ready_or_ended.set()
        for pending in list(self._pending.values()):
            pending.error = "the run ended before it took the change"
            pending.answered.set()
        snapshot_transport.remove_files(self._folder, self.pid)
        if went and self._last_word is None:
            self._report_failure()

    def _report_failure(self) -> None:
        crash = self._crash
        if crash is not None and crash.out_of_memory:
            reason = f"the run ran out of memory at step {self._last_step} ({crash.error})"
        elif crash is not None:
            reason = f"the run failed at step {self._last_step}: {crash.error}"
        else:
            reason = f"the training process {self._exit_reason()} at step {self._last_step}"
        run_folder = RunFolder(self._folder)
        saved = _checkpoint_step(run_folder.state_file)
        if saved is None:
            message = f"{reason}; it had saved no checkpoint yet"
        else:
            message = f"{reason}; its last checkpoint, at step {saved}, is kept"
        # the checkpoint it names makes the failed run resumable (LiveRun.resumable_failure)
        event = StatusEvent("failed", self._last_step, message,
                            checkpoint=None if saved is None else str(run_folder.state_file))
        if self._folder.is_dir():
            try:  # the Trainer would have logged it: the run folder tells how it ended, as the page does
                append_record(event.record(), run_folder.records_file)
            except (OSError, CheckpointError) as error:
                log.warning("run folder %s: the failure was not logged: %s", self._folder, error)
        self._tell(event)

    def _exit_reason(self) -> str:
        code = self._process.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            if -code == signal.SIGKILL:
                return f"was killed ({name}: the machine may have run out of memory, or it was ended from outside)"
            return f"was ended by {name}"
        return f"exited unexpectedly (exit code {code})"


def _checkpoint_step(path: Path) -> int | None:
    """The step of the checkpoint at `path`, None when there is none; its tensors are mapped, not read."""
    import torch

    if not path.is_file():
        return None
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:  # noqa: BLE001 - a damaged checkpoint counts as none
        return None
