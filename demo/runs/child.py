"""Inside a run's training process: the same memvir Trainer the CLI drives, steered over a pipe by the server.

The server (demo.runs.process) starts this module's `main` in a process forked from its forkserver, which has
imported torch and the Trainer once, before any thread or OpenMP pool of theirs exists (a fresh interpreter, the
spawn start method, off Linux). The
main thread builds the Trainer, says `Ready`, waits for the server's go and runs it; a second thread obeys the
server's commands as they come (Stop, Pause, Resume, live changes) through the Trainer's thread-safe controls; a
third sends the Trainer's events up in order, so that a step never waits on the pipe or on a snapshot file. The
server's going away (its end of the pipe closes) stops the run, which saves a checkpoint, as a Stop does.

The thread count is set first: faiss reads it when it loads, and torch takes it from `torch.set_num_threads`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import traceback
from pathlib import Path

from demo.common.cores import run_in_background
from demo.runs.live_changes import refusal_words
from demo.runs.memory_budget import memory_budget
from demo.runs.messages import GO, PAUSE, RESUME, STOP, UPDATE, ClassNames, Crash, LaunchSpec, Ready, Reply
from demo.runs.snapshot_transport import to_message
from memvir.config import TrainConfig
from memvir.memory.size import MemoryLimitError
from memvir.train.checks import TrainingDiverged
from memvir.train.devices import pick_device
from memvir.train.trainer import Trainer

SEND_EVERY_S = 0.5  # the outbox's pace (`_Outbox`)
_CLOSE = object()


def main(connection, spec: LaunchSpec) -> None:
    # the server's environment now, not the forkserver's when it started; OpenMP reads its thread count from it when
    # faiss's runtime loads, which has not happened yet
    os.environ.clear()
    os.environ.update(spec.environment)
    os.environ["OMP_NUM_THREADS"] = str(spec.threads)
    # Ctrl-C in the server's terminal reaches this process too; the server stops the run (with a checkpoint)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    outbox = _Outbox(connection, Path(spec.folder))
    commands = _Commands(connection, outbox)
    # A terminate (the server exiting without stopping it) stops the run as a Stop does, checkpoint included
    signal.signal(signal.SIGTERM, lambda *_: commands.obey((STOP,)))
    commands.start()
    trainer = None
    try:
        if spec.memory_limit is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (spec.memory_limit, spec.memory_limit))
        import torch

        torch.set_num_threads(spec.threads)

        listeners = [outbox.put]
        config = TrainConfig.from_dict(spec.config) if not spec.resume else None
        budget = _memory_budget(spec, config)
        commands.budget = budget
        limit = None if budget is None else budget.bytes
        try:
            if spec.resume:
                trainer = Trainer.from_run_folder(spec.folder, listeners, max_memory_bytes=limit)
            else:
                trainer = Trainer(config, spec.folder, listeners, max_memory_bytes=limit)
        except MemoryLimitError as error:
            raise MemoryLimitError(within_budget(error, budget)) from None
        outbox.put(Ready(step=trainer.step, total_steps=trainer.total_steps, history=list(trainer.history),
                         config=trainer.config.to_dict(), num_classes=int(trainer.class_weights.shape[0]),
                         dim=int(trainer.class_weights.shape[1]), device=str(trainer.device),
                         threads=torch.get_num_threads(),
                         class_names=ClassNames(tuple(map(str, trainer.data.train.class_names)),
                                                tuple(map(str, trainer.data.test.class_names)))))
        if commands.wait_for_go(trainer):
            try:
                trainer.run()
            except TrainingDiverged:
                pass  # the Trainer said so in a 'failed' StatusEvent
    except BaseException as error:  # noqa: BLE001 - reported to the server, which logs it and shows it on the page
        outbox.put(_crash(error, None if trainer is None else trainer.step))
    finally:
        outbox.close()


def _memory_budget(spec: LaunchSpec, config):
    """What MemVir's memory may take in this process (demo.runs.memory_budget), measured here, where the run trains:
    on a GPU the device's free memory is asked for by the process that holds the device, never by the server.
    `config`: the run's TrainConfig, None for a resume (its folder's)."""
    if config is None:
        config = TrainConfig.from_run_folder(spec.folder)
    return memory_budget(spec.memory_budget, pick_device(config.device))


def within_budget(error: Exception, budget) -> str:
    """The library's refusal of N and M past the memory limit, with where this run's limit came from (its budget);
    the refusal itself, with its sizes and the float16 memory it offers, is the library's alone."""
    if budget is None:
        return str(error)
    return f"{error}. Here the limit is the run's memory budget, {budget.source}."


