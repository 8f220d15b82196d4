"""What the Train tab shows of a run: the status line, the curve figures (loss, class count, target cosine, and the
spread curves) and the embedding picture: the few-class view (`PICTURES` "few") or all classes coloured by age or
class.

Pure functions of a `LiveRun` (plus the viewer), so the poll handler stays a few milliseconds: the curve figures are
built once per new record and shared by every page watching the run, and nothing here trains or projects.
"""

from __future__ import annotations

import functools
import threading
import time

from demo.common.cores import run_in_background
from demo.runs import live_changes
from demo.runs.live_run import LiveRun
from demo.train import words
from demo.train.figures import curves, embeddings, spread, style
from demo.train.figures.few_classes import few_class_drift_figure, few_class_figure
from demo.train.presets import optimiser_of

# A run's process imports torch and loads the dataset and the model before its first step: a few seconds.
STARTING_NOTE = "its training process is loading the dataset and the model"
# What the picture shows: "few" and "few-umap" are the few-class map in PCA or UMAP, "few-drift" its stored class
# weights around their live ones (demo.train.figures.few_classes); "age" and "class" show all classes, coloured by
# age or by class (demo.train.figures.embeddings.embedding_figure).
FEW_CLASSES, FEW_CLASSES_UMAP, FEW_CLASSES_DRIFT = "few", "few-umap", "few-drift"
FEW_CLASS_PICTURES = (FEW_CLASSES, FEW_CLASSES_UMAP, FEW_CLASSES_DRIFT)
PICTURES = (*FEW_CLASS_PICTURES, "age", "class")

STATE_LABELS = {"starting": "Starting", "running": "Training", "paused": "Paused", "stopped": "Stopped",
                "finished": "Finished", "failed": "Failed"}


def time_left_words(seconds: float) -> str:
    """'30 s', '4 min', '2 h 05 min': a time left, no finer than an estimate is (10 s below 90 s, else minutes)."""
    if seconds < 90:
        return f"{max(10, int(seconds / 10 + 0.5) * 10)} s"
    minutes = int(seconds / 60 + 0.5)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def seconds_left(run: LiveRun) -> float | None:
    """The steps left at the run's pace over its recent minutes (`LiveRun.pace`: evaluations and load included),
    else, in its first seconds, at the Trainer's images/s; None while it does not train."""
    step = run.last_step
    if run.state != "running" or step is None:
        return None
    rate = run.pace.steps_per_second()
    if rate is None and step.images_per_s > 0:
        rate = step.images_per_s / run.config.batch_size
    return (run.total_steps - step.step) / rate if rate else None


def progress_line(run: LiveRun) -> str:
    """'epoch 2 of 5 · step 123 of 475 · classes in use s(i) 2,042 · virtual sets 1 of 5 · 1,630 images/s ·
    about 40 s left' (the parts known so far)."""
    step = run.last_step
    epochs = run.config.epochs
    if step is None:
        done = [r for r in run.records if r.get("type") == "step"]
        last = done[-1]["step"] if done else 0
        return f"step {last:,}" + (f" of {run.total_steps:,}" if run.total_steps else "")
    parts = [f"epoch {step.epoch + 1} of {epochs}", f"step {step.step:,} of {run.total_steps:,}",
             f"classes in use s(i) {step.num_classes:,}"]
    if run.live_values["memvir_n"]:
        parts.append(f"virtual sets {step.num_virtual_sets} of {run.live_values['memvir_n']}"
                     + (" (warm-up)" if step.warmup else ""))
    elif run.kind != "baseline":  # a baseline's own line says what it is (`baseline_line`)
        parts.append("baseline (N = 0): no virtual classes")
    parts.append(f"{step.images_per_s:,.0f} images/s")
    if (left := seconds_left(run)) is not None:
        parts.append(f"about {time_left_words(left)} left")
    return " · ".join(parts)


def status_markdown(run: LiveRun | None, visitor: str) -> str:
    """The status line: state and progress, the latest live change, whose run it is."""
    if run is None:
        return "**Ready.** Choose the settings and press **Start**; the curves and embeddings appear as it trains."
    with run.lock:
        progress = STARTING_NOTE if run.state == "starting" else progress_line(run)
        lines = [f"**{STATE_LABELS.get(run.state, run.state)}** · {progress}"]
        if run.state in ("stopped", "failed", "finished") and run.message:
            # only its owner's buttons act on it (anyone's, where a restart left it without one): a watcher is not
            # offered what it cannot do
            resumable = run.can_resume and run.owner in (visitor, None)
            lines.append(run.message + (" · press **Resume** to continue" if resumable else ""))
        if run.changes:
            lines.append(f"Live changes: {changes_line(run.changes)}")
        baseline = run.baseline
    if baseline is not None:
        lines.append(baseline_line(baseline, run.config))
    if run.owner is None:
        lines.append("An earlier server started this run, so it is nobody's now: whoever presses **Resume** "
                     "continues it.")
    elif run.owner != visitor:
        lines.append("You are watching a run started by another visitor (read-only).")
    return "  \n".join(lines)


