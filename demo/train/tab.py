"""The Train tab: its controls, their handlers and its wiring; the live views beside them are demo.train.views's
(their poll, scrubbing and recolouring demo.train.poll's).

The handlers are methods of `TrainHandlers`, which holds the `RunManager`; `build` wires the bound methods and tests
call them the same way. They turn widget values into a `TrainConfig` and calls on the manager, nothing more: the
training is the library's, the runs' bookkeeping demo.runs.manager's. The page starts from the library's defaults
(`TrainConfig()`) with glyphs' preset (demo.train.presets: 12 epochs and the balanced reduction, chosen on validation
classes), except where it names a reason below.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from demo.common.allowed_paths import dataset_folder
from demo.common.handlers import reporting, visitor_key
from demo.common.hub_access import ANONYMOUS, sign_in_offered, visitor_token
from demo.common.inputs import box_number, positive_number, shown, whole_number, whole_numbers
from demo.common.shims import refuse_outside_choices
from demo.common.upload_store import discard
from demo.common.uploads import display_name, unpack_upload
from demo.runs import live_changes
from demo.runs.manager import RunManager
from demo.train import past_runs, words
from demo.train import views as train_views
from demo.train.live_view import FigureBuilder
from demo.train.poll import LIVE_SLIDERS, PollState, chosen_state, current_state, page_of, shown_run
from demo.train.presets import PAGE_DEFAULTS, PRESETS, suggest_settings, tuned_baseline
from memvir.config import MAX_FOCUS_CLASSES, REDUCTIONS, SettingRefused, TrainConfig
from memvir.data.hub import HUB_PREFIX, parse_hub_name
from memvir.data.registry import FOLDER_PREFIX
from memvir.hub import push
from memvir.losses import LOSSES, loss_defaults
from memvir.models.backbones import available_backbones

FOLDER_CHOICE, ZIP_CHOICE, HUB_CHOICE = "folder", "zip", "hub"
# Short enough that the chosen one shows whole in the box at the left column's width (a browser test checks it)
DATASET_CHOICES = [
    ("glyphs: ~2,000 characters", "glyphs"),
    ("glyphs-mini: 48 characters", "glyphs-mini"),
    ("a folder on this machine", FOLDER_CHOICE),
    ("an uploaded zip of class folders", ZIP_CHOICE),
    ("a dataset on the Hugging Face Hub", HUB_CHOICE),
]
LOSS_CHOICES = LOSSES  # every loss and backbone of the library
BACKBONE_CHOICES = available_backbones()
# memvir.memory.virtual_classes.SCHEDULES, with what each means (tests/app/test_app_pieces.py checks that they agree)
SCHEDULE_CHOICES = [("one more virtual set every M+1 steps after the warm-up (the paper's)", "curriculum"),
                    ("all N virtual sets at the warm-up's end (the paper's Fig. 3 ablation)", "all-at-once")]
# memvir.train.trainer's memory dtypes offered here: float16 halves MemVir's memory (the library's refusal offers it)
STORE_DTYPE_CHOICES = [("float32", "float32"), ("float16: half the memory", "float16")]
REDUCTION_CHOICES = words.REDUCTION_CHOICES  # memvir.config.REDUCTIONS in words (a test checks they match)
DEFAULTS = PAGE_DEFAULTS  # the library's settings with glyphs' preset (demo.train.presets)
# Where the page departs from the library's defaults, and why. The embedding picture is watched as it moves: a
# snapshot every 10 steps, more often than the library's default, which spares runs looked at afterwards the training
# time a snapshot takes (the probe set embedded).
LIVE_SNAPSHOT_EVERY = 10
# The first loss point within seconds: Recall@1 comes at the first epoch's end, not before the first step.
EVAL_AT_START = False
# What Reset puts back (it leaves the dataset, the backbone and the snapshot and evaluation cadences as they are);
# the loss comes back with the optimiser, whose scale is the loss's.
RESET_SETTINGS = ("memvir_n", "memvir_m", "warmup_epochs", "batch_size", "epochs", "lr", "seed", "memvir_schedule",
                  "val_classes", "memvir_store_dtype", "memvir_reduction", "class_lr", "adam_eps", "loss")


# ---------------------------------------------------------------------------------------------- handlers
def dataset_name(runs: RunManager, dataset, folder_path, zip_file, hub_dataset=None) -> str:
    """The library's dataset name for the page's choice: a folder under an allowed one, an unpacked zip, or a Hub
    dataset's `hf:OWNER/NAME[@REVISION]` (its id checked here; the run's process fetches it, memvir.data.hub)."""
    settings = runs.settings
    if dataset == HUB_CHOICE:
        typed = str(hub_dataset or "").strip().removeprefix(HUB_PREFIX)
        if not typed:
            raise ValueError("type the id of a Hub image-classification dataset, OWNER/NAME (e.g. someone/birds)")
        return str(parse_hub_name(HUB_PREFIX + typed))
    if dataset == FOLDER_CHOICE:
        if not str(folder_path or "").strip():
            raise ValueError("type the path of a folder holding one sub-folder of images per class")
        return f"folder:{dataset_folder(folder_path.strip(), settings)}"
    if dataset == ZIP_CHOICE:
        if not zip_file:
            raise ValueError("upload a zip of class folders first (one folder of images per class)")
        root = unpack_upload(zip_file, settings, settings.max_training_images, runs.dataset_folders_in_use())
        return f"folder:{root}"
    return dataset


def push_run(runs: RunManager, run, visitor: str, repo_id, oauth_token: gr.OAuthToken | None) -> str:
    """Push `run` for `visitor` (the page's Push and the client API's /push_run): only its owner, only once it
    rests, with the visitor's own token (on a Space their sign-in's, never the server's); the repo's URL. Refusals
    are ValueErrors in words."""
    if run is None:
        raise ValueError("there is no run to push: train one first")
    if run.owner != visitor:
        raise ValueError("only the visitor who started this run can push it")
    if run.busy:
        raise ValueError("the run is still training: stop it or let it finish, then push")
    token = visitor_token(oauth_token, runs.settings.space)
    if token is ANONYMOUS:
        raise ValueError(words.SIGN_IN_TO_PUSH if sign_in_offered() else words.NO_SIGN_IN_ON_THIS_SPACE)
    return push(run.folder, (repo_id or "").strip(), token=token)


def _shown_run_id(runs: RunManager, state: PollState, visitor: str, request: gr.Request | None) -> str | None:
    """The run this page shows (the buttons act on it), even before its first poll, and after a choice a handler that
    began before it wrote over (demo.train.poll.current_state)."""
    run = shown_run(runs, current_state(runs, state, request), visitor)
    return run.id if run else None


class TrainHandlers:
    """The handlers of the Train tab's controls, bound to the `RunManager` they act on: the page wires the bound
    methods (`start_button.click(handlers.start, ...)`), and tests call them the same way."""

    def __init__(self, runs: RunManager):
        self.runs = runs

    @reporting(message_slot=1, outputs=2)
    def start(self, dataset, backbone, loss, batch_size, epochs, lr, seed, memvir_n, memvir_m, warmup_epochs,
              snapshot_every, eval_every, folder_path=None, zip_file=None, memvir_schedule=None, val_classes=None,
              memvir_store_dtype=None, memvir_reduction=None, focus_classes=None, class_lr=None, adam_eps=None,
              loss_scale=None, hub_dataset=None, visitor=None, request: gr.Request = None):
        """Start a run with these settings, or say why not. hub_dataset: the Hub dataset's OWNER/NAME[@REVISION]
        when `dataset` is the Hub choice."""
        run = self.start_run(dataset, backbone, loss, batch_size, epochs, lr, seed, memvir_n, memvir_m, warmup_epochs,
                             snapshot_every, eval_every, folder_path, zip_file, memvir_schedule, val_classes,
                             memvir_store_dtype, memvir_reduction, focus_classes, class_lr, adam_eps, loss_scale,
                             hub_dataset, visitor_key(visitor, request))
        # The page shows the new run, whatever a poll that began before Start writes (chosen_state). A page reset
        # before keeps its reset time: only runs started since are its usual ones once this run is gone.
        earlier = self.runs.pages.latest(page_of(request))
        state = chosen_state(self.runs, request, run.id, earlier.after if earlier else None)
        # no full stop after the id: on a phone the long id wraps and left the stop alone on a line of its own
        return state, f"Started run `{run.id}`"

    def start_run(self, dataset, backbone, loss, batch_size, epochs, lr, seed, memvir_n, memvir_m, warmup_epochs,
                  snapshot_every, eval_every, folder_path, zip_file, memvir_schedule, val_classes, memvir_store_dtype,
                  memvir_reduction, focus_classes, class_lr, adam_eps, loss_scale, hub_dataset, visitor: str):
        """The run started for `visitor` with the page's settings (`start`'s, which the client API's /start_run takes
        too), each checked as the page words it; ValueError that says why it cannot start."""
        # The page's dropdowns offer only these; a client sends any text: `folder:PATH` would pass the folders this
        # app may read (demo.common.allowed_paths), a `timm:` backbone would fetch weights from the Hub.
        for name, value, choices in (("the dataset", dataset, [choice for _, choice in DATASET_CHOICES]),
                                     ("the backbone", backbone, list(BACKBONE_CHOICES))):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {shown(value)}")
        if memvir_reduction and memvir_reduction not in REDUCTIONS:
            raise ValueError(f"the MemVir loss reduction is one of {', '.join(REDUCTIONS)}, got {memvir_reduction}")
        # Every number is checked before the dataset: a refused setting never costs the unpacking of a zip. N and M
        # are only read off their sliders here: TrainConfig judges them (below), in the words of a live change's
        # refusal, and MemVir their memory.
        numbers = dict(
            batch_size=whole_number(batch_size, "batch size", 1), epochs=whole_number(epochs, "epochs", 1),
            lr=positive_number(lr, "learning rate"), seed=whole_number(seed, "seed", 0),
            memvir_n=box_number(memvir_n, "N"), memvir_m=box_number(memvir_m, "M"),
            warmup_epochs=float(warmup_epochs or 0),
            val_classes=whole_number(val_classes or 0, "validation classes", 0),
            snapshot_every=whole_number(snapshot_every, "snapshot every", 0),
            eval_every=whole_number(eval_every, "eval every", 0),
            focus_classes=whole_numbers(focus_classes, "classes shown", MAX_FOCUS_CLASSES),
            class_lr=positive_number(DEFAULTS["class_lr"] if class_lr is None else class_lr,
                                     "class-weight learning rate"),
            adam_eps=positive_number(DEFAULTS["adam_eps"] if adam_eps is None else adam_eps, "Adam eps"),
        )
        if loss not in LOSSES:
            raise ValueError(f"the loss is one of {', '.join(LOSSES)}, got {loss}")
        # The scale box is the loss's own scale; a loss without one (softmax, proxy-anchor) ignores it.
        takes_scale = "scale" in loss_defaults(loss)
        loss_params = {"scale": positive_number(loss_scale, "loss scale")} if takes_scale and loss_scale else {}
        chosen = {"memvir_schedule": memvir_schedule, "memvir_store_dtype": memvir_store_dtype,
                  "memvir_reduction": memvir_reduction}
        # the settings judged on the library's default dataset, then on the dataset chosen
        try:
            settings = TrainConfig(backbone=backbone, loss=loss, loss_params=loss_params, **numbers,
                                   **{name: value for name, value in chosen.items() if value},
                                   eval_at_start=EVAL_AT_START)
        except SettingRefused as error:  # named as its control is, as a live change's refusal is
            raise ValueError(live_changes.refusal_words(error)) from None
        named = dataset_name(self.runs, dataset, folder_path, zip_file, hub_dataset)
        config = dataclasses.replace(settings, dataset=named)
        try:
            run = self.runs.start(config, visitor)
        except ValueError as error:
            if dataset != ZIP_CHOICE:
                raise
            raise ValueError(self._refused_zip(named, zip_file, error)) from None
        return run

    def _refused_zip(self, named: str, zip_file, error: ValueError) -> str:
        """A Start refused for its unpacked zip (its classes, their images): the zip goes, as a zip refused while
        unpacking does, unless a training run uses the same content, and the message names the zip as the visitor
        knows it, not the server's folder it was unpacked into."""
        root = Path(named.removeprefix(FOLDER_PREFIX))
        if root not in self.runs.dataset_folders_in_use():
            discard(self.runs.settings.uploads_dir, root)
        return str(error).replace(named, display_name(zip_file)).replace(str(root), display_name(zip_file))

    @reporting(message_slot=0, outputs=1)
    def stop(self, state: PollState, visitor=None, request: gr.Request = None):
        visitor = visitor_key(visitor, request)
        self.runs.stop(_shown_run_id(self.runs, state, visitor, request), visitor)
        return "Stopping: the run saves a checkpoint before its next step."

    @reporting(message_slot=0, outputs=1)
    def pause(self, state: PollState, visitor=None, request: gr.Request = None):
        visitor = visitor_key(visitor, request)
        self.runs.pause(_shown_run_id(self.runs, state, visitor, request), visitor)
        return "Pausing before the next step; Resume continues."

    @reporting(message_slot=0, outputs=2)
    def resume(self, state: PollState, visitor=None, request: gr.Request = None):
        """(the notice, "follow the latest snapshot" ticked): resumed, the picture follows the run again (a scrub
        while it was paused had unticked it)."""
        visitor = visitor_key(visitor, request)
        self.runs.resume(_shown_run_id(self.runs, state, visitor, request), visitor)
        return "Resumed.", True

    @reporting(message_slot=0, outputs=1)
    def compare(self, state: PollState, visitor=None, request: gr.Request = None):
        """The baseline (N = 0) of the run shown, trained beside it or loaded. Its trainer takes seconds to build:
        the notice says so at once, then how it went (a client's predict gets the last)."""
        yield words.BASELINE_STARTING
        visitor = visitor_key(visitor, request)
        run = self.runs.get(_shown_run_id(self.runs, state, visitor, request))
        # The baseline arm's own tuned optimiser where the fair comparison tuned one for these settings
        tuned = tuned_baseline(run.config) if run else None
        baseline = self.runs.compare_with_baseline(run.id if run else None, visitor,
                                                   tuned.settings() if tuned else None)
        if baseline.training:
            started = words.BASELINE_BESIDE if run.training else words.BASELINE_ALONE
            yield f"{started} {words.baseline_optimiser(tuned)}"
        else:
            yield (f"Baseline (N = 0): a finished run of these settings, `{baseline.id}`, loaded rather than trained "
                   f"again; it appears in grey on the curves. {words.baseline_optimiser(tuned, trained_before=True)}")

    # One handler for every live control, sent one typed change: the setting moved and its new value (each slider
    # sends its own). A page that shows stale values (opened before a change another tab made)
    # thus never resets the settings it did not touch.
    @reporting(message_slot=0, outputs=1)
    def update(self, state: PollState, setting, value, visitor=None, request: gr.Request = None):
        """A live control moved (`setting`, one of LIVE_SLIDERS): the visitor's running run takes `value` before its
        next step. Its Trainer checks it (TrainConfig's ranges, MemVir's memory) and says why it refuses; the note
        beside the controls says it is pending until the run confirms the step it applied at (LiveRun.controls_note).

        An ask sent leaves that note to the poll alone (gr.skip here): an answer written here could land after a
        poll's newer note ('applied at step 17'), which the poll, having sent it, would not send again, and the page
        would say 'pending' for good."""
        visitor = visitor_key(visitor, request)
        if setting not in LIVE_SLIDERS:
            raise ValueError(f"the live controls are {', '.join(LIVE_SLIDERS)}, got {setting!r}")
        run = self.runs.get(_shown_run_id(self.runs, state, visitor, request))
        if run is None or not run.training:
            return "The new MemVir settings apply when you press Start."
        value = _as_setting(setting, value)
        with run.lock:  # against what the run will use once the changes already asked for apply: 2 -> 4 -> 2 ends at 2
            before = run.pending.get(setting, run.live_values[setting])
        if before == value:
            return "The run already uses this setting."
        self.runs.update(run.id, visitor, {setting: value}, page=getattr(request, "session_hash", None))
        return gr.skip()

    @reporting(message_slot=1, outputs=20)
    def reset(self, state: PollState, visitor=None, request: gr.Request = None):
        """The default settings again (RESET_SETTINGS, then the classes shown, empty), and only runs started from now on
        shown; stops the run shown if it is the visitor's. The answers beside the sliders and the classes box are
        emptied too: they were about the run Reset leaves."""
        visitor = visitor_key(visitor, request)
        run = self.runs.get(current_state(self.runs, state, request).run_id)
        message = "Reset: choose the settings and press Start."
        if run is not None and run.owner == visitor and run.busy:
            self.runs.stop(run.id, visitor)
            message = "Stopped the run (its folder is kept for retrieval) and reset the settings."
        # noted on the server: a poll that began before Reset and ends after it follows it (demo.train.poll)
        return (chosen_state(self.runs, request, after=time.time()), message,
                *(DEFAULTS[name] for name in RESET_SETTINGS),
                DEFAULTS["loss_params"]["scale"], "", "", "")

    @reporting(message_slot=0, outputs=1)
    def push_to_hub(self, state: PollState, repo_id, visitor=None, oauth_token: gr.OAuthToken | None = None,
                    request: gr.Request = None):
        """Push the visitor's finished run with their own Hub token (on a Space: their sign-in's; never the
        server's), to a repo their token may write."""
        run = self.runs.get(current_state(self.runs, state, request).run_id)
        url = push_run(self.runs, run, visitor_key(visitor, request), repo_id, oauth_token)
        return f"Pushed to {url}"