def _crash(error: BaseException, step: int | None) -> Crash:
    text = f"{type(error).__name__}: {error}"
    lowered = str(error).lower()
    out_of_memory = isinstance(error, MemoryError) or "can't allocate memory" in lowered or "out of memory" in lowered
    return Crash(step=step, error=text, message=refusal_words(error), refused=isinstance(error, ValueError),
                 out_of_memory=out_of_memory, trace=traceback.format_exc())


class _Outbox:
    """Sends to the server from a thread of its own, in order: the training thread only queues, so a full pipe, a
    busy server or a snapshot file being written never holds up a step.

    An event that comes after a quiet spell goes at once (Ready, a run's first step, a reply to a live change); after
    each send the thread rests SEND_EVERY_S, and what came meanwhile goes as one message (a list). A training run
    takes several steps a second: one message per step would wake this thread, and the server's reader at the other
    end, at each, and on a machine whose every core trains each wake-up takes a core from a training thread for a
    moment (docs/benchmarks.md). A page polls once a second, so a step shown up to SEND_EVERY_S later changes
    nothing it sees. A reply to a live change cuts the rest short: a visitor waits for it, and a visitor's changes
    are answered one at a time, so a reply held back for the rest would make a flood of them wait in line."""

    def __init__(self, connection, run_folder: Path):
        self._connection = connection
        self._run_folder = run_folder
        self._outbox = queue.SimpleQueue()
        self._urgent = threading.Event()  # a reply or the close is queued: the rest ends
        self._thread = threading.Thread(target=self._send_all, name="memvir-outbox")
        self._thread.start()

    def put(self, item) -> None:
        self._outbox.put(item)
        if isinstance(item, Reply):
            self._urgent.set()

    def _send_all(self) -> None:
        run_in_background()
        gone = False  # the server closed its end: nothing more can reach it
        while True:
            batch = [self._outbox.get()]  # waits only when nothing is queued
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._outbox.get_nowait())
            closing = any(item is _CLOSE for item in batch)
            messages = [] if gone else [message for item in batch if item is not _CLOSE
                                        and (message := self._message(item, to_message)) is not None]
            if messages:
                try:
                    self._connection.send(messages)
                except OSError:
                    gone = True
            if closing:
                return
            self._urgent.wait(SEND_EVERY_S)  # the rest; a reply or a close cuts it short
            self._urgent.clear()

    def _message(self, item, to_message):
        """What goes into the pipe for `item` (a snapshot's file written now); None if it could not be made."""
        try:
            return to_message(item, self._run_folder)
        except Exception as error:  # noqa: BLE001 - e.g. a full disk: that snapshot is lost, the run goes on
            print(f"memvir run process: {type(item).__name__} not sent: {error}", file=sys.stderr)
            return None

    def close(self) -> None:
        """Send what is queued, then stop the thread."""
        self._urgent.set()
        self._outbox.put(_CLOSE)
        self._thread.join()


class _Commands(threading.Thread):
    """Obeys the server's commands. Before the go, a Stop means: do not start (the server refused the run, or its
    visitor stopped it while it was starting); Pause, Resume and changes that arrive before the Trainer exists wait
    for it."""

    def __init__(self, connection, outbox: _Outbox):
        super().__init__(name="memvir-commands", daemon=True)
        self._connection = connection
        self._outbox = outbox
        self._lock = threading.RLock()  # the SIGTERM handler may obey while the main thread holds it
        self._decided = threading.Event()
        self._go = False
        self._trainer = None
        self._early: list[tuple] = []
        self.budget = None  # the run's memory budget (demo.runs.memory_budget.Budget), once measured

    def run(self) -> None:
        while True:
            try:
                command = self._connection.recv()
            except (EOFError, OSError):  # the server is gone: stop, saving a checkpoint
                self.obey((STOP,))
                return
            self.obey(command)

    def wait_for_go(self, trainer) -> bool:
        """Hand the Trainer over and wait for the server's word: True to run it."""
        with self._lock:
            self._trainer = trainer
            early, self._early = self._early, []
        for command in early:
            self.obey(command)
        self._decided.wait()
        return self._go

    def obey(self, command: tuple) -> None:
        name, *arguments = command
        with self._lock:
            if name == GO or (name == STOP and not self._decided.is_set()):
                self._go = name == GO
                self._decided.set()
                return
            trainer = self._trainer
            if trainer is None:
                self._early.append(command)
                return
        if name == STOP:
            trainer.stop()
        elif name == PAUSE:
            trainer.pause()
        elif name == RESUME:
            trainer.resume_training()
        elif name == UPDATE:
            request, changes = arguments
            try:
                trainer.update(**changes)
            except MemoryLimitError as error:  # MemVir's limit: this process's memory budget
                self._outbox.put(Reply(request, within_budget(error, self.budget)))
            except ValueError as error:  # the Trainer's own checks: a setting out of range
                self._outbox.put(Reply(request, refusal_words(error)))
            else:
                self._outbox.put(Reply(request, None))
