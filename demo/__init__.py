"""MemVir Studio's front end: the Gradio page that drives the `memvir` library (no training logic here).

- `page`: the page (header, two tabs, the poll timer), assembled into an `App`; `static/`: its styles and script.
- `api`: the client API, the app's public endpoints: `gr.api` functions of plain values that call the runs and the
  retrieval service.
- `train/`: the Train tab. `retrieve/`: the Retrieve tab.
- `runs/`: training runs in processes of their own. `umap/`: UMAP in a process of its own.
- `common/`: what every part shares: handlers, settings, allowed paths, cores, uploads.
"""