SHOWN_CHANGES = 6  # the status line's latest live changes; the results table and the model card list them all


def changes_line(changes: list) -> str:
    """'N 4 -> 6 at step 522, M 10 -> 20 at step 700': a run's live changes so far, the latest SHOWN_CHANGES."""
    earlier = len(changes) - SHOWN_CHANGES
    story = live_changes.story(changes[-SHOWN_CHANGES:])
    return f"{earlier} earlier, then {story}" if earlier > 0 else story


def baseline_line(baseline: LiveRun, run_config=None) -> str:
    """The status line's words on a run's baseline: what it is (the run's settings with N = 0, and the optimiser it
    trains: its own tuned one where the fair comparison chose one, named, or the run's, as `run_config` has it),
    whether it trains now or was loaded as a finished run of those settings, and its progress."""
    with baseline.lock:
        own = optimiser_of(baseline.config)
        if run_config is not None and own != optimiser_of(run_config):
            what = f"**Baseline** (N = 0: no virtual classes; its own optimiser: {own.describe()})"
        else:
            what = "**Baseline** (the same settings with N = 0: no virtual classes)"
        if baseline.process is None and baseline.state == "finished":  # not trained here: read from its folder
            return f"{what}: a finished run of these settings, loaded from `{baseline.id}` · {progress_line(baseline)}"
        progress = STARTING_NOTE if baseline.state == "starting" else progress_line(baseline)
        return f"{what}: {STATE_LABELS.get(baseline.state, baseline.state).lower()} · {progress}"


def curve_key(run: LiveRun | None) -> tuple | None:
    """Changes exactly when the curve figures would: new records in the run or its baseline."""
    if run is None:
        return None
    baseline = run.baseline
    return (run.id, id(run.records), len(run.records),
            None if baseline is None else (baseline.id, id(baseline.records), len(baseline.records)))


def _last_spread_step(run: LiveRun) -> int | None:
    """The step of the run's latest record with the spread measures (taken at the snapshot cadence); None before one.
    Looked for from the end: records only grow, and one comes every few steps."""
    with run.lock:
        return next((record["step"] for record in reversed(run.records) if "weight_mean_cos" in record), None)


def spread_key(run: LiveRun | None) -> tuple | None:
    """Changes when the spread figures would: a new spread measure in the run or its baseline (at each snapshot step,
    every few seconds, so that they are not drawn and sent to every page anew with each record). The warm-up's end
    mark and a live change of M (which names the virtual sets' ages from then on) join them with the next measure."""
    if run is None:
        return None
    baseline = run.baseline
    return (run.id, id(run.records), _last_spread_step(run),
            None if baseline is None else (baseline.id, id(baseline.records), _last_spread_step(baseline)))


def build_curves(run: LiveRun):
    """(curves, class count, target cosine) figures of the run, with its baseline overlaid."""
    with run.lock:
        records = list(run.records)
    baseline_records = None
    if run.baseline is not None:
        with run.baseline.lock:
            baseline_records = list(run.baseline.records)
    return (curves.curves_figure(records, baseline=baseline_records, reduction=run.config.memvir_reduction),
            curves.class_count_figure(records, baseline=baseline_records),
            curves.target_cosine_figure(records, baseline=baseline_records))


def build_spread(run: LiveRun):
    """(drift, class spread) figures of the run, with its baseline's class spread overlaid."""
    with run.lock:
        records = list(run.records)
    margin = run.config.memvir_m  # the M it started with: its records hold each live change of it
    baseline_records = None
    if run.baseline is not None:
        with run.baseline.lock:
            baseline_records = list(run.baseline.records)
    if run.config.memvir_n == 0:
        drift = style.empty_figure(
            "This run is a baseline (N = 0):<br>it has no virtual classes to drift.")
    else:
        drift = spread.drift_figure(records, margin)
    return drift, spread.class_spread_figure(records, baseline=baseline_records)


@functools.cache
def empty_curves():
    """Built once and shared, as the runs' figures are: building a figure takes milliseconds, which a fresh page's
    poll would otherwise spend."""
    empty = style.empty_figure("Press Start to train; the curves fill in as it trains.")
    return empty, empty, empty


@functools.cache
def _no_snapshot_figure(color_by: str):
    """The picture saying no snapshot is there yet, built once per colouring (see empty_curves)."""
    return embeddings.embedding_figure(None, color_by)


@functools.cache
def empty_spread():
    # half-width charts: the message in two lines
    empty = style.empty_figure(
        "Press Start to train; the spread of<br>the classes appears at the first snapshot.")
    return empty, empty


