"""Settings that suit each embedded dataset, put into the Train tab's controls when the visitor picks the dataset.

glyphs-mini has 288 training images: at the library's batch of 128 a run of 8 epochs is 16 steps, which ends before
the library's warm-up and gap (2 epochs, then M + 1 = 51 steps) let a single virtual set arrive. Its preset trains
in batches of 32 with a short warm-up and gap, so all its virtual sets arrive early in a run of the default length.
glyphs keeps the library's defaults (chosen in docs/benchmarks.md). A folder or a zip keeps what the controls hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from memvir.train import TrainConfig


@dataclass(frozen=True)
class Preset:
    batch_size: int
    memvir_n: int
    memvir_m: int
    warmup_epochs: float
    note: str  # what the visitor is told: the settings, and when the virtual sets arrive


_LIBRARY = TrainConfig()
PRESETS = {
    # 12,252 training images: 95 steps an epoch; warm-up 190 steps, then a set every 51 steps
    "glyphs": Preset(_LIBRARY.batch_size, _LIBRARY.memvir_n, _LIBRARY.memvir_m, _LIBRARY.warmup_epochs,
                     "Settings for glyphs (the library's defaults): batch 128, N = 2, M = 50, warm-up 2 epochs. At "
                     "95 steps an epoch, the virtual sets arrive at steps 241 and 292."),
    # 288 training images: 9 steps an epoch; warm-up 9 steps, then a set every 11 steps
    "glyphs-mini": Preset(32, 3, 10, 1.0,
                          "Settings for glyphs-mini: batch 32, N = 3, M = 10, warm-up 1 epoch. At 9 steps an "
                          "epoch, the virtual sets arrive at steps 20, 31 and 42."),
}


def suggest_settings(dataset):
    """(batch size, N, M, warm-up, notice) for the dataset just picked; unchanged controls for a folder or a zip."""
    preset = PRESETS.get(dataset)
    if preset is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
    return preset.batch_size, preset.memvir_n, preset.memvir_m, preset.warmup_epochs, preset.note