def loss_scale_for(dataset, loss):
    """The scale box for the loss just picked: the dataset preset's tuned scale for the loss it was tuned with, else
    the loss's own default; blank for a loss that takes no scale."""
    preset = PRESETS.get(dataset)
    if preset is not None and loss == preset.settings()["loss"]:
        return preset.optimiser.scale
    return loss_defaults(loss).get("scale") if loss in LOSSES else None


def dataset_inputs(dataset):
    """Show the folder box, the zip upload or the Hub dataset's box as the dataset choice needs."""
    return (gr.update(visible=dataset == FOLDER_CHOICE), gr.update(visible=dataset == ZIP_CHOICE),
            gr.update(visible=dataset == HUB_CHOICE))




def _as_setting(setting: str, value):
    """The page's number as the setting's type: a slider sends N = 3 as 3.0. Anything else goes as it came, for the
    run's TrainConfig to judge (a fraction of N is refused there, not rounded here)."""
    if setting in ("memvir_n", "memvir_m") and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def live_values(runs: RunManager, run_id: str | None) -> tuple:
    """What the N, M and warm-up sliders show for the run a page (re)opened on: the values a training run uses once
    the changes asked for apply, so that a reloaded page, or a watcher's, shows the run as it is (and its next change
    starts from there); unchanged (gr.update()) without a training run."""
    run = runs.get(run_id)
    if run is None or not run.training:
        return tuple(gr.update() for _ in LIVE_SLIDERS)
    with run.lock:
        return tuple(run.pending.get(name, run.live_values[name]) for name in LIVE_SLIDERS)


