"""MemVir Studio front end: the Gradio app, its run manager and its plotly figures (no training logic here)."""
