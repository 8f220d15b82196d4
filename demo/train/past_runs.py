"""The Train tab's "Runs on this server": the runs this server keeps (training, paused, finished, stopped, and those an
earlier server left stopped: RunManager.runs()), newest first, each named by what it is (state, settings, whose,
when it started, its name), and the handlers behind the list (`PastRunsHandlers`).

Picking a run shows it as a watcher sees it: the page's poll follows the run picked (`PollState.picked`,
demo.train.poll.shown_run) rather than the visitor's latest, with its curves, snapshots and results table; under the
list, its final figures and, where its folder holds a model, the model's files (config, weights and model card) to
download. The buttons act on it only where the visitor may steer it, as on any run shown. A run picked while it
trains is followed as the visitor's own is: its status, curves and results table by the polls, and its final figures
and model under the list by the second poll when it ends (`picked_view`). The first choice, `FOLLOW`, gives the page
its usual run back (the visitor's own latest, else the latest that trains), as Start does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import gradio as gr

from demo.common.handlers import visitor_key
from demo.retrieve.downloads import write_zip
from demo.runs.live_run import LiveRun
from demo.runs.manager import RunManager
from demo.train.live_view import STATE_LABELS
from demo.train.poll import PollState, chosen_state, current_state
from demo.train.results_table import METRICS, SPLITS, final_metrics, percent
from memvir.checkpoint import HUB_FILES

FOLLOW = "follow"
FOLLOW_LABEL = "My run, else the latest that trains"  # fits its box on a 390 px phone
NOTHING_PICKED = ""


def started_words(run: LiveRun) -> str:
    """When the run started, in the server's time: '06 Dec 10:15'."""
    return time.strftime("%d %b %H:%M", time.localtime(run.started_at))


def settings_words(run: LiveRun) -> str:
    """'glyphs-mini, cosface, N = 4, M = 10, 12 epochs' (N and M as its live changes left them), or '..., baseline
    (N = 0), ...'."""
    config = run.config
    with run.lock:
        live = dict(run.live_values)
    memvir = (f"N = {live['memvir_n']}, M = {live['memvir_m']}" if live["memvir_n"] else "baseline (N = 0)")
    epochs = f"{config.epochs} epoch" + ("s" if config.epochs != 1 else "")
    return f"{config.dataset}, {config.loss}, {memvir}, {epochs}"


def whose(run: LiveRun, visitor: str) -> str:
    if run.owner is None:
        return "left by an earlier server"
    return "yours" if run.owner == visitor else "another visitor's"


def run_label(run: LiveRun, visitor: str) -> str:
    """The list's line for a run: 'Finished · glyphs-mini, cosface, N = 4, M = 10, 12 epochs · yours · started
    06 Dec 10:15 · <its name>'. State first: a phone shows the line's start."""
    return (f"{STATE_LABELS.get(run.state, run.state)} · {settings_words(run)} · {whose(run, visitor)} · "
            f"started {started_words(run)} · {run.id}")


def newest_first(runs: RunManager) -> list[LiveRun]:
    return sorted(runs.runs(), key=lambda run: run.started_at, reverse=True)


def run_choices(runs: RunManager, visitor: str) -> list[tuple[str, str]]:
    """The list's choices: following the usual run, then every run the server keeps, newest first."""
    return [(FOLLOW_LABEL, FOLLOW), *((run_label(run, visitor), run.id) for run in newest_first(runs))]


def final_table(run: LiveRun) -> str:
    """The run's last evaluation as a markdown table (test, then validation), or "" before it has one."""
    with run.lock:
        final = final_metrics(run.records)
    if final is None:
        return ""
    rows = [f"| {name} ({split}) | {percent(final[prefix + key])} |"
            for prefix, split in SPLITS for key, name in METRICS if prefix + key in final]
    return "\n".join([f"**Its last evaluation** (step {final['step']:,}, %)", "", "| metric | this run |",
                      "|---|---:|", *rows])


def summary_markdown(run: LiveRun, visitor: str) -> str:
    """What the list says under itself of the run picked: whose it is and what the buttons may do with it, and its
    last evaluation."""
    if run.owner == visitor or (run.owner is None and run.can_resume):
        acting = "your buttons act on it"
    else:
        acting = "another visitor's run: you watch it, only they may steer or push it"
    lines = [f"Showing `{run.id}` ({acting}). Pick the first line to follow your own run again."]
    table = final_table(run)
    if table:
        lines += ["", table]
    elif run.training:
        lines.append("Its final figures and its model come here when it ends.")
    return "\n".join(lines)


def steps_done(run: LiveRun) -> int:
    """The last step the run trained: its latest step event's, else (a run read back from its folder) its log's.
    Read under the run's lock."""
    if run.last_step is not None:
        return run.last_step.step
    return max((record["step"] for record in run.records if record.get("type") == "step"), default=0)