def opened(runs: RunManager, visitor: str, oauth_token: gr.OAuthToken | None = None):
    """(state, Push button, its note) for a page just (re)opened by `visitor`: it shows their run again. On a Space
    Push is the signed-in visitor's (with their own token); locally it needs this machine's login."""
    from huggingface_hub import get_token

    run = runs.attach(visitor, None)
    runs.umap_worker  # noqa: B018 - starts the UMAP process: it compiles while the visitor reads the page
    state = PollState(run_id=run.id if run else None)
    if runs.settings.space:
        signed_in = visitor_token(oauth_token, space=True) is not ANONYMOUS
        if signed_in:
            return state, gr.update(interactive=True), words.PUSH_AS_YOURSELF
        return state, gr.update(interactive=False), (
            words.SIGN_IN_TO_PUSH if sign_in_offered() else words.NO_SIGN_IN_ON_THIS_SPACE)
    has_token = bool(get_token())
    note = (words.PUSH_UPLOADS if has_token else
            "Push to Hub is off: no Hugging Face token is configured. Set HF_TOKEN (or run `hf auth login`) "
            "where the app runs, then reload.")
    return state, gr.update(interactive=has_token), note


# ---------------------------------------------------------------------------------------------- layout and wiring
@dataclass(frozen=True)
class TrainTab:
    """What of the Train tab the page's load event fills in."""

    state: gr.State
    push_button: gr.Button
    push_note: gr.Markdown
    sliders: tuple  # N, M and warm-up (LIVE_SLIDERS), which a re-attached page sets to its run's values
    past_runs: gr.Dropdown  # the runs on this server (demo.train.past_runs), listed as the page opens


