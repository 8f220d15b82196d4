"""RunManager: the app's training runs, each a memvir Trainer in a process of its own, shared by every visitor.

Gradio's per-tab state is deep-copied and dies with the tab, so runs live here, at module level in the app: a closed
tab neither stops nor orphans a run, a reloaded page finds it again, and every visitor watches the same runs. A run
belongs to the visitor who started it (a key the browser keeps); others may watch it but not steer it. At most
`max_active_runs` train at once (one by default: runs on one device only slow each other down). What the page knows
of each run is a `LiveRun` (demo.runs.live_run); the process it trains in is a `RunProcess` (demo.runs.process), so
that training neither slows the server nor, when it dies, takes the server with it. What each page last chose to
show (Reset, Start, a pick from the runs' list) is kept here too (`PageChoices`), so that a handler that began before
the choice cannot undo it.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from demo.common.cores import training_threads
from demo.common.settings import AppSettings
from demo.runs import persist
from demo.runs.audience import Audience
from demo.runs.live_run import LiveRun
from demo.runs.messages import LaunchSpec
from demo.runs.process import RunProcess, TrainingRefused
from demo.umap.service import UmapService
from memvir.analysis.projection import project_snapshot
from memvir.checkpoint import CheckpointError, RunFolder
from memvir.config import LIVE_SETTINGS, TrainConfig
from memvir.data.registry import FOLDER_PREFIX

log = logging.getLogger(__name__)

# Settings that do not change what a run computes, so a finished baseline that differs only in these still fits: where
# it runs, how often it reports, and what its snapshots show (the classes drawn, the probe set).
_NEUTRAL_SETTINGS = ("num_workers", "device", "eval_every", "log_every", "snapshot_every", "checkpoint_every",
                     "focus_classes", "probe_classes")


class RunError(ValueError):
    """A run cannot be started or steered as asked; the message says why and what to do."""


class RunLimitReached(RunError):
    """Every training slot of this machine is taken."""


class NotRunOwner(RunError):
    """The run belongs to another visitor, who alone may steer it."""


def _finished_run_with(runs_dir: Path, config_dict: dict) -> Path | None:
    """A run folder whose configuration equals `config_dict` (up to settings that change nothing) and that
    finished, newest first."""
    wanted = {k: v for k, v in config_dict.items() if k not in _NEUTRAL_SETTINGS}
    if not runs_dir.is_dir():
        return None
    for folder in sorted(runs_dir.iterdir(), reverse=True):
        try:
            # through TrainConfig: a setting added since the folder was written reads as its default there
            saved = TrainConfig.from_run_folder(folder).to_dict()
        except CheckpointError:
            continue
        if {k: v for k, v in saved.items() if k not in _NEUTRAL_SETTINGS} != wanted:
            continue
        if RunFolder(folder).is_finished():
            return folder
    return None


# A run folder whose log ends in one of these was cut off by its server's end (a restart, SIGTERM, SIGKILL: a run's
# process that loses its server stops with a checkpoint) or the machine's, not by its own end.
_INTERRUPTED_STATES = ("running", "paused", "stopped")


def _interrupted_runs(runs_dir: Path, most: int) -> list[LiveRun]:
    """The newest `most` main runs that a previous server left unfinished in `runs_dir`, each with its checkpoint, as
    stopped runs that any visitor may resume (owner None: who started them was the previous server's to know)."""
    found = []
    for folder in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else ():
        if "-baseline-" in folder.name or not RunFolder(folder).has_state():
            continue  # a baseline is found again by Compare (`_finished_run_with`); no checkpoint: nothing to resume
        if RunFolder(folder).status() not in _INTERRUPTED_STATES:
            continue
        try:
            config = TrainConfig.from_run_folder(folder)
        except CheckpointError as error:
            log.warning("run folder %s not listed again: %s", folder, error)
            continue
        run = LiveRun.from_folder(folder, None, config, "main")
        run.started_at = RunFolder(folder).config_file.stat().st_mtime  # written as it started, not as read back
        steps = [r["step"] for r in run.records if r.get("type") == "step"]
        run.state, run.total_steps = "stopped", 0  # its total is its Trainer's to say, once resumed
        run.message = f"left at step {steps[-1] if steps else 0:,} by an earlier server; its last checkpoint is kept"
        found.append(run)
    return found[-most:] if most else []


def _run_name(config) -> str:
    dataset = re.sub(r"[^A-Za-z0-9-]+", "-", config.dataset.split(":")[0])
    memvir = "baseline" if config.memvir_n == 0 else f"memvir-n{config.memvir_n}-m{config.memvir_m}"
    if config.memvir_n and config.memvir_schedule != "curriculum":
        memvir += f"-{config.memvir_schedule}"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{dataset}-{config.loss}-{memvir}-{uuid.uuid4().hex[:4]}"


@dataclass(frozen=True)
class PageChoice:
    """What a page last chose to show, by Reset, Start or a pick from the runs' list: its run (None: the one
    `RunManager.attach` finds), the time it was reset at (only runs started since are found), and whether the run was
    picked (shown whatever else trains). `stamp` orders the choices: a later choice has a greater one."""

    stamp: int
    run_id: str | None = None
    after: float | None = None
    picked: bool = False


class PageChoices:
    """Each page's latest `PageChoice`, on the server, so that a handler that began before a choice cannot undo it.

    Gradio keeps a page's state on the server and writes a handler's returned state when the handler ends, whatever
    began first: a poll that read the state before Reset was pressed and ends after Reset wrote its own would write
    the old run back, and the page would show it again. So each state carries the stamp of the choice it follows, and
    the handlers follow the page's latest choice instead of a state whose stamp is older (demo.train.poll).

    A page is a gradio session (one browser tab), not a visitor: a Reset in one tab leaves the visitor's other tabs as
    they are, as each tab's state is its own. At most `kept` pages are remembered, the one that chose longest ago
    forgotten first: gradio keeps as many sessions' states (its state_session_capacity)."""

    def __init__(self, kept: int = 10_000):
        self._kept = kept
        self._lock = threading.Lock()
        self._latest: OrderedDict[str, PageChoice] = OrderedDict()
        self._stamps = itertools.count(1)

    def choose(self, page: str | None, run_id: str | None = None, after: float | None = None,
               picked: bool = False) -> PageChoice:
        """Note `page`'s new choice, stamped later than any before. Without a page (a client of the API, a test
        calling a handler) nothing is noted and the stamp is 0: there is nothing to order it against."""
        if page is None:
            return PageChoice(0, run_id, after, picked)
        with self._lock:
            choice = self._latest[page] = PageChoice(next(self._stamps), run_id, after, picked)
            self._latest.move_to_end(page)
            while len(self._latest) > self._kept:
                self._latest.popitem(last=False)
            return choice

    def latest(self, page: str | None) -> PageChoice | None:
        """`page`'s latest choice, or None where it made none (or has no page)."""
        if page is None:
            return None
        with self._lock:
            return self._latest.get(page)


class RunManager:
    """Starts, steers and finds runs; thread-safe. `project(snapshot, method, reference=)` makes the 2-D picture
    (memvir.analysis.projection.project_snapshot by default); `umap_worker` (a demo.umap.service.UmapService) computes
    UMAP in another process, one made on first use when settings.umap is on."""

    def __init__(self, settings: AppSettings, project=None, umap_worker=None):
        self.settings = settings
        self.threads = training_threads(settings.train_threads)  # torch's threads in each run's process
        self._project = project
        self._umap_worker = umap_worker
        self._lock = threading.RLock()
        self._runs: dict[str, LiveRun] = {}
        self.audience = Audience()  # the pages watching each run, and how often each polls
        self.pages = PageChoices()  # what each page last chose to show (Reset, Start, a pick)
        self.keeper = persist.RunKeeper(settings.persist_dir)  # runs kept past a restart, where settings say
        self.keeper.restore_into(settings.runs_dir)
        for run in _interrupted_runs(settings.runs_dir, settings.finished_runs_kept):
            self._runs[run.id] = run

    @property
    def umap_worker(self):
        """The UMAP service, or None when UMAP is off (created lazily: it starts a process that loads umap)."""
        if self._umap_worker is None and self.settings.umap:
            with self._lock:
                if self._umap_worker is None:
                    self._umap_worker = UmapService(training=self.training)
        return self._umap_worker

    def training(self) -> bool:
        """Whether some run trains now (not paused, not done): the UMAP process holds still meanwhile."""
        with self._lock:
            return any(not run.resting for run in self._runs.values())

    def _projector(self):
        if self._project is None:
            self._project = project_snapshot
        return self._project

    # ---------------------------------------------------------------------------------------------- finding runs
    def get(self, run_id: str | None) -> LiveRun | None:
        with self._lock:
            return self._runs.get(run_id) if run_id else None

    def runs(self) -> list[LiveRun]:
        """Main runs, oldest first."""
        with self._lock:
            return [run for run in self._runs.values() if run.kind == "main"]

    def busy_runs(self) -> list[LiveRun]:
        return [run for run in self.runs() if run.busy]

    def dataset_folders_in_use(self) -> list[Path]:
        """The `folder:` datasets of runs that train (baselines too): unpacked uploads that must stay on disk."""
        with self._lock:
            runs = list(self._runs.values())
        return [Path(run.config.dataset.removeprefix(FOLDER_PREFIX)) for run in runs
                if run.training and run.config.dataset.startswith(FOLDER_PREFIX)]

    def attach(self, visitor: str, viewed_id: str | None = None, after: float | None = None) -> LiveRun | None:
        """The run a page shows: the one it shows already, unless that is another visitor's, it rests and a newer
        one trains; else the visitor's own latest run (a reloaded page finds it again); else the latest run that
        trains. A page that shows its visitor's own run keeps it when it stops or ends (its owner reads the outcome,
        and may resume it), whatever others start. A page reset at time `after` shows only runs started since."""
        viewed = self.get(viewed_id)
        busy = [run for run in self.busy_runs() if after is None or run.started_at > after]
        newest_busy = busy[-1] if busy else None
        if viewed is not None:
            if (viewed.owner != visitor and not viewed.busy and newest_busy is not None
                    and newest_busy.started_at > viewed.started_at):
                return newest_busy
            return viewed
        if after is not None:
            return newest_busy
        own = [run for run in self.runs() if run.owner == visitor]
        if own and (own[-1].busy or newest_busy is None):
            return own[-1]
        if newest_busy is None:  # nothing trains: a run a restart interrupted, which anyone may resume
            orphaned = [run for run in self.runs() if run.owner is None]
            return orphaned[-1] if orphaned else None
        return newest_busy

    # ---------------------------------------------------------------------------------------------- control
    def start(self, config, visitor: str) -> LiveRun:
        """Validate `config`, start its Trainer in a process of its own and wait until it is built (its dataset and
        model loaded: the page shows the run as starting meanwhile); RunError, or the Trainer's own ValueError, if
        it cannot train."""
        config.validate()
        with self._lock:
            self._claim_slot(visitor)
            run_id = _run_name(config)
            run = LiveRun(run_id, visitor, self.settings.runs_dir / run_id, config)
            run.reserved = True
            self._runs[run_id] = run
            self._forget_old_runs()
        self._launch(run, self._spec(run, config.to_dict()), forget_on_failure=True)
        return run

    def _spec(self, run: LiveRun, config: dict | None, threads: int | None = None) -> LaunchSpec:
        """How to start `run`'s process: a new run of `config`, or with None, a resume of its folder."""
        return LaunchSpec(str(run.folder), config, threads or self.threads, self.settings.run_memory_limit,
                          self.settings.memory_budget)

    def _launch(self, run: LiveRun, spec: LaunchSpec, forget_on_failure: bool) -> None:
        """Start `run`'s process and wait until its Trainer is built, outside the manager's lock (pages keep
        polling), then let it train. Its Trainer refuses settings it cannot train (N and M past the memory budget
        its process measured among them: TrainingRefused). A failure ends the process and gives the slot back."""
        previous = run.starting(), run.process
        process = run.process = RunProcess(spec, self.keeper.listener(run), name=f"memvir-run-{run.id}")
        try:
            ready = process.wait_ready()
            run.launch(process, ready, self._projector(), self.settings.snapshot_history)
            process.go()
        except BaseException:
            process.stop()  # not started: the process ends without training
            (run.state, run.message), run.process = previous
            run.reserved = False
            if forget_on_failure:
                with self._lock:
                    self._runs.pop(run.id, None)
            raise

    def _claim_slot(self, visitor: str) -> None:
        busy = self.busy_runs()
        if len(busy) < self.settings.max_active_runs:
            return
        if any(run.owner == visitor for run in busy):
            raise RunLimitReached("your run is still training: stop it before starting another")
        raise RunLimitReached(
            f"another visitor's run is training, and this machine trains {self.settings.max_active_runs} run(s) at "
            "a time (MEMVIR_MAX_RUNS raises it). You can watch it here; start yours when it ends."
        )

    def _forget_old_runs(self) -> None:
        resting = [run for run in self._runs.values() if run.kind == "main" and not run.busy]
        for run in resting[: max(0, len(resting) - self.settings.finished_runs_kept)]:
            self._runs.pop(run.id, None)
            if run.baseline is not None:
                self._runs.pop(run.baseline.id, None)

    def _owned(self, run_id: str | None, visitor: str, claim: bool = False) -> LiveRun:
        """The run, if `visitor` may steer it; with `claim`, a run nobody owns (a restart interrupted it) becomes
        theirs."""
        run = self.get(run_id)
        if run is None:
            raise RunError("there is no run to control: press Start first")
        if claim and run.owner is None:
            run.owner = visitor
        if run.owner != visitor:
            raise NotRunOwner("this run was started by another visitor: you can watch it, but only they can "
                              "stop, pause or change it")
        return run

    def stop(self, run_id: str | None, visitor: str) -> LiveRun:
        run = self._owned(run_id, visitor)
        if not run.busy:
            raise RunError(f"the run is not training (it is {run.state})")
        for part in (run, run.baseline):
            if part is not None and part.process is not None:
                part.process.stop()
        return run

    def pause(self, run_id: str | None, visitor: str) -> LiveRun:
        run = self._owned(run_id, visitor)
        if not run.training:
            raise RunError(f"the run is not training (it is {run.state}), so it cannot pause")
        for part in (run, run.baseline):
            if part is not None and part.process is not None:
                part.process.pause()
        return run

    def resume(self, run_id: str | None, visitor: str) -> LiveRun:
        """Continue a paused run, or a stopped one (or one whose process died) from its checkpoint in a new process:
        same config, model, memory and step."""
        run = self._owned(run_id, visitor, claim=True)
        if run.training:
            for part in (run, run.baseline):
                if part is not None and part.process is not None:
                    part.process.resume()
            return run
        if not run.can_resume:
            raise RunError(f"the run {run.state} and has nothing to resume: press Start for a new run")
        with self._lock:
            self._claim_slot(visitor)
            run.reserved = True
        self._launch(run, self._spec(run, None), forget_on_failure=False)
        baseline = run.baseline
        if baseline is not None and baseline.can_resume:
            baseline.reserved = True
            self._launch(baseline, self._spec(baseline, None, self._baseline_threads()), forget_on_failure=False)
        return run

    def update(self, run_id: str | None, visitor: str, changes: dict, page: str | None = None) -> LiveRun:
        """Ask the running trainer for live changes ({setting: value} of memvir.config.LIVE_SETTINGS), applied before
        its next step (the run's ControlEvent says at which). Its Trainer checks them (TrainConfig's ranges, MemVir's
        memory against its limit) and refuses what does not fit with its reason (RunError); the run trains on as it
        was. `page`: the page that asks (its session; None for a client of the API), whose own change is not sent
        back to it once applied (LiveRun.last_asks)."""
        unknown = sorted(set(changes) - set(LIVE_SETTINGS))
        if unknown:
            raise RunError(f"{', '.join(unknown)} cannot change while a run trains; live settings: "
                           f"{', '.join(LIVE_SETTINGS)}")
        run = self._owned(run_id, visitor)
        if run.ready is None or not run.training:
            raise RunError(f"the run is not training (it is {run.state}); the new values apply to the next Start")
        self._ask(run, changes, page=page)
        return run

    @staticmethod
    def _ask(run: LiveRun, changes: dict, note: bool = True, page: str | None = None) -> None:
        """Send live changes to a run's process, noted as pending first (its answer may arrive before the reply);
        `note`: a refusal is said beside the live controls (the classes shown have a note of their own)."""
        before = run.asked(changes, page)
        try:
            run.process.update(changes)
        except TrainingRefused as error:
            run.withdraw(changes, before)
            with run.lock:
                live = run.live_values
                kept = f"The run trains on with N = {live['memvir_n']} and M = {live['memvir_m']}."
            said = str(error) if str(error).endswith(".") else f"{error}."
            if note:
                run.refused(changes, f"{said} {kept}")
            raise RunError(f"{said} {kept}") from None
        except BaseException:
            run.withdraw(changes, before)
            raise

    def show_classes(self, run_id: str | None, visitor: str, classes: list[int]) -> LiveRun:
        """Ask the running trainer for another few-class view (its snapshots' focus classes; [] = its own pick),
        from its next snapshot on."""
        run = self._owned(run_id, visitor)
        if run.ready is None or not run.training:
            raise RunError(f"the run is not training (it is {run.state}); the classes apply to the next Start")
        self._ask(run, {"focus_classes": list(classes)}, note=False)
        return run

    def compare_with_baseline(self, run_id: str | None, visitor: str, settings: dict | None = None) -> LiveRun:
        """Overlay the same configuration without MemVir (N = 0), with `settings` (TrainConfig fields: the
        baseline's own tuned optimiser, where the caller has one) in place of the run's: loaded when such a run
        finished before, else trained beside the run (it shares the run's training slot)."""
        run = self._owned(run_id, visitor)
        if run.baseline is not None:
            return run.baseline
        if run.config.memvir_n == 0:
            raise RunError("this run is a baseline already (N = 0): start one with N > 0 to compare")
        # Its snapshots are not drawn: no probe embedding or projection work for them.
        config = TrainConfig.from_dict({**run.config.to_dict(), **(settings or {}), "memvir_n": 0,
                                        "snapshot_every": 0})
        finished = _finished_run_with(self.settings.runs_dir, config.to_dict())
        with self._lock:
            if finished is not None:
                run.baseline = LiveRun.from_folder(finished, visitor, config, "baseline")
                return run.baseline
            if not run.busy:
                self._claim_slot(visitor)
            baseline_id = _run_name(config)
            baseline = LiveRun(baseline_id, visitor, self.settings.runs_dir / baseline_id, config, "baseline")
            baseline.reserved = True
            self._runs[baseline_id] = baseline
            run.baseline = baseline
        try:
            self._launch(baseline, self._spec(baseline, config.to_dict(), self._baseline_threads()),
                         forget_on_failure=True)
        except BaseException:
            run.baseline = None
            raise
        return baseline

    def _baseline_threads(self) -> int:
        """A baseline trains beside its run, on the cores the run already uses: half as many threads."""
        return max(1, self.threads // 2)

    def close(self, timeout: float = 30.0) -> None:
        """Stop every run and wait for their processes, which save a checkpoint (app shutdown, tests); a process
        still running after `timeout` seconds is killed."""
        with self._lock:
            runs = [run for run in self._runs.values() if run.process is not None]
        for run in runs:
            run.process.stop()
        deadline = time.monotonic() + timeout
        for run in runs:
            run.join(max(0.0, deadline - time.monotonic()))
        for run in runs:
            if not run.process.exited:
                run.process.kill()
                run.join(5.0)
        self.keeper.wait(deadline)  # the runs this stop saved, kept past the container's end
        if self._umap_worker is not None:
            self._umap_worker.close()
