"""The Train tab's right-hand side: the live views of the run shown (status, curves, the spread curves, the snapshot
picture with its controls and the words beside it, the results table), their events, and the handlers that are
theirs alone (`ViewsHandlers`, bound to the runs and the figures): the second poll (spread curves and results table,
sent when the first poll's views key changes) and the choice of the few-class view's classes.

The second poll's trigger is a one-shot timer: a poll whose views key changed starts it (demo.train.poll.VIEWS_DUE);
at its tick the timer is stopped, and then the second poll sent. Stopped first, not by the second poll's answer: that
answer could arrive after a later poll had started the timer again (the key changed once more) and undo it. Not a
gr.State's change: gradio 6.31 fires one only after a queued event, and the polls skip the queue (the browser tests
of tests/browser/test_train_views_browser.py check both).

The first poll, scrubbing and recolouring are demo.train.poll's; the controls on the left are demo.train.tab's.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from demo.common.handlers import reporting, visitor_key
from demo.common.inputs import whole_numbers
from demo.common.shared_plot import SharedPlot
from demo.common.shims import refuse_outside_choices
from demo.runs.manager import RunManager
from demo.train import live_view, neighbours, past_runs, words
from demo.train.live_view import FigureBuilder
from demo.train.neighbours import NeighbourHandlers
from demo.train.poll import PollHandlers, PollState, current_state, shown_run
from demo.train.results_table import results_markdown
from memvir.config import MAX_FOCUS_CLASSES

# How long after a poll whose views key changed the second poll is sent: at once, as a timer counts
VIEWS_DUE_S = 0.1
# live_view.PICTURES, in words (tests/app/test_app_pieces.py checks that they agree)
PICTURE_CHOICES = [("a few classes, PCA", "few"), ("a few classes, UMAP", "few-umap"),
                   ("a few classes, drift", "few-drift"), ("all classes by age", "age"),
                   ("all classes by class", "class")]


@dataclass(frozen=True)
class ViewsSent:
    """What a page's second poll sent: the spread figures at a spread key (live_view.spread_key; None: the empty ones)
    and the results."""

    key: tuple | None
    results: str
    # the words under the runs' list and whether a model was offered (demo.train.past_runs.picked_view); None: not sent
    picked: tuple[str, bool] | None = None


class ViewsHandlers:
    """The handlers that are the views' alone, bound to the runs (a `RunManager`) and the `FigureBuilder`: the second
    poll and the choice of the few-class view's classes. `build` wires the bound methods; tests call them the same
    way."""

    def __init__(self, runs: RunManager, figures: FigureBuilder):
        self.runs = runs
        self.figures = figures

    def poll_views(self, state: PollState, sent: ViewsSent | None, visitor=None, request: gr.Request = None):
        """After a poll whose views key changed (which settles the run shown, and changes as it ends): the spread
        curves, the results table, and the words and the model's download under the runs' list for a run picked
        there, when they changed."""
        visitor = visitor_key(visitor, request)
        state = current_state(self.runs, state, request)
        run = shown_run(self.runs, state, visitor)
        if run is None:
            key, spread, results = None, live_view.empty_spread(), ""
        else:
            key, spread = self.figures.spread(run)
            results = results_markdown(run, run.baseline)
        words, download, picked = past_runs.picked_view(self.runs, state, run, visitor,
                                                         sent.picked if sent is not None else None)
        wanted = ViewsSent(key, results, picked)
        if sent is not None and sent.key == key:
            spread = (gr.skip(), gr.skip())
        return wanted, *spread, results if sent is None or sent.results != results else gr.skip(), words, download

    @reporting(message_slot=0, outputs=1)
    def show_classes(self, state: PollState, focus_classes, visitor=None, request: gr.Request = None):
        """Enter in the classes box: the running run draws these classes from its next snapshot on."""
        visitor = visitor_key(visitor, request)
        classes = whole_numbers(focus_classes, "classes", MAX_FOCUS_CLASSES)
        run = self.runs.get(current_state(self.runs, state, request).run_id)
        if run is None or not run.training:
            return "These classes are drawn from the first snapshot of the next run you start."
        self.runs.show_classes(run.id, visitor, classes)
        shown = ", ".join(map(str, classes)) if classes else "the run's own pick"
        return f"Asked for classes {shown}: the next snapshot draws them."


def stopped():
    """A one-shot timer's tick: the timer stopped."""
    return gr.update(active=False)