@dataclass(frozen=True)
class RunButtons:
    """Start, Pause, Resume, Stop, Reset and Compare with baseline: what acts on the run shown."""

    start: gr.Button
    pause: gr.Button
    resume: gr.Button
    stop: gr.Button
    reset: gr.Button
    baseline: gr.Button


@dataclass(frozen=True)
class RunSettings:
    """The settings above MemVir's: the line that sums them up, the dataset (and its folder, zip or Hub id), the
    backbone, the loss and the optimiser's basics."""

    first_screen: gr.Markdown
    dataset: gr.Dropdown
    folder_path: gr.Textbox
    zip_file: gr.File
    hub_dataset: gr.Textbox
    backbone: gr.Dropdown
    loss: gr.Dropdown
    batch_size: gr.Number
    epochs: gr.Number
    lr: gr.Number
    seed: gr.Number


@dataclass(frozen=True)
class LiveControls:
    """MemVir's N, M and warm-up sliders (LIVE_SLIDERS, which steer a training run) and the answer beside them."""

    memvir_n: gr.Slider
    memvir_m: gr.Slider
    warmup: gr.Slider
    notice: gr.Markdown

    @property
    def sliders(self) -> tuple:
        return self.memvir_n, self.memvir_m, self.warmup


@dataclass(frozen=True)
class AdvancedSettings:
    """The Advanced accordion: the views' cadences, MemVir's settings that apply at Start, and the optimiser's rest."""

    snapshot_every: gr.Number
    eval_every: gr.Number
    schedule: gr.Radio
    val_classes: gr.Number
    store_dtype: gr.Radio
    reduction: gr.Radio
    class_lr: gr.Number
    adam_eps: gr.Number
    loss_scale: gr.Number


