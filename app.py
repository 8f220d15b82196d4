"""MemVir Studio: `python app.py` serves the page on http://127.0.0.1:7860.

GRADIO_SERVER_NAME and GRADIO_SERVER_PORT move it (Hugging Face Spaces sets them); MEMVIR_APP_DATA,
MEMVIR_CHECKPOINTS, MEMVIR_MAX_RUNS and MEMVIR_UMAP are described in demo/settings.py. The page is served before
torch loads; a background thread imports the trainer meanwhile, so the first Start does not wait for it.
"""

import os
import threading

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no phoning home: the app works offline


def _warm_up() -> None:
    """Import what Start and Search need while the first visitor reads the page."""
    import memvir.index  # noqa: F401
    import memvir.projection  # noqa: F401
    import memvir.train  # noqa: F401
    from memvir.models import EmbeddingModel  # noqa: F401


def main() -> None:
    from demo.settings import AppSettings

    settings = AppSettings.from_env()
    settings.gradio_dir.mkdir(parents=True, exist_ok=True)
    # Gradio writes uploads into its cache folder; keep it inside the app's own folder. Set before gradio loads.
    os.environ.setdefault("GRADIO_TEMP_DIR", str(settings.gradio_dir))

    from demo.ui import CSS, THEME, build_app

    app = build_app(settings)
    threading.Thread(target=_warm_up, name="memvir-warm-up", daemon=True).start()
    try:
        # server_name / server_port default to GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, else 127.0.0.1:7860.
        app.launch(theme=THEME, css=CSS, max_file_size=settings.max_zip_bytes)
    finally:
        app.figure_builder.close()
        app.run_manager.close()  # runs still training stop at their next step and save a checkpoint


if __name__ == "__main__":
    main()