@dataclass(frozen=True)
class Views:
    """The components the left-hand side reads or writes."""

    status: gr.Markdown
    notice: gr.Markdown
    follow: gr.Checkbox
    focus_classes: gr.Textbox
    classes_notice: gr.Markdown  # the answer to the classes box, beside it


@dataclass(frozen=True)
class Charts:
    """The run's status line, the notice, the results table and the charts above the snapshot picture."""

    status: gr.Markdown
    notice: gr.Markdown
    results: gr.Markdown
    curves: SharedPlot  # loss and Recall@1
    classes: SharedPlot  # classes in use s(i)
    cosine: SharedPlot  # mean cos(x, W_y)
    drift: SharedPlot  # virtual classes against the live ones
    spread: SharedPlot  # how the real classes spread


@dataclass(frozen=True)
class SnapshotView:
    """The embedding snapshot and what steers it: the picture chosen, following or scrubbing the snapshots, the
    few-class view's classes, and the neighbours of an image clicked in it."""

    plot: SharedPlot
    color_by: gr.Radio
    follow: gr.Checkbox
    step: gr.Slider
    focus_classes: gr.Textbox
    caption: gr.Markdown
    classes_notice: gr.Markdown
    neighbours_caption: gr.Markdown
    neighbours_gallery: gr.Gallery


def _charts() -> Charts:
    status = gr.Markdown(live_view.status_markdown(None, ""), elem_id="run-status")
    notice = gr.Markdown("", elem_id="notice")
    results = gr.Markdown("", elem_id="results-table")
    # Each chart says what it waits for from the start: filled by the first poll only, they were bare boxes for the
    # 10-20 s a fresh server took to answer it.
    empty_curves, empty_spread = live_view.empty_curves(), live_view.empty_spread()
    curves_plot = SharedPlot(empty_curves[0], label="Loss and Recall@1", show_label=False, elem_id="curves-plot")
    with gr.Row():
        classes_plot = SharedPlot(empty_curves[1], label="Classes in use s(i)", show_label=False,
                                  elem_id="classes-plot")
        cosine_plot = SharedPlot(empty_curves[2], label="Mean cos(x, W_y)", show_label=False, elem_id="cosine-plot")
    with gr.Row():
        drift_plot = SharedPlot(empty_spread[0], label="Virtual classes against the live ones", show_label=False,
                                elem_id="drift-plot")
        spread_plot = SharedPlot(empty_spread[1], label="How the real classes spread", show_label=False,
                                 elem_id="spread-plot")
    gr.Markdown(words.SPREAD_HELP, elem_classes="small-note", padding=True)
    return Charts(status, notice, results, curves_plot, classes_plot, cosine_plot, drift_plot, spread_plot)


def _snapshot_view() -> SnapshotView:
    with gr.Group():
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                embedding_plot = SharedPlot(label="Embedding snapshot", show_label=False, elem_id="embedding-plot")
            with gr.Column(scale=2, min_width=260):
                gr.Markdown(words.SNAPSHOT_HELP, elem_classes="small-note", padding=True)
        with gr.Row():
            color_by = refuse_outside_choices(gr.Radio(PICTURE_CHOICES, value="few", label="Picture", scale=2,
                                                       elem_id="picture"), "the picture")
            follow = gr.Checkbox(True, label="Follow the latest snapshot", scale=1, elem_id="follow")
            snapshot_step = gr.Slider(0, 1, value=1, step=1, label="Scrub snapshots (step)", scale=3,
                                      elem_id="scrub")
        with gr.Row():
            focus_classes = gr.Textbox("", label="Classes shown (few-class picture)", info=words.FOCUS_INFO,
                                       placeholder="e.g. 3, 17, 40, 112, 250, 301, 509, 777", scale=2,
                                       elem_id="focus-classes")
            with gr.Column(scale=3):
                snapshot_caption = gr.Markdown("No snapshot yet.", elem_id="snapshot-caption",
                                               elem_classes="small-note", padding=True)
                # the answer to the classes box beside it, not at the top of the page
                classes_notice = gr.Markdown("", elem_id="classes-notice", elem_classes="small-note", padding=True)
        with gr.Column(elem_id="neighbours"):
            neighbours_caption = gr.Markdown(neighbours.HINT, elem_id="neighbours-caption",
                                             elem_classes="small-note", padding=True)
            neighbours_gallery = gr.Gallery(label="The image clicked and its nearest neighbours", columns=3,
                                            height="auto", object_fit="contain", allow_preview=True,
                                            elem_id="neighbours-gallery")
    return SnapshotView(embedding_plot, color_by, follow, snapshot_step, focus_classes, snapshot_caption,
                        classes_notice, neighbours_caption, neighbours_gallery)