@dataclass(frozen=True)
class PushControls:
    """The accordion that pushes the run to the Hugging Face Hub."""

    repo_id: gr.Textbox
    button: gr.Button
    note: gr.Markdown


def _run_buttons() -> RunButtons:
    # The run's buttons above the settings, and kept in sight while the visitor scrolls through them (page.css): Start
    # is on the first screen beside the status line, whatever the settings' height.
    with gr.Column(elem_id="run-buttons"):
        with gr.Row(elem_id="start-row"):
            start = gr.Button("Start", variant="primary", min_width=80, elem_id="start")
            pause = gr.Button("Pause", min_width=80, elem_id="pause")
            resume = gr.Button("Resume", min_width=80, elem_id="resume")
        with gr.Row():
            stop = gr.Button("Stop", variant="stop", min_width=80, elem_id="stop")
            reset = gr.Button("Reset", min_width=80, elem_id="reset")
        baseline = gr.Button("Compare with baseline (N = 0)", size="sm", elem_id="baseline")
    return RunButtons(start, pause, resume, stop, reset, baseline)


def _run_settings() -> RunSettings:
    # the settings in one line and what Start does, on every first screen (a phone's too: page.css)
    first_screen = gr.Markdown(words.first_screen(*(DEFAULTS[name] for name in (
        "dataset", "loss", "batch_size", "epochs", "memvir_n", "memvir_m", "warmup_epochs"))),
        elem_id="first-screen", elem_classes="small-note", padding=True)
    # Open, and folded by page.js on a phone, where Start and the summary above it fill the first screen. Gradio draws
    # a closed accordion's content only once it is opened: closed here, a wide screen would have to open it.
    with gr.Accordion("Settings", open=True, elem_id="train-settings"):
        dataset = refuse_outside_choices(gr.Dropdown(
            DATASET_CHOICES, value=DEFAULTS["dataset"], label="Dataset", elem_id="dataset",
            info=words.DATASET_INFO), "the dataset")
        folder_path = gr.Textbox("", label="Folder path", placeholder="/data/my-classes", visible=False,
                                 info="One sub-folder of images per class; the first half of the classes (by name) "
                                      "trains, the rest tests.")
        zip_file = gr.File(label="Zip of class folders", file_count="single", visible=False, file_types=[".zip"])
        hub_dataset = gr.Textbox("", label="Hub dataset", placeholder="OWNER/NAME or OWNER/NAME@REVISION",
                                 visible=False, info=words.HUB_DATASET_INFO)
        # one per row: side by side, the names sat under the dropdowns' arrows
        backbone = refuse_outside_choices(gr.Dropdown(list(BACKBONE_CHOICES), value=DEFAULTS["backbone"],
                                                      label="Backbone"), "the backbone")
        loss = refuse_outside_choices(gr.Dropdown(list(LOSS_CHOICES), value=DEFAULTS["loss"], label="Loss"), "the loss")
        with gr.Row():
            # Integer controls without precision=0, which rounds 1.5 to 2 unseen (demo.common.inputs).
            batch_size = gr.Number(DEFAULTS["batch_size"], label="Batch size")
            epochs = gr.Number(DEFAULTS["epochs"], label="Epochs")
        with gr.Row():
            lr = gr.Number(DEFAULTS["lr"], label="Learning rate")
            seed = gr.Number(DEFAULTS["seed"], label="Seed")
    return RunSettings(first_screen, dataset, folder_path, zip_file, hub_dataset, backbone, loss, batch_size, epochs,
                       lr, seed)


