"""The page: a header and two tabs (demo.train.tab, demo.retrieve.tab), the visitor's key, the poll timer and
the load event, assembled into an `App` with what serves it; its styles (demo/static/page.css) and script
(demo/static/page.js).

Every event has an explicit api_name and is private: a program calls the client API (demo.api), not the page.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from demo import api as client_api
from demo.common import shims
from demo.common.inputs import InputRefused, check_text
from demo.common.settings import AppSettings
from demo.retrieve import tab as retrieve_tab
from demo.retrieve.service import RetrievalService
from demo.runs.audience import POLL_SECONDS
from demo.runs.manager import RunManager
from demo.train import tab as train_tab
from demo.train.live_view import FigureBuilder
from demo.train.past_runs import PastRunsHandlers
from demo.train.poll import current_state
from memvir.memory.size import format_bytes

log = logging.getLogger(__name__)
CSS = (Path(__file__).parent / "static" / "page.css").read_text(encoding="utf-8")
JS = (Path(__file__).parent / "static" / "page.js").read_text(encoding="utf-8")
THEME = gr.themes.Soft(primary_hue="blue", secondary_hue="orange")
# Gradio's queue looks for new events every millisecond while it has none (on Linux; 50 ms on Windows): a thousand
# wake-ups a second of the server, idle or not, and on a machine whose every core trains a run each one takes a core
# from a training thread (demo.common.cores). The polls do not go through the queue (demo.train.views), only clicks,
# uploads and searches: every 100 ms starts one about 50 ms later on average, which nobody sees; progress messages,
# every 10 ms, go every 100 ms, gradio's own Windows pace.
QUEUE_IDLE_CHECK_S = 0.1
PROGRESS_CHECK_S = 0.1
HEADER = ("# MemVir Studio\nDeep metric learning with **memory-based virtual classes** (Ko, Gu and Kim, ICCV 2021): "
          "past steps' embeddings and class weights join the loss as extra classes, one more set every M+1 steps "
          "after a warm-up. Train here and watch it happen, then search with the model.")


# Besides file uploads (gradio's upload route, bounded by launch's max_file_size and written to disk as they come), a
# request carries an event's texts (each at most demo.common.inputs.MAX_TEXT_CHARS) and numbers, files named by the
# path their upload gave, or one part of a drawing (an image): one image's bytes and this margin bound them all.
REQUEST_MARGIN_BYTES = 2**20


def request_bytes_limit(settings: AppSettings) -> int:
    """The largest request body the app reads, file uploads aside."""
    return settings.max_image_bytes + REQUEST_MARGIN_BYTES


@dataclass(frozen=True)
class App:
    """The page and what serves it: the runs, the retrieval service, the settings, and the figures' drawing thread.
    Gradio 6 takes the theme, the CSS and the script at launch, so `launch` passes them."""

    blocks: gr.Blocks
    run_manager: RunManager
    retrieval_service: RetrievalService
    settings: AppSettings
    figure_builder: FigureBuilder

    def launch(self, **options) -> None:
        """Serve the page (gr.Blocks.launch's options). The checkpoint zips offered for download lie in the app's
        downloads folder, and Gradio serves no file outside the working and temporary folders unless allowed: a
        Space keeps the app's data folder in its persistent storage, /data, outside both. Every request but a file
        upload is refused past `request_bytes_limit` before it is read (demo.common.shims.bounded_request_bodies)."""
        allowed = [*(options.pop("allowed_paths", None) or []), str(self.settings.downloads_dir)]
        app_kwargs = dict(options.pop("app_kwargs", None) or {})
        app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), shims.bounded_request_bodies(
            request_bytes_limit(self.settings), advice=f"send images as uploaded files, up to "
            f"{format_bytes(self.settings.max_image_bytes)} each")]
        shims.set_queue_timing(self.blocks, QUEUE_IDLE_CHECK_S, PROGRESS_CHECK_S)
        # The footer keeps gradio's API page (the client API, demo.api) and drops its "Runs" (gradio's own history
        # of API calls, which a visitor took for training runs), settings and "built with" links.
        options.setdefault("footer_links", ["api"])
        self.blocks.launch(theme=THEME, css=CSS, js=JS, allowed_paths=allowed, app_kwargs=app_kwargs, **options)

    def close(self) -> None:
        """Close the server if it runs, then stop the figures' thread and every run (which saves a checkpoint)."""
        self.blocks.close(verbose=False)
        self.figure_builder.close()
        self.run_manager.close()


class PageHandlers:
    """The page's own handler, bound to the runs and the retrieval service: the load event. `build_app` wires the
    bound method; tests call it the same way."""

    def __init__(self, runs: RunManager, retrieval: RetrievalService):
        self.runs = runs
        self.retrieve = retrieve_tab.RetrieveHandlers(retrieval)  # the checkpoint list, as the tab's select fills it

    def load(self, visitor=None, oauth_token: gr.OAuthToken | None = None, request: gr.Request = None):
        """A page just (re)opened: the visitor's key, their run shown again, the Push button, the live sliders at
        the run's values, the checkpoint choices."""
        # A first visit keeps this session's key: a Start pressed before this load event returns was made under it
        # (demo.common.handlers.visitor_key), so that run stays the visitor's own rather than "another visitor's".
        visitor = visitor or getattr(request, "session_hash", None) or uuid.uuid4().hex
        try:
            check_text(visitor, "the visitor key")
        except InputRefused as error:  # not a key this app made (the browser's storage was edited): a fresh one
            log.warning("load refused the page's visitor key: %s", error)
            visitor = uuid.uuid4().hex
        state, push_button, push_note = train_tab.opened(self.runs, visitor, oauth_token)
        state = current_state(self.runs, state, request)  # a Start (or Reset) this page made before its load ended
        return (visitor, state, push_button, push_note, *train_tab.live_values(self.runs, state.run_id),
                self.retrieve.checkpoint_list())


def build_app(settings: AppSettings | None = None, runs: RunManager | None = None,
              retrieval: RetrievalService | None = None) -> App:
    """The whole page. `runs` and `retrieval` default to fresh ones for `settings` (from the environment)."""
    settings = settings or AppSettings.from_env()
    runs = runs or RunManager(settings)
    retrieval = retrieval or RetrievalService(settings, uploads_in_use=runs.dataset_folders_in_use)
    figures = FigureBuilder()
    with gr.Blocks(title="MemVir Studio") as blocks:
        visitor = gr.BrowserState("", storage_key="memvir-studio-visitor")
        timer = gr.Timer(POLL_SECONDS)  # outside the tabs: it polls whichever tab is open
        gr.Markdown(HEADER)
        with gr.Tabs():
            train = train_tab.build(runs, figures, visitor, timer)
            checkpoint = retrieve_tab.build(retrieval)
        client_api.register(runs, retrieval)  # the client API (demo.api): the endpoints a program calls
        # queue=False: every tab sends it once as it opens, and it only reads (the visitor's run, the checkpoint
        # list), so tabs must not wait in line for one another's (docs/benchmarks.md, "Many watchers").
        blocks.load(PageHandlers(runs, retrieval).load, [visitor],
                    [visitor, train.state, train.push_button, train.push_note, *train.sliders, checkpoint],
                    api_name="load",
                    api_visibility="private", queue=False).then(
            PastRunsHandlers(runs).listed, [train.state, visitor], [train.past_runs], api_name="list_runs_on_load",
            api_visibility="private", show_progress="hidden", queue=False)
    shims.without_file_per_request(blocks)
    return App(blocks, runs, retrieval, settings, figures)
