"""Test-wide settings: no test may touch the network, and gradio must not phone home."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ.setdefault("TQDM_DISABLE", "1")
