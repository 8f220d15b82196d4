"""The Train tab's live view: `PollState`, what one page was last sent, and the handlers that keep the view current
(`PollHandlers`, bound to the runs and the figures): the poll (every second), scrubbing the snapshots, and recolouring
them (or switching between the few-class view and all classes: `color_by` is one of live_view.PICTURES). The
spread curves and the results table have a poll of their own (demo.train.views), which the page sends only when the
poll's views key says they changed: the poll then starts the page's views timer, which sends it once.

A poll sends the status line always and a figure only when what it shows changed (gr.skip otherwise): the figures
are large and most polls find nothing new. The figures themselves come ready from the `FigureBuilder`
(demo.train.live_view), shared by every page watching a run.

What a page chose to show (Reset, Start, a pick from the runs' list) is kept on the server too (RunManager.pages):
gradio writes a handler's returned state when it ends, so a poll that read the state before a Reset and ended after
it would write the old run back. Every handler that reads or returns a `PollState` takes it through `current_state`,
which follows the page's latest choice over a state that does not know of it; the poll checks again as it ends
(`PollHandlers.poll`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import gradio as gr

from demo.common.handlers import visitor_key
from demo.runs.audience import POLL_SECONDS
from demo.runs.manager import RunManager
from demo.train import live_view
from demo.train.live_view import FigureBuilder
from demo.train.results_table import results_key

# What a poll sends the page's views timer when the views key changed: start, and send the second poll at the tick
VIEWS_DUE = gr.update(active=True)


@dataclass(frozen=True)
class CurvesSent:
    """The curve figures a page was sent: a run's at its curve key (live_view.curve_key), or the empty ones."""

    key: tuple | None  # None: no run, the empty figures


@dataclass(frozen=True)
class EmbeddingSent:
    """What a page's embedding view was sent."""

    run_id: str | None  # None: no run, the empty picture and the slider back at its start
    snapshot: tuple | None = None  # the snapshot key drawn (the run's id and snapshot version); None: none yet
    color_by: str | None = None
    following: bool = True  # False: only the scrub slider's new range; the picture stays the one scrubbed to


@dataclass(frozen=True)
class ControlsSent:
    """What a page's live controls (the note beside them, then N, M and the warm-up: `LIVE_SLIDERS`)
    were last sent of a run."""

    run_id: str | None  # None: no run, nothing sent
    note: str = ""
    # the run's live values shown; None: left as the visitor set them (no training run; one value: its change pending)
    values: tuple | None = None
    interactive: bool = True  # False: another visitor's run trains, shown read-only


@dataclass(frozen=True)
class PollState:
    """One page's Train tab (a gr.State, per browser tab): the run it shows, and what its views were last sent."""

    run_id: str | None = None  # the run shown; the buttons act on it
    after: float | None = None  # set by Reset: only runs started since are shown
    picked: bool = False  # the visitor picked `run_id` from the runs on this server: shown whatever else trains
    curves: CurvesSent | None = None  # None: nothing sent yet
    embedding: EmbeddingSent | None = None  # None: nothing sent yet
    controls: ControlsSent | None = None  # None: nothing sent yet
    scrubbed_step: int | None = None  # the step the scrub slider was moved to (shown while not following)
    views: str | None = None  # the views key at the page's last start of its views timer (views_key); None: none yet
    interval: float = POLL_SECONDS  # the page's poll interval as last sent (demo.runs.audience)
    chosen: int = 0  # the stamp of the page's latest choice this state follows (demo.runs.manager.PageChoices)


# A page's choices come from its visitor's clicks: more than this many during one poll's milliseconds are a client's,
# and the page's next poll follows the latest of them.
CHOICES_FOLLOWED_PER_POLL = 3


def page_of(request: gr.Request | None) -> str | None:
    """The page asking: its gradio session (one browser tab, whose state is its own); None without one."""
    return getattr(request, "session_hash", None)