def picture_key(run: LiveRun) -> tuple:
    """Changes exactly when the latest picture may: a new snapshot, a UMAP layout arriving, the run coming to rest
    or training again, or its baseline ending (the caption says whether UMAP waits for the CPU, and for what)."""
    return run.id, run.snapshot_version, run.few_classes.version, run.resting, run.busy


class FigureBuilder:
    """Draws the figures of the runs pages are watching on one background thread, at most once per `interval`.

    Building a plotly figure costs milliseconds of Python (bench/bench_figures.py), several a second while a run
    trains.
    Done in the poll handler, that would be the handler's whole cost and would hold the interpreter lock at the moment
    pages ask; here the poll only picks up the finished figures, and all pages watching a run share them. Only what some
    page asked for lately is kept drawn (the curves, the spread figures, each picture): on a machine whose cores a
    run trains on, every figure drawn for nobody is time taken from the run.
    """

    def __init__(self, interval: float = 1.0, forget_after: float = 10.0):
        self.interval = interval
        self.forget_after = forget_after
        self._lock = threading.Lock()
        # run id -> (run, {what a page asked for: CURVES, SPREAD or a picture (PICTURES): when it last asked})
        self._watched: dict[str, tuple[LiveRun, dict[str, float]]] = {}
        # (run id, CURVES or SPREAD) -> (curve key, figures); (run id, picture) -> (snapshot key, step, figure, caption)
        self._drawn: dict[tuple[str, str], tuple] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="memvir-figures", daemon=True)
        self._thread.start()

    def _watch(self, run: LiveRun, wanted: str) -> None:
        with self._lock:
            _, asked = self._watched.get(run.id, (run, {}))
            asked[wanted] = time.monotonic()
            self._watched[run.id] = (run, asked)

    def curves(self, run: LiveRun) -> tuple[tuple, tuple]:
        """(curve key, the three curve figures) of the run as last drawn; drawn now if never yet (a page just
        opened)."""
        return self._curve_figures(run, _CURVES)

    def spread(self, run: LiveRun) -> tuple[tuple, tuple]:
        """(spread key, the two spread figures) of the run as last drawn; drawn now if never yet."""
        return self._curve_figures(run, _SPREAD)

    def _curve_figures(self, run: LiveRun, kind: str) -> tuple:
        self._watch(run, kind)
        with self._lock:
            drawn = self._drawn.get((run.id, kind))
        # a run that no longer trains (nor its baseline) gets no new record: its figures are drawn now if its last
        # records came after the builder's last drawing, so the poll that first says "Finished" (or "Stopped") shows
        # every step beside it, not the curve of up to a builder's interval before
        if drawn is None or (not run.busy and drawn[0] != _curves_key(run, kind)):
            drawn = self._draw_curves(run, kind)
        return drawn

    def _draw_curves(self, run: LiveRun, kind: str) -> tuple:
        drawn = (_curves_key(run, kind), build_curves(run) if kind == _CURVES else build_spread(run))
        with self._lock:
            self._drawn[(run.id, kind)] = drawn
        return drawn

    def latest_embedding(self, run: LiveRun, color_by: str) -> tuple | None:
        """(snapshot key, step, figure, caption) of the latest snapshot as last drawn in `color_by`; drawn now if
        never yet (a page just opened, or switched pictures: it shows the run's latest snapshot at once, not from the
        next one on); None while the run has none."""
        self._watch(run, color_by)
        with self._lock:
            drawn = self._drawn.get((run.id, color_by))
        return drawn if drawn is not None else self._draw_picture(run, color_by)

    def _work(self) -> None:
        run_in_background()
        while not self._closed:
            started = time.monotonic()
            with self._lock:
                watched = [(run, [wanted for wanted, seen in asked.items() if started - seen <= self.forget_after])
                           for run, asked in self._watched.values()]
            for run, wanted in watched:
                if not wanted:  # no page asked lately
                    self._forget(run.id)
                    continue
                self._refresh(run, wanted)
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def _forget(self, run_id: str) -> None:
        with self._lock:
            self._watched.pop(run_id, None)
            for key in [key for key in self._drawn if key[0] == run_id]:
                del self._drawn[key]

    def _refresh(self, run: LiveRun, wanted: list[str]) -> None:
        """Redraw what pages asked for lately where the run has changed; forget what none asked for."""
        snapshot_key = picture_key(run)
        with self._lock:
            for stale in [drawn for drawn in self._drawn if drawn[0] == run.id and drawn[1] not in wanted]:
                del self._drawn[stale]
            drawn = {what: self._drawn.get((run.id, what)) for what in wanted}
        for what, current in drawn.items():
            if what in (_CURVES, _SPREAD):
                if current is None or current[0] != _curves_key(run, what):
                    self._draw_curves(run, what)
                continue
            if current is None or current[0] != snapshot_key:
                self._draw_picture(run, what)

    def _draw_picture(self, run: LiveRun, what: str) -> tuple | None:
        """Draw the picture `what` of the run's latest snapshot and keep it; None (nothing kept) while it has none."""
        snapshot_key, latest = picture_key(run), run.snapshot_at(None)
        if latest is None:
            return None
        figure, caption = embedding_view(run, None, what)
        drawn = (snapshot_key, latest.step, figure, caption)
        with self._lock:
            self._drawn[(run.id, what)] = drawn
        return drawn

    def close(self) -> None:
        self._closed = True
        self._thread.join(5)