def _live_controls() -> LiveControls:
    # the id on a column: gradio 6.31 writes a gr.Group's elem_id on two nested elements of it
    with gr.Column(elem_id="memvir-controls"), gr.Group():
        gr.Markdown(words.MEMVIR_NOTE, elem_classes="small-note", padding=True)
        memvir_n = gr.Slider(0, 50, value=DEFAULTS["memvir_n"], step=1, info=words.N_INFO,
                             label="N: past steps used as virtual classes (0 = baseline)")
        memvir_m = gr.Slider(0, 200, value=DEFAULTS["memvir_m"], step=1, info=words.M_INFO,
                             label="M: steps between the past steps used")
        warmup = gr.Slider(0, 10, value=DEFAULTS["warmup_epochs"], step=0.5, info=words.WARMUP_INFO,
                           label="Warm-up (epochs) before virtual classes")
        # a live change's answer beside the sliders that sent it, not at the top of the page
        notice = gr.Markdown("", elem_id="memvir-notice", elem_classes="small-note", padding=True)
    return LiveControls(memvir_n, memvir_m, warmup, notice)


def _advanced_settings() -> AdvancedSettings:
    with gr.Accordion("Advanced", open=False, elem_classes="train-later"):
        gr.Markdown(words.REGIME_NOTE, elem_id="regime-note", elem_classes="small-note", padding=True)
        snapshot_every = gr.Number(LIVE_SNAPSHOT_EVERY, label="Embedding snapshot every (steps; 0 = none)")
        eval_every = gr.Number(DEFAULTS["eval_every"], label="Recall@1 evaluation every (epochs; 0 = at the end)")
        schedule = refuse_outside_choices(gr.Radio(SCHEDULE_CHOICES, value=DEFAULTS["memvir_schedule"],
                                                   label="Virtual-class schedule (applies at Start)"), "the schedule")
        val_classes = gr.Number(DEFAULTS["val_classes"], label="Validation classes held out of training (0 = none)",
                                info="Scored as validation R@1 (dashed) beside the test classes: choose N and M on "
                                     "these, not on the test classes.")
        store_dtype = refuse_outside_choices(gr.Radio(
            STORE_DTYPE_CHOICES, value=DEFAULTS["memvir_store_dtype"],
            label="MemVir memory precision (applies at Start)"), "the memory precision")
        reduction = refuse_outside_choices(gr.Radio(
            REDUCTION_CHOICES, value=DEFAULTS["memvir_reduction"], label="MemVir loss reduction (applies at Start)",
            info=words.REDUCTION_INFO, elem_id="reduction"), "the loss reduction")
        with gr.Row():
            class_lr = gr.Number(DEFAULTS["class_lr"], label="Class-weight learning rate")
            adam_eps = gr.Number(DEFAULTS["adam_eps"], label="Adam eps")
        loss_scale = gr.Number(DEFAULTS["loss_params"]["scale"], label="Loss scale", info=words.SCALE_INFO,
                               elem_id="loss-scale")
    return AdvancedSettings(snapshot_every, eval_every, schedule, val_classes, store_dtype, reduction, class_lr,
                            adam_eps, loss_scale)