def has_model(run: LiveRun) -> bool:
    """Whether the run rests with a model in its folder (config.json, model.safetensors and its model card: a run
    saves them at its checkpoints and at its end)."""
    return not run.training and all((run.folder / name).is_file() for name in HUB_FILES)


def model_zip(runs: RunManager, run: LiveRun):
    """The run's model as a zip (config.json, model.safetensors and its model card, README.md) in the app's downloads
    folder, or None while it has none to offer (`has_model`)."""
    if not has_model(run):
        return None
    settings = runs.settings
    try:
        return write_zip(run.folder, settings.downloads_dir, settings.max_downloads_bytes, settings.max_upload_age_s)
    except (ValueError, OSError):  # a folder changed under it (a resumed run saving): offered again at the next pick
        return None


def picked_view(runs: RunManager, state: PollState, run: LiveRun | None, visitor: str, sent: tuple | None):
    """(the words under the list, its model's download, what was sent: the words and whether a model was) for the
    page's second poll, which follows the run shown as it trains and ends: a run picked while it trained gets its
    final figures and its model there when it ends, without a pick again. Skips while the words and whether a model
    is offered are those `sent` (the model is zipped only when they change). The model may come a moment after the
    words: a page is shown a run's finished status, and its last evaluation, before the run counts as ended
    (demo.runs.process notes its last word after the listener has it), and its model is offered once it does
    (`has_model`; the views key changes then: demo.train.poll.views_key). No run picked, nothing under the list."""
    picked = state.picked and run is not None and run.id == state.run_id
    words = summary_markdown(run, visitor) if picked else NOTHING_PICKED
    now = (words, picked and has_model(run))
    if now == sent:
        return gr.skip(), gr.skip(), sent
    archive = model_zip(runs, run) if now[1] else None
    download = gr.update(value=None, visible=False) if archive is None else gr.update(value=str(archive), visible=True)
    return words, download, (words, archive is not None)  # a zip that failed is tried again at the next second poll


class PastRunsHandlers:
    """The list's handlers, bound to the runs (a `RunManager`): filling the list, and picking from it. The page wires
    the bound methods; tests call them the same way."""

    def __init__(self, runs: RunManager):
        self.runs = runs

    def listed(self, state: PollState, visitor=None, request: gr.Request = None):
        """The list as it is now (on the page's load, when it is opened, after Start and Reset), showing what the page
        shows: the run picked, else `FOLLOW`."""
        visitor = visitor_key(visitor, request)
        state = current_state(self.runs, state, request)
        choices = run_choices(self.runs, visitor)
        value = state.run_id if state.picked and self.runs.get(state.run_id) is not None else FOLLOW
        return gr.update(choices=choices, value=value)

    def pick(self, state: PollState, choice, visitor=None, request: gr.Request = None):
        """(the page's state, "follow the latest snapshot", the words under the list, the model's download): the run
        picked shown from the next poll on, its latest snapshot followed; `FOLLOW`, or the run the page would show
        anyway, the page's usual run again. Either is noted on the server (chosen_state): a poll that began before the
        pick and ends after it follows it."""
        visitor = visitor_key(visitor, request)
        state = current_state(self.runs, state, request)
        no_download = gr.update(value=None, visible=False)
        usual = self.runs.attach(visitor, None, after=state.after)
        if choice in (None, "", FOLLOW) or (usual is not None and choice == usual.id):
            return chosen_state(self.runs, request, after=state.after), True, NOTHING_PICKED, no_download
        run = self.runs.get(choice) if isinstance(choice, str) else None
        if run is None or run.kind != "main":
            return (state, gr.skip(), f"⚠️ There is no run {str(choice)[:80]!r} on this server any more (it keeps "
                    f"the latest {self.runs.settings.finished_runs_kept} that rest): open the list again and pick "
                    "another.", gr.skip())
        archive = model_zip(self.runs, run)
        download = no_download if archive is None else gr.update(value=str(archive), visible=True)
        picked = chosen_state(self.runs, request, run.id, state.after, picked=True)
        return picked, True, summary_markdown(run, visitor), download


@dataclass(frozen=True)
class PastRuns:
    """The list, the words under it and the model's download."""

    choice: gr.Dropdown
    summary: gr.Markdown
    download: gr.DownloadButton


def build() -> PastRuns:
    """The list and what goes under it (their events are wired by demo.train.tab, which has the page's state)."""
    with gr.Column(elem_id="past-runs"):
        choice = gr.Dropdown([(FOLLOW_LABEL, FOLLOW)], value=FOLLOW, label="Runs on this server",
                             info="Pick one to see its curves, snapshots and results; newest first.",
                             elem_id="past-runs-choice")
        summary = gr.Markdown(NOTHING_PICKED, elem_id="past-run-summary", elem_classes="small-note")
        download = gr.DownloadButton("Download its model (config, weights, model card)", size="sm", visible=False,
                                     elem_id="past-run-download")
    return PastRuns(choice, summary, download)