# What FigureBuilder draws besides the pictures (PICTURES): the three curve figures, and the two spread figures.
_CURVES, _SPREAD = "curves", "spread"


def _curves_key(run: LiveRun, kind: str) -> tuple | None:
    """The key that changes when the figures of `kind` (_CURVES or _SPREAD) would."""
    return curve_key(run) if kind == _CURVES else spread_key(run)


def embedding_view(run: LiveRun | None, step: int | None, color_by: str):
    """(figure, caption) of the snapshot at `step` (the latest when None), as `color_by` (one of PICTURES) shows it."""
    if color_by in FEW_CLASS_PICTURES:
        return few_class_view(run, step, umap=color_by == FEW_CLASSES_UMAP, drift=color_by == FEW_CLASSES_DRIFT)
    view = None if run is None else run.snapshot_at(step)
    if view is None:
        return _no_snapshot_figure(color_by), "No snapshot yet."
    with run.lock:
        count = len(run.snapshots)
        position = next((i for i, kept in enumerate(run.snapshots) if kept.step == view.step), count - 1) + 1
        umap_pending = run.latest_raw_snapshot is not None and run.latest_raw_snapshot.step == view.step
    method = view.projected.method.upper()
    note = ""
    if method == "PCA" and umap_pending and run.resting:
        note = umap_on_its_way(run)
    elif method == "PCA" and not run.resting:
        note = " · UMAP follows when the run pauses or ends"
    caption = f"Snapshot {position} of {count} kept · step {view.step:,} · {method}{note}"
    return embeddings.embedding_figure(view.projected, color_by, run.class_names), caption


def umap_on_its_way(run: LiveRun, waiting: int = 0) -> str:
    """What a resting run's caption says of the UMAP it waits for: behind its baseline's training (the UMAP process
    runs at the lowest priority, on what the training leaves of the cores: demo.umap.service), or on its way, after
    `waiting` other snapshots of the same view (laid out newest first)."""
    baseline = run.baseline
    if baseline is not None and baseline.training:
        return " · UMAP waits behind the baseline, training now (UMAP runs at the lowest priority)"
    if waiting:
        return f" · UMAP on its way ({waiting} snapshot{'s' if waiting != 1 else ''} still to lay out, newest first)"
    return " · UMAP on its way"


def snapshot_range(run: LiveRun | None) -> tuple[int, int]:
    """(first, last) step with a kept snapshot, for the scrub slider; (0, 1) when there is none."""
    if run is None:
        return 0, 1
    with run.lock:
        if not run.snapshots:
            return 0, 1
        first, last = run.snapshots[0].step, run.snapshots[-1].step
    return first, max(last, first + 1)


def few_class_view(run: LiveRun | None, step: int | None, umap: bool = False, drift: bool = False):
    """(figure, caption) of the few-class view at `step` (the newest when None): its map in PCA or, `umap`, in UMAP,
    or, `drift`, its stored class weights around their live ones."""
    draw = few_class_drift_figure if drift else few_class_figure
    view = None if run is None else run.few_classes.view(step, umap)
    if view is None:
        return draw(None), "No few-class snapshot yet."
    projection = view.projection
    method = projection.method.upper()
    note = ""
    if umap and projection.step < view.newest_step and step is None:
        note = f" · the newest UMAP (the newest snapshot, step {view.newest_step:,}, is being laid out)"
    elif umap and method == "PCA":
        if not run.few_classes.umap_expected:
            note = " · UMAP is off on this server"
        else:
            note = (umap_on_its_way(run, run.few_classes.umap_waiting()) if run.resting
                    else " · UMAP not laid out for it: training comes first")
    classes = ", ".join(str(int(label)) for label in projection.classes)
    shown = "true angles" if drift else f"{method}{note}"
    caption = (f"Snapshot {view.position} of {view.count} kept · step {projection.step:,} · {shown} · "
               f"training classes {classes}")
    if not drift and run.config.dataset == "glyphs":
        caption += "  \n" + words.GLYPHS_MAP_NOTE
    return draw(view, run.class_names), caption
