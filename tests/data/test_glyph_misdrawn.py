"""memvir.data.glyphs.misdrawn: a face whose glyph for a character is another character's glyph.

The references come from fontTools, which reads the fonts' own character maps and outlines, and from arithmetic
written here: DejaVu Serif Bold's glyphs for MODIFIER LETTER CAPITAL T, U and W are checked point by point against
the same face's "S", "T" and "U", each axis scaled and shifted by a straight-line fit.
"""

import numpy as np
import pytest
from fontTools.ttLib import TTFont

from memvir.data import load_dataset
from memvir.data.glyphs.misdrawn import base_likeness, compatibility_base, copied_characters, misdrawn_faces
from memvir.data.glyphs.render import FACE_FILES, FONT_DIR, GlyphRenderer

SERIF_BOLD = FACE_FILES.index("DejaVuSerif-Bold.ttf")
SERIF_ITALIC = FACE_FILES.index("DejaVuSerif-Italic.ttf")
SANS_MONO = FACE_FILES.index("DejaVuSansMono.ttf")
# DejaVu Serif Bold's modifier capitals T, U, W hold the glyphs of S, T, U: shifted by one letter.
SHIFTED = {0x1D40: ord("S"), 0x1D41: ord("T"), 0x1D42: ord("U")}


@pytest.fixture(scope="module")
def fonts():
    return [TTFont(FONT_DIR / file_name, lazy=True) for file_name in FACE_FILES]


def outline(font: TTFont, code_point: int) -> tuple[np.ndarray, tuple, list[int]]:
    """The glyph's points (font units, [n, 2]), its contour ends and its on-curve bits, read through the cmap."""
    glyph_table = font["glyf"]
    coordinates, ends, flags = glyph_table[font.getBestCmap()[code_point]].getCoordinates(glyph_table)
    return np.asarray(coordinates, dtype=np.float64).reshape(-1, 2), tuple(ends), [flag & 1 for flag in flags]


def scaled_copy_residual(points: np.ndarray, model: np.ndarray) -> tuple[float, np.ndarray]:
    """Fit points = scale * model + shift on each axis by least squares: (largest miss in font units, the scales)."""
    misses, scales = [], []
    for axis in range(2):
        scale, shift = np.polyfit(model[:, axis], points[:, axis], 1)
        misses.append(np.abs(scale * model[:, axis] + shift - points[:, axis]).max())
        scales.append(scale)
    return float(max(misses)), np.array(scales)


@pytest.mark.parametrize(("code_point", "drawn"), sorted(SHIFTED.items()))
def test_serif_bold_draws_the_modifier_capital_with_another_letters_outline(fonts, code_point, drawn):
    points, ends, on_curve = outline(fonts[SERIF_BOLD], code_point)
    model_points, model_ends, model_on_curve = outline(fonts[SERIF_BOLD], drawn)
    # the same contours point for point, each axis shrunk to superscript size and moved up
    assert (ends, on_curve) == (model_ends, model_on_curve)
    miss, scales = scaled_copy_residual(points, model_points)
    assert miss <= 1.0  # the copy's points are the model's, rounded to whole font units
    assert np.all((scales > 0.4) & (scales < 0.8))
    # the character it should be (its base) has another outline in that face
    base_points, base_ends, _ = outline(fonts[SERIF_BOLD], compatibility_base(code_point))
    assert len(base_points) != len(points) or base_ends != ends
    # every other face draws the character with an outline of its own, not a copy of that letter's
    for face, font in enumerate(fonts):
        if face == SERIF_BOLD:
            continue
        points, ends, on_curve = outline(font, code_point)
        model_points, model_ends, model_on_curve = outline(font, drawn)
        if (ends, on_curve) == (model_ends, model_on_curve):
            assert scaled_copy_residual(points, model_points)[0] > 10.0, FACE_FILES[face]