def current_state(runs: RunManager, state: PollState, request: gr.Request | None) -> PollState:
    """`state`, unless its page chose since (Reset, Start, a pick: RunManager.pages) and a handler that began before
    the choice wrote it over the choice's state: then the choice's state (its run, reset time and pick; nothing sent
    yet of its views, which the poll then sends)."""
    page = page_of(request)
    if page is None:  # a caller without a page (a test, a client of the API) made no choice to follow
        return state
    choice = runs.pages.latest(page)
    if choice is None or choice.stamp <= state.chosen:
        return state
    return PollState(run_id=choice.run_id, after=choice.after, picked=choice.picked, interval=state.interval,
                     chosen=choice.stamp)


def chosen_state(runs: RunManager, request: gr.Request | None, run_id: str | None = None, after: float | None = None,
                 picked: bool = False) -> PollState:
    """The state of the page's new choice (Reset, Start, a pick), noted on the server first, so that a handler that
    began before it follows it (`current_state`)."""
    choice = runs.pages.choose(page_of(request), run_id, after, picked)
    return PollState(run_id=choice.run_id, after=choice.after, picked=choice.picked, chosen=choice.stamp)


class PollHandlers:
    """The live view's handlers, bound to the runs (a `RunManager`) and the `FigureBuilder` that draws them: the poll,
    scrubbing and recolouring. demo.train.views wires the bound methods; tests call them the same way."""

    def __init__(self, runs: RunManager, figures: FigureBuilder):
        self.runs = runs
        self.figures = figures

    def poll(self, state: PollState, color_by, follow, visitor=None, request: gr.Request = None):
        """Every second: status line always; figures only when what they show changed (gr.skip otherwise); and,
        when the views key changed, the views timer started, which sends the page's second poll (demo.train.views).
        """
        visitor = visitor_key(visitor, request)
        for _ in range(CHOICES_FOLLOWED_PER_POLL):
            state = current_state(self.runs, state, request)
            answer = self._answer(state, color_by, follow, visitor, request)
            if current_state(self.runs, state, request) is state:  # no choice made while it drew
                break
        return answer

    def _answer(self, state: PollState, color_by, follow, visitor: str, request: gr.Request | None):
        """One poll's answer for `state`."""
        run = shown_run(self.runs, state, visitor)
        _use_umap(self.runs, run, color_by)
        interval, pages = self.runs.audience.interval(run, visitor)
        # the note beside the controls read before the status line: a change the note calls applied is in the
        # status line of the same answer (read the other way round, a change applied between the two reads was
        # 'applied' beside the controls and missing from the status line until the next poll)
        controls, sent_controls = _controls(run, visitor, state.controls, getattr(request, "session_hash", None))
        status = live_view.status_markdown(run, visitor) + crowd_note(interval, pages)
        curves, sent_curves = _curves(self.figures, run, state.curves)
        (embedding, caption, slider), sent_embedding = _embedding(self.figures, run, state.embedding, color_by,
                                                                  follow)
        views = views_key(self.figures, run)
        new_state = dataclasses.replace(state, run_id=run.id if run else state.run_id, curves=sent_curves,
                                        embedding=sent_embedding, controls=sent_controls, views=views,
                                        interval=interval)
        timer = gr.update(value=interval) if interval != state.interval else gr.skip()
        views_due = VIEWS_DUE if views != state.views else gr.skip()
        return new_state, status, *controls, *curves, embedding, caption, slider, timer, views_due

    def show_snapshot(self, state: PollState, step, color_by, request: gr.Request = None):
        """(state, picture, caption, "follow the latest", the scrub slider): the snapshot kept at or before the
        scrubbed step, the slider moved onto the step it shows where it was let go between kept snapshots (the
        caption says why: only some are kept, `scrub_note`); scrubbing back stops following the latest."""
        state = current_state(self.runs, state, request)
        run = self.runs.get(state.run_id)
        figure, caption = live_view.embedding_view(run, step, color_by)
        _, last = live_view.snapshot_range(run)
        kept = kept_steps(run, color_by)
        shown = next((kept_step for kept_step in reversed(kept) if kept_step <= step), kept[0] if kept else None)
        if shown is None or shown == step:
            return dataclasses.replace(state, scrubbed_step=step), figure, caption, step >= last, gr.skip()
        caption += scrub_note(run, kept, step, shown)
        return dataclasses.replace(state, scrubbed_step=shown), figure, caption, step >= last, shown

    def recolor(self, state: PollState, follow, color_by, step=None, request: gr.Request = None):
        """The snapshot shown (the latest, or the one scrubbed to: `step`, the scrub slider's value) in the other
        picture. The slider's value is the one to trust: a poll that started before the scrub returns the state it
        read, without the scrubbed step."""
        run = self.runs.get(current_state(self.runs, state, request).run_id)
        _use_umap(self.runs, run, color_by)
        scrubbed = step if step is not None else state.scrubbed_step
        return live_view.embedding_view(run, None if follow else scrubbed, color_by)


