"""Faces whose glyph for a character draws another character: a font fault a cmap check cannot see.

A face can map a code point to a glyph of its own that is a copy of some other character's glyph (DejaVu Serif Bold
draws MODIFIER LETTER CAPITAL T as a small "S"). The glyph is real, not the .notdef box, so only its shape can tell.
A character with a compatibility decomposition to one base character (NFKD: "ᵀ" is a superscript "T") says what it
should look like, and the other eleven faces show how alike a face draws it and its base. `misdrawn_faces` flags a
face when both hold:

- its render of the character, scaled to a common size, is far less like its own render of the base than the other
  faces' are (a style difference moves one face a little; a wrong glyph moves it far), and
- its outline of the character is a copy, up to position and scale along each axis, of its outline of a different
  character (one whose decomposition is not the base's): the glyph drawn is that character's, not a redrawing.

Characters without such a decomposition are not checked: nothing says what they should look like.
"""

from __future__ import annotations

import functools
import unicodedata
from collections import defaultdict

import numpy as np
from PIL import Image

from memvir.data.glyphs.render import FACE_FILES, FONT_DIR, GlyphRenderer, candidate_code_points

# Renders for the comparison are drawn on a canvas of this size, whatever the dataset's image size: the check is
# about the fonts, and a superscript drawn at a 32-pixel dataset size is only a few pixels tall.
_CHECK_CANVAS = 64
# The side both renders are fitted into (aspect kept) before they are compared.
_COMPARE_SIDE = 24
# How far below the other faces' median likeness to the base a face's likeness must fall to be suspect. Styles move
# a face less than this (an italic "g" drawn single-storey, a monospaced ligature squeezed into one cell); a glyph
# of another letter moves it more.
_LIKENESS_DROP = 0.5
# Two outlines are copies when their points, each axis scaled to the glyph's extent, differ by less than this share
# of the extent: a scaled copy's points are rounded to whole font units, well inside it.
_OUTLINE_TOLERANCE = 0.01


def compatibility_base(code_point: int) -> int | None:
    """The one character the code point decomposes to under NFKD ("ᵀ" -> "T"), or None when it has no such base."""
    decomposed = unicodedata.normalize("NFKD", chr(code_point))
    if len(decomposed) != 1 or decomposed == chr(code_point):
        return None
    return ord(decomposed)


def _same_base(a: int, b: int) -> bool:
    return unicodedata.normalize("NFKD", chr(a)) == unicodedata.normalize("NFKD", chr(b))


@functools.cache
def _check_renderer() -> GlyphRenderer:
    return GlyphRenderer(_CHECK_CANVAS)


def _fitted(renderer: GlyphRenderer, face: int, code_point: int) -> np.ndarray | None:
    """The face's ink for the character scaled (aspect kept) into a `_COMPARE_SIDE` square, centred; None if blank."""
    ink = renderer._ink(renderer.fonts[face], code_point)
    if ink.size == 0:
        return None
    height, width = ink.shape
    scale = _COMPARE_SIDE / max(height, width)
    height, width = max(1, round(height * scale)), max(1, round(width * scale))
    resized = np.asarray(Image.fromarray(ink).resize((width, height), Image.Resampling.BILINEAR), dtype=np.float64)
    canvas = np.zeros((_COMPARE_SIDE, _COMPARE_SIDE))
    top, left = (_COMPARE_SIDE - height) // 2, (_COMPARE_SIDE - width) // 2
    canvas[top : top + height, left : left + width] = resized
    return canvas


def _likeness(a: np.ndarray | None, b: np.ndarray | None) -> float:
    """Pearson correlation of two fitted renders (1 = the same picture); 0 when either is blank or flat."""
    if a is None or b is None:
        return 0.0
    a, b = a.ravel() - a.mean(), b.ravel() - b.mean()
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norms) if norms > 0 else 0.0


def base_likeness(code_point: int, base: int) -> np.ndarray:
    """How alike each face draws the character and its base: float [12], 1 = the same picture at a common size."""
    renderer = _check_renderer()
    return np.array(
        [
            _likeness(_fitted(renderer, face, code_point), _fitted(renderer, face, base))
            for face in range(len(FACE_FILES))
        ]
    )


@functools.cache
def _face_outlines(face: int) -> tuple[dict[int, tuple], dict[tuple, list[int]]]:
    """For one face: each candidate code point's outline (contour structure, points scaled to [0, 1] per axis), and
    the code points grouped by contour structure, so a copy is looked for only among outlines that could match."""
    # fontTools reads the glyph outlines that Pillow does not expose; imported here because only the first render
    # of the glyph dataset (and the check's tests) needs it, not every import of the data package.
    from fontTools.ttLib import TTFont

    font = TTFont(FONT_DIR / FACE_FILES[face], lazy=True)
    character_map = font.getBestCmap()
    glyph_table = font["glyf"]
    by_glyph: dict[str, tuple | None] = {}
    outlines: dict[int, tuple] = {}
    by_structure: dict[tuple, list[int]] = defaultdict(list)
    for code_point in candidate_code_points():
        glyph_name = character_map.get(code_point)
        if glyph_name is None:
            continue
        if glyph_name not in by_glyph:
            coordinates, contour_ends, flags = glyph_table[glyph_name].getCoordinates(glyph_table)
            points = np.asarray(coordinates, dtype=np.float64).reshape(-1, 2)
            if len(points) == 0:
                by_glyph[glyph_name] = None
            else:
                points = points - points.min(axis=0)
                points = points / np.maximum(points.max(axis=0), 1.0)
                structure = (tuple(contour_ends), bytes(flag & 1 for flag in flags))  # bit 0: point on the curve
                by_glyph[glyph_name] = (structure, points)
        if by_glyph[glyph_name] is not None:
            outlines[code_point] = by_glyph[glyph_name]
            by_structure[by_glyph[glyph_name][0]].append(code_point)
    return outlines, dict(by_structure)


def copied_characters(face: int, code_point: int) -> list[int]:
    """The other candidate characters whose outline in the face equals this one's, up to position and per-axis
    scale (ascending code points; empty when the face has no outline for it)."""
    outlines, by_structure = _face_outlines(face)
    if code_point not in outlines:
        return []
    structure, points = outlines[code_point]
    return [
        other
        for other in by_structure[structure]
        if other != code_point and np.abs(outlines[other][1] - points).max() < _OUTLINE_TOLERANCE
    ]


def misdrawn_faces(code_point: int) -> dict[int, int]:
    """The faces whose glyph for the character is another character's: {face index: the character it draws}.

    Empty for a character without a one-character compatibility decomposition (see the module docstring).
    """
    base = compatibility_base(code_point)
    if base is None:
        return {}
    likeness = base_likeness(code_point, base)
    found = {}
    for face in range(len(FACE_FILES)):
        others = np.median(np.delete(likeness, face))
        if others - likeness[face] < _LIKENESS_DROP:
            continue
        drawn = [other for other in copied_characters(face, code_point) if not _same_base(other, base)]
        if drawn:
            found[face] = drawn[0]
    return found