def test_the_check_flags_serif_bold_and_names_the_letter_drawn():
    for code_point, drawn in SHIFTED.items():
        assert misdrawn_faces(code_point) == {SERIF_BOLD: drawn}


def test_compatibility_base_is_the_single_character_nfkd_gives():
    assert compatibility_base(0x1D40) == ord("T")  # <super> 0054
    assert compatibility_base(0x2082) == ord("2")  # SUBSCRIPT TWO
    assert compatibility_base(ord("T")) is None  # no decomposition
    assert compatibility_base(0x01C6) is None  # dž: two characters
    assert compatibility_base(0x00E9) is None  # é: a letter and a combining mark
    assert misdrawn_faces(ord("S")) == {}  # nothing says what it should look like, so it is not checked


def test_a_style_far_from_the_base_is_not_a_fault():
    # DejaVu Serif Italic's superscript g is single-storey, its g double-storey; DejaVu Sans Mono squeezes the oe
    # ligature into one cell. Each face's picture is far from its base's, but no other character's glyph is copied.
    for code_point, face in ((0x1D4D, SERIF_ITALIC), (0xA7F9, SANS_MONO)):
        likeness = base_likeness(code_point, compatibility_base(code_point))
        assert np.median(np.delete(likeness, face)) - likeness[face] > 0.5
        assert copied_characters(face, code_point) == []
        assert misdrawn_faces(code_point) == {}


def test_a_copy_of_a_look_alike_of_the_base_is_not_a_fault():
    # MODIFIER LETTER CAPITAL A in DejaVu Serif is a scaled copy of Greek Alpha and Cyrillic A, which look like "A"
    serif = FACE_FILES.index("DejaVuSerif.ttf")
    assert {0x0391, 0x0410} <= set(copied_characters(serif, 0x1D2C))
    assert misdrawn_faces(0x1D2C) == {}


@pytest.fixture(scope="module")
def glyph_splits():
    return load_dataset("glyphs")


@pytest.fixture(scope="module")
def glyph_class_code_points(glyph_splits):
    splits = (glyph_splits.train, glyph_splits.test)
    return sorted(int(code_point) for split in splits for code_point in split.code_points)


def test_every_face_maps_every_glyph_class_character(fonts, glyph_class_code_points):
    for file_name, font in zip(FACE_FILES, fonts, strict=True):
        character_map = font.getBestCmap()
        lacking = [f"U+{code_point:04X}" for code_point in glyph_class_code_points if code_point not in character_map]
        assert lacking == [], f"{file_name} has no glyph for {lacking}"


@pytest.mark.slow
def test_among_the_glyph_classes_only_the_shifted_serif_bold_capitals_are_flagged(glyph_class_code_points):
    flagged = {code_point: faces for code_point in glyph_class_code_points if (faces := misdrawn_faces(code_point))}
    assert flagged == {code_point: {SERIF_BOLD: drawn} for code_point, drawn in SHIFTED.items()}


def test_the_dataset_drops_the_misdrawn_images_and_keeps_their_classes(glyph_splits):
    faces_of = {}
    for split in (glyph_splits.train, glyph_splits.test):
        for index in range(len(split)):
            label = int(split.labels[index])
            pixels = np.asarray(split.image(index))
            assert pixels.any()
            faces_of.setdefault(int(split.code_points[label]), []).append(pixels)
    # 2,042 classes as before; the three shifted capitals keep eleven faces, every other class all twelve
    assert len(faces_of) == 2042
    assert {code_point for code_point, images in faces_of.items() if len(images) != 12} == set(SHIFTED)
    assert all(len(faces_of[code_point]) == 11 for code_point in SHIFTED)
    # the face dropped is Serif Bold's: the eleven kept are the other faces' renders, in face order
    renderer = GlyphRenderer(glyph_splits.info.image_size)
    for code_point in SHIFTED:
        expected = np.delete(renderer.render(code_point), SERIF_BOLD, axis=0)
        np.testing.assert_array_equal(np.stack(faces_of[code_point]), expected)