def kept_steps(run, color_by) -> list[int]:
    """The steps of the snapshots `run` keeps for the picture `color_by` (the few-class views' own track, or the
    all-classes snapshots: both thinned alike), oldest first; none without a run."""
    if run is None:
        return []
    if color_by in live_view.FEW_CLASS_PICTURES:
        return run.few_classes.steps()
    with run.lock:
        return [view.step for view in run.snapshots]


def scrub_note(run, kept: list[int], asked: int, shown: int) -> str:
    """What the caption adds when the scrub slider was let go at `asked` and the picture shows the kept snapshot at or
    before it (`shown`; the first kept, before them all): which, and why there is none at `asked`. A run keeps at most
    a set number of snapshots (AppSettings.snapshot_history) and thins the older ones out as it goes on."""
    every = run.config.snapshot_every
    if shown > asked:
        return f"  \nNo snapshot is kept before step {asked:,}: shown, the first kept (step {shown:,})."
    later = [step for step in kept if step > shown]
    gap = later[0] - shown if later else every
    if every and gap > every:
        kept_words = (f"of the snapshots taken every {every} steps, one in {gap // every} is kept here: the older "
                      "ones thin out as the run goes on")
    else:
        kept_words = f"a snapshot every {every} steps"
    return f"  \nNearest kept snapshot before step {asked:,}: step {shown:,} ({kept_words})."


def shown_run(runs: RunManager, state: PollState, visitor: str):
    """The run a page shows: the one its visitor picked from the runs on this server (demo.train.past_runs) while the
    server keeps it; else the one RunManager.attach finds (the visitor's own latest, else the latest that trains)."""
    if state.picked:
        picked = runs.get(state.run_id)
        if picked is not None:
            return picked
    return runs.attach(visitor, state.run_id, after=state.after)


def crowd_note(interval: float, pages: int) -> str:
    """What the status line adds where a crowd slows this page's polls (demo.runs.audience)."""
    if interval <= POLL_SECONDS:
        return ""
    return (f"  \n*{pages} pages are watching this run: this one updates every {interval:.0f} s "
            "(its owner's every second).*")


def views_key(figures: FigureBuilder, run) -> str:
    """Changes when what the second poll sends would (the spread figures as drawn, the results table, a picked run's
    model to download), so that a page asks for them then and not every second: the spread figures change at the
    snapshot cadence, the results once, and the model is offered once the run counts as ended (no longer training),
    a moment after its finished status reached the page's run (demo.train.past_runs.has_model)."""
    if run is None:
        return "no run"
    spread, _ = figures.spread(run)
    return repr((spread, results_key(run), run.training))


def _use_umap(runs: RunManager, run, color_by) -> None:
    """UMAP for the run where the server has it: all classes once it rests, and its few-class views laid out while it
    trains from the moment a page shows them in UMAP. Not before: the UMAP process takes time on the cores the run
    trains on (docs/benchmarks.md), which a page showing PCA would pay for nothing."""
    if run is None or runs.umap_worker is None:
        return
    run.use_umap(runs.umap_worker)
    if color_by == live_view.FEW_CLASSES_UMAP:
        runs.umap_worker.watch(run.few_classes)


LIVE_SLIDERS = ("memvir_n", "memvir_m", "warmup_epochs")
"""The live controls, in the order of the poll's and the load event's outputs, which follow the run's values."""


