"""A query image brought to the glyph renders' terms: white ink on black, grayscale, framed as the renderer frames.

Visitors upload dark-on-light scans and draw on white canvases at any size; the glyph models were trained on white
ink on black, centred with the renderer's margin (memvir.data.glyphs.render). `glyph_query` turns one into the
other before the model's own preprocessing (`EmbeddingModel.preprocess`) resizes and normalises it.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from memvir.data.errors import DatasetError
from memvir.data.glyphs.render import fit_size

_INK = 32  # pixel values above this count as ink when a drawing is cropped to it


def flatten_alpha(image: Image.Image) -> Image.Image:
    """RGB on white: a sketch's transparent background must read as paper, not as black."""
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        paper = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(paper, rgba).convert("RGB")
    return image.convert("RGB")


def glyph_query(image: Image.Image, image_size: int, fit_ink: bool) -> Image.Image:
    """A query as the glyph renders are: white ink on black, grayscale.

    Polarity follows the border (the background): a dark-on-light upload or sketch is inverted. With `fit_ink`
    (a sketch, drawn at any size on a large canvas) the ink is cropped and centred with the renderer's margin, so it
    fills the frame as a rendered glyph does. DatasetError for a drawing with no ink.
    """
    gray = np.asarray(flatten_alpha(image).convert("L"), dtype=np.uint8)
    border = np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    if np.median(border) > 127:
        gray = 255 - gray
    if not fit_ink:
        return Image.fromarray(gray)
    rows, columns = np.flatnonzero((gray > _INK).any(axis=1)), np.flatnonzero((gray > _INK).any(axis=0))
    if rows.size == 0:
        raise DatasetError("the drawing is empty: draw a character on the sketchpad first")
    ink = gray[rows[0]: rows[-1] + 1, columns[0]: columns[-1] + 1]
    side = int(np.ceil(max(ink.shape) * image_size / fit_size(image_size)))  # the renderer's margin, in proportion
    canvas = np.zeros((side, side), dtype=np.uint8)
    top, left = (side - ink.shape[0]) // 2, (side - ink.shape[1]) // 2
    canvas[top: top + ink.shape[0], left: left + ink.shape[1]] = ink
    return Image.fromarray(canvas)