def build(runs: RunManager, figures: FigureBuilder, state: gr.State, visitor: gr.BrowserState,
          timer: gr.Timer, controls: tuple, picker: past_runs.PastRuns) -> Views:
    """The views, inside the tab's right-hand column, with their events. `controls`: the note beside the live
    controls and the controls (demo.train.poll.LIVE_SLIDERS), which the poll keeps at the run's values; `picker`: the
    runs' list, whose words and download under it the second poll keeps at the run picked."""
    live, handlers, clicks = PollHandlers(runs, figures), ViewsHandlers(runs, figures), NeighbourHandlers(runs)
    charts, snapshot = _charts(), _snapshot_view()
    # A click on an image's point, as the page's script sends it (demo/static/page.js): out of sight
    picked_point = gr.Textbox("", visible="hidden", elem_id="snapshot-pick")
    show_picked = gr.Button("Show the clicked image's neighbours", visible="hidden", elem_id="snapshot-pick-go")
    views_sent = gr.State(None)
    views_due = gr.Timer(VIEWS_DUE_S, active=False)  # started by a poll whose views key changed, for one tick

    # queue=False: the page posts each poll and reads the answer in one HTTP request (/gradio_api/run/predict), not
    # through gradio's queue, which takes a join request and an event stream per call and the queue's own rounds:
    # the polls come every second while a run trains, and on a small machine the server's every wake-up is taken
    # from the run (docs/benchmarks.md). Nothing to queue for: a poll only reads, and answers in a millisecond.
    polled = timer.tick(live.poll, [state, snapshot.color_by, snapshot.follow, visitor],
                        [state, charts.status, *controls, charts.curves, charts.classes, charts.cosine, snapshot.plot,
                         snapshot.caption, snapshot.step, timer, views_due], api_name="poll", api_visibility="private",
                        show_progress="hidden", queue=False)
    # Each answer heard, noted in the browser: a page that stops hearing them says so until they come again (page.js)
    polled.success(None, None, None, js="() => { window.memvirHeard && window.memvirHeard(); }")
    # The second poll only when the first says its views changed: every few seconds while a run trains (at its
    # snapshots), never while a page rests, rather than after every poll. The timer stopped, then the second poll.
    views_due.tick(stopped, None, [views_due], api_name="views_due", api_visibility="private", show_progress="hidden",
                   queue=False).then(
        handlers.poll_views, [state, views_sent, visitor],
        [views_sent, charts.drift, charts.spread, charts.results, picker.summary, picker.download],
        api_name="poll_views", api_visibility="private", show_progress="hidden", queue=False)
    _wire_snapshot(live, handlers, snapshot, state, visitor)
    show_picked.click(clicks.show_neighbours, [state, picked_point, snapshot.color_by],
                      [state, snapshot.neighbours_gallery, snapshot.neighbours_caption, snapshot.plot,
                       snapshot.follow, snapshot.step],
                      api_name="snapshot_neighbours", api_visibility="private", show_progress="hidden")
    snapshot.focus_classes.submit(handlers.show_classes, [state, snapshot.focus_classes, visitor],
                                  [snapshot.classes_notice], api_name="show_classes", api_visibility="private",
                                  show_progress="hidden")
    return Views(charts.status, charts.notice, snapshot.follow, snapshot.focus_classes, snapshot.classes_notice)


def _wire_snapshot(live: PollHandlers, handlers: ViewsHandlers, snapshot: SnapshotView, state: gr.State,
                   visitor: gr.BrowserState) -> None:
    """Scrubbing the snapshots, the picture chosen and following the latest one."""
    view = [snapshot.plot, snapshot.caption]
    snapshot.step.release(live.show_snapshot, [state, snapshot.step, snapshot.color_by],
                          [state, *view, snapshot.follow, snapshot.step], api_name="show_snapshot",
                          api_visibility="private", show_progress="hidden")
    # A drag unticks "follow" at its first move, in the browser: otherwise a poll that brings a new snapshot moves the
    # thumb back to the newest step under the visitor's pointer, and the release shows the newest again.
    snapshot.step.input(None, None, [snapshot.follow], js="() => false")
    snapshot.color_by.change(live.recolor, [state, snapshot.follow, snapshot.color_by, snapshot.step], view,
                             api_name="color_snapshot", api_visibility="private", show_progress="hidden")
    snapshot.follow.input(live.recolor, [state, snapshot.follow, snapshot.color_by, snapshot.step], view,
                          api_name="follow_snapshots", api_visibility="private", show_progress="hidden")