def _controls(run, visitor: str, sent: ControlsSent | None, page: str | None = None):
    """((the note beside the live controls, then each slider), each a skip when unchanged; what the page has then).

    The note says what became of the run's latest live change: pending, applied at a step, or refused and why
    (LiveRun.controls_note); nothing once the run rests. While the run trains its sliders follow its live values as
    it confirms them, read-only for a visitor whose run it is not. Left alone: a setting the visitor's own change is
    pending for (the value under their hand is the one on its way), and one whose value this `page` (its session)
    asked for last: the page shows it, or a newer value typed since, which the page sends once this ask is answered
    (trigger_mode "always_last") and which the applied value, sent back, would overwrite."""
    if run is None:
        wanted = ControlsSent(None)
        if sent is None or wanted == sent:
            return (gr.skip(),) * (1 + len(LIVE_SLIDERS)), wanted
        return ("", *(gr.update(interactive=True) for _ in LIVE_SLIDERS)), wanted
    note = run.controls_note()
    with run.lock:
        training = run.training
        values = tuple(run.live_values[name] for name in LIVE_SLIDERS) if training else None
        pending = dict(run.pending)
        own = {name for name in LIVE_SLIDERS
               if page is not None and run.last_asks.get(name) == (page, run.live_values[name])}
    wanted = ControlsSent(run.id, note, values, not training or run.owner == visitor)
    before = sent if sent is not None and sent.run_id == run.id else ControlsSent(run.id, note=None)
    sliders = []
    for index, name in enumerate(LIVE_SLIDERS):
        update = {}
        old = before.values[index] if before.values is not None else None
        if values is not None and values[index] != old and name not in pending and name not in own:
            update["value"] = values[index]
        if wanted.interactive != before.interactive or update:
            update["interactive"] = wanted.interactive
        sliders.append(gr.update(**update) if update else gr.skip())
    if values is not None:  # what is shown: a pending setting shows what the visitor moved it to (None here)
        wanted = dataclasses.replace(wanted, values=tuple(None if name in pending else value
                                                          for name, value in zip(LIVE_SLIDERS, values, strict=True)))
    return (note if note != before.note else gr.skip(), *sliders), wanted


def _curves(figures: FigureBuilder, run, sent: CurvesSent | None):
    """(the three curve figures or skips, what the page has then)."""
    if run is None:
        wanted, built = CurvesSent(None), None
    else:
        key, built = figures.curves(run)
        wanted = CurvesSent(key)
    if wanted == sent:
        return [gr.skip()] * 3, sent
    return list(built if built is not None else live_view.empty_curves()), wanted


def _embedding(figures: FigureBuilder, run, sent: EmbeddingSent | None, color_by, follow):
    """((picture, caption, slider), each a skip when unchanged; what the page has then)."""
    unchanged = (gr.skip(), gr.skip(), gr.skip())
    if run is None:
        wanted = EmbeddingSent(None)
        if wanted == sent:
            return unchanged, sent
        figure, caption = live_view.embedding_view(None, None, color_by)
        return (figure, caption, gr.update(maximum=1, value=1)), wanted
    if not follow:
        wanted = EmbeddingSent(run.id, (run.id, run.snapshot_version), following=False)
        if wanted == sent:
            return unchanged, sent
        # more to scrub to; the picture stays
        return (gr.skip(), gr.skip(), gr.update(maximum=live_view.snapshot_range(run)[1])), wanted
    latest = figures.latest_embedding(run, color_by)
    if latest is None:
        wanted = EmbeddingSent(run.id)
        if wanted == sent:
            return unchanged, sent
        figure, caption = live_view.embedding_view(None, None, color_by)
        return (figure, caption, gr.skip()), wanted
    snapshot_key, step, figure, caption = latest
    wanted = EmbeddingSent(run.id, snapshot_key, color_by)
    if wanted == sent:
        return unchanged, sent
    # The slider's minimum stays 0: a bound moved per session would refuse values sent before it moved.
    return (figure, caption, gr.update(maximum=max(step, 1), value=step)), wanted