def _push_controls() -> PushControls:
    with gr.Accordion("Push the run to the Hugging Face Hub", open=False, elem_classes="train-later"):
        if sign_in_offered():  # a Space's visitors push as themselves (demo.common.hub_access)
            gr.LoginButton(size="sm")
        repo_id = gr.Textbox(label="Repo id", placeholder="your-name/memvir-glyphs")
        button = gr.Button("Push to Hub", interactive=False, size="sm")
        note = gr.Markdown("", elem_classes="small-note")
    return PushControls(repo_id, button, note)


def build(runs: RunManager, figures: FigureBuilder, visitor: gr.BrowserState, timer: gr.Timer) -> TrainTab:
    """The Train tab, inside the page's gr.Tabs, with its events; `timer` drives its live view."""
    handlers = TrainHandlers(runs)
    with gr.Tab("Train", id="train"):
        state = gr.State(PollState())
        # made here, inside the tab: a component made after it would sit in the page's gr.Tabs beside the tabs,
        # and gradio then draws the next tab's button twice once it is opened
        live_setting = {setting: gr.State(setting) for setting in LIVE_SLIDERS}
        # The classes and #run-buttons place the status line and the loss chart under Start on a phone (page.css).
        with gr.Row(equal_height=False, elem_classes="train-layout"):
            with gr.Column(scale=1, min_width=320, elem_classes="train-controls", elem_id="train-controls"):
                buttons, basics = _run_buttons(), _run_settings()
                live, advanced, push = _live_controls(), _advanced_settings(), _push_controls()
            with gr.Column(scale=3, elem_classes="train-view"):
                picker = past_runs.build()
                views = train_views.build(runs, figures, state, visitor, timer, (live.notice, *live.sliders), picker)
    _wire_suggestions(basics, live, advanced, views.notice)
    started, reset = _wire_run_buttons(handlers, buttons, basics, live, advanced, views, state, visitor)
    _wire_past_runs(past_runs.PastRunsHandlers(runs), picker, (started, reset), views, state, visitor)
    for slider, setting, name in zip(live.sliders, LIVE_SLIDERS, ("update_n", "update_m", "update_warmup"),
                                     strict=True):
        # always_last: a change made while the previous one is on its way is sent after it, not dropped. The page's
        # own events; a client calls the client API's /update_run.
        slider.release(handlers.update, [state, live_setting[setting], slider, visitor], [live.notice],
                       api_name=name, api_visibility="private", show_progress="hidden",
                       trigger_mode="always_last")
    push.button.click(handlers.push_to_hub, [state, push.repo_id, visitor], [push.note], api_name="push_to_hub",
                      api_visibility="private")
    return TrainTab(state, push.button, push.note, live.sliders, picker.choice)


