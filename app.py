"""MemVir Studio: `python app.py` serves the page on http://127.0.0.1:7860.

GRADIO_SERVER_NAME and GRADIO_SERVER_PORT move it (Hugging Face Spaces sets them); MEMVIR_APP_DATA,
MEMVIR_CHECKPOINTS, MEMVIR_MAX_RUNS, MEMVIR_UMAP, MEMVIR_MEMORY_BUDGET, MEMVIR_ALLOWED_FOLDERS and
MEMVIR_SERVER_PRIORITY are described in demo.common.settings. Until torch and the trainer are imported (a few
seconds), the port serves a page that says the app is starting and opens it once it is ready
(demo.common.starting_page).
"""

import importlib
import importlib.util
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no phoning home: the app works offline

from memvir._hub_shims import turn_off_side_requests  # noqa: E402  (before anything imports huggingface_hub)

turn_off_side_requests()  # the Hub gets only the requests a visitor's pull or push makes

# light (no torch, no gradio): the starting page holds the port within a second of the start
from demo.common.cores import available_cores, limit_server_threads, training_threads, yield_to_training  # noqa: E402
from demo.common.settings import AppSettings  # noqa: E402
from demo.common.starting_page import open_starting_page  # noqa: E402


def import_lazy_dependencies() -> None:
    """Import, before the port opens, the third-party modules that the handlers and the retrieval warm-up thread
    would otherwise import on first use (the page, demo.page, imports the project's own modules): two threads
    importing one module at once (a first request and the warm-up thread, or two first requests) can each see the
    other's partially initialised module and fail with ImportError."""
    from memvir.retrieval.knn import search_backend  # here, not at the top: memvir's modules bring torch

    # Gradio wraps every request in utils.MatplotlibBackendMananger, whose matplotlib.get_backend() imports pyplot
    # where matplotlib is installed (requirements-dev.txt has it): 1-2 s of a first request on 2 busy cores.
    if importlib.util.find_spec("matplotlib") is not None:
        importlib.import_module("matplotlib.pyplot")
    search_backend()  # imports faiss where it is installed (the index and the metrics import it on first use)


def main() -> None:
    settings = AppSettings.from_env()
    cores = available_cores()
    # first, before any thread starts: on small machines the runs' processes go first
    yield_to_training(settings.server_priority, cores.count)
    threads = training_threads(settings.train_threads)
    print(f"MemVir Studio: {cores.describe()}; each run trains with {threads} thread{'s' * (threads != 1)}",
          flush=True)
    starting = open_starting_page()  # a visitor sees the app coming while gradio and torch load
    try:
        app = _build(settings)
    finally:
        if starting is not None:
            starting.close()  # the port, free for the app's own server in the next moment
    try:
        # server_name / server_port default to GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, else 127.0.0.1:7860.
        app.launch(max_file_size=settings.max_zip_bytes)
    finally:
        app.close()  # runs still training stop at their next step and save a checkpoint


def _build(settings):
    """The app, its runs' forkserver started and its handlers' modules imported, the retrieval warm-up begun."""
    # imported here, while the starting page holds the port: these bring torch, and the page gradio (seconds)
    from demo.runs.process import prepare_run_processes

    prepare_run_processes()  # the runs' processes fork from it: their imports happen now, beside the server's
    settings.gradio_dir.mkdir(parents=True, exist_ok=True)
    # Gradio writes uploads into its cache folder; keep it inside the app's own folder. Set before gradio loads.
    os.environ.setdefault("GRADIO_TEMP_DIR", str(settings.gradio_dir))

    from demo.page import build_app  # after GRADIO_TEMP_DIR: gradio reads it when it loads

    import_lazy_dependencies()
    limit_server_threads()  # training has processes of its own (demo.runs.process)
    app = build_app(settings)
    app.retrieval_service.warm_up()  # the default checkpoint's first search, ready while the page loads
    return app


if __name__ == "__main__":
    main()