def _wire_suggestions(basics: RunSettings, live: LiveControls, advanced: AdvancedSettings, notice: gr.Markdown):
    """What a dataset or loss just chosen fills in, and the first screen's line that sums the settings up."""
    # Not queued (queue=False: one HTTP request each, answered at once): they only look up what a dataset suggests,
    # and the browser fires the dropdown's input twice, so an answer that waited for the queue's next look (0.1 s,
    # demo.page.QUEUE_IDLE_CHECK_S) could come after the visitor had typed over the suggestion.
    basics.dataset.change(dataset_inputs, [basics.dataset], [basics.folder_path, basics.zip_file, basics.hub_dataset],
                          api_name="dataset_choice", api_visibility="private", show_progress="hidden", queue=False)
    basics.dataset.input(suggest_settings, [basics.dataset],
                         [basics.batch_size, basics.epochs, *live.sliders, advanced.reduction, basics.lr,
                          advanced.class_lr, advanced.adam_eps, basics.loss, advanced.loss_scale, notice],
                         api_name="suggest_settings", api_visibility="private", show_progress="hidden", queue=False)
    basics.loss.input(loss_scale_for, [basics.dataset, basics.loss], [advanced.loss_scale], api_name="loss_scale",
                      api_visibility="private", show_progress="hidden", queue=False)
    summarised = [basics.dataset, basics.loss, basics.batch_size, basics.epochs, *live.sliders]
    gr.on([control.change for control in summarised], words.first_screen, summarised, [basics.first_screen],
          api_name="first_screen", api_visibility="private", show_progress="hidden", queue=False)


def _wire_run_buttons(handlers: TrainHandlers, buttons: RunButtons, basics: RunSettings, live: LiveControls,
                      advanced: AdvancedSettings, views: train_views.Views, state: gr.State, visitor: gr.BrowserState):
    """Start (with every setting, in `TrainHandlers.start`'s order), Stop, Pause, Resume, Compare and Reset."""
    settings = [basics.dataset, basics.backbone, basics.loss, basics.batch_size, basics.epochs, basics.lr, basics.seed,
                *live.sliders, advanced.snapshot_every, advanced.eval_every, basics.folder_path, basics.zip_file,
                advanced.schedule, advanced.val_classes, advanced.store_dtype, advanced.reduction, views.focus_classes,
                advanced.class_lr, advanced.adam_eps, advanced.loss_scale, basics.hub_dataset]
    notice = views.notice
    started = buttons.start.click(handlers.start, [*settings, visitor], [state, notice], api_name="start",
                        api_visibility="private")
    buttons.stop.click(handlers.stop, [state, visitor], [notice], api_name="stop", api_visibility="private")
    buttons.pause.click(handlers.pause, [state, visitor], [notice], api_name="pause", api_visibility="private")
    buttons.resume.click(handlers.resume, [state, visitor], [notice, views.follow], api_name="resume",
                         api_visibility="private")
    buttons.baseline.click(handlers.compare, [state, visitor], [notice], api_name="compare_baseline",
                           api_visibility="private")
    # RESET_SETTINGS's controls in its order, then the loss scale, the classes shown and the answers beside them
    reset = buttons.reset.click(handlers.reset, [state, visitor], [
        state, notice, *live.sliders, basics.batch_size, basics.epochs, basics.lr, basics.seed, advanced.schedule,
        advanced.val_classes, advanced.store_dtype, advanced.reduction, advanced.class_lr, advanced.adam_eps,
        basics.loss, advanced.loss_scale, views.focus_classes, live.notice, views.classes_notice],
        api_name="reset", api_visibility="private")
    return started, reset


def _wire_past_runs(handlers: past_runs.PastRunsHandlers, picker: past_runs.PastRuns, after: tuple,
                    views: train_views.Views, state: gr.State, visitor: gr.BrowserState):
    """The runs on this server: listed anew when the list is opened and after each of `after` (Start's and Reset's
    events: the page follows its usual run again), and the run picked shown."""
    # queue=False: it only reads the runs, answered at once while the visitor opens the list
    picker.choice.focus(handlers.listed, [state, visitor], [picker.choice], api_name="list_runs_on_page",
                        api_visibility="private", show_progress="hidden", queue=False)
    for event, name in zip(after, ("list_runs_after_start", "list_runs_after_reset"), strict=True):
        event.then(handlers.listed, [state, visitor], [picker.choice], api_name=name, api_visibility="private",
                   show_progress="hidden", queue=False)
    picker.choice.input(handlers.pick, [state, picker.choice, visitor],
                        [state, views.follow, picker.summary, picker.download], api_name="pick_run",
                        api_visibility="private", show_progress="hidden")
