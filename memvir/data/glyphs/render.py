"""Rendering the glyph classes: which characters, in which twelve faces, and how each becomes a small image.

A class is one Unicode character; its twelve clean samples are that character in the twelve DejaVu faces shipped in
`fonts/`. A character is kept only if every face has a real glyph for it (not the .notdef box, not blank), and only
if none of its renders equals a render of a character kept before it. So Greek Alpha (identical to Latin A in all
twelve faces) and Cyrillic A (identical in the eight Sans and Sans Mono faces; only DejaVu Serif draws it apart) both
give way to Latin A, and every image of the dataset belongs to exactly one class: no retrieval query has an
identical twin under another label.

A face can also map a character to a real glyph that is another character's (DejaVu Serif Bold draws MODIFIER LETTER
CAPITAL T with its "S"): `memvir.data.glyphs.misdrawn` finds such faces, and the dataset drops those images only, after
the classes are chosen here.
"""

import hashlib
import unicodedata
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from memvir.data.errors import DatasetError

FONT_DIR = Path(__file__).parent / "fonts"

# Sans, Serif and Sans Mono, each regular, bold, oblique (italic) and bold-oblique.
FACE_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
)
NUM_FACES = len(FACE_FILES)

# Unicode blocks (first, last code point) of the scripts and symbol sets that all twelve faces cover well. About
# 2,300 of their characters have a real glyph in every face.
SCRIPT_BLOCKS = (
    ("Basic Latin", 0x0021, 0x007E),
    ("Latin-1 Supplement", 0x00A1, 0x00FF),
    ("Latin Extended-A", 0x0100, 0x017F),
    ("Latin Extended-B", 0x0180, 0x024F),
    ("IPA Extensions", 0x0250, 0x02AF),
    ("Spacing Modifier Letters", 0x02B0, 0x02FF),
    ("Greek and Coptic", 0x0370, 0x03FF),
    ("Cyrillic", 0x0400, 0x04FF),
    ("Cyrillic Supplement", 0x0500, 0x052F),
    ("Armenian", 0x0530, 0x058F),
    ("Georgian", 0x10A0, 0x10FF),
    ("Phonetic Extensions", 0x1D00, 0x1DBF),
    ("Latin Extended Additional", 0x1E00, 0x1EFF),
    ("Greek Extended", 0x1F00, 0x1FFF),
    ("General Punctuation", 0x2010, 0x205E),
    ("Superscripts and Subscripts", 0x2070, 0x209F),
    ("Currency Symbols", 0x20A0, 0x20CF),
    ("Letterlike Symbols", 0x2100, 0x214F),
    ("Number Forms", 0x2150, 0x218F),
    ("Arrows", 0x2190, 0x21FF),
    ("Mathematical Operators", 0x2200, 0x22FF),
    ("Miscellaneous Technical", 0x2300, 0x23FF),
    ("Box Drawing", 0x2500, 0x257F),
    ("Block Elements", 0x2580, 0x259F),
    ("Geometric Shapes", 0x25A0, 0x25FF),
    ("Miscellaneous Symbols", 0x2600, 0x26FF),
    ("Dingbats", 0x2700, 0x27BF),
    ("Supplemental Arrows-A", 0x27F0, 0x27FF),
    ("Miscellaneous Mathematical Symbols-B", 0x2980, 0x29FF),
    ("Supplemental Mathematical Operators", 0x2A00, 0x2AFF),
    ("Miscellaneous Symbols and Arrows", 0x2B00, 0x2BFF),
    ("Latin Extended-C", 0x2C60, 0x2C7F),
    ("Supplemental Punctuation", 0x2E00, 0x2E7F),
    ("Latin Extended-D", 0xA720, 0xA7FF),
)

# Unicode categories that are not a drawable character on their own: combining marks (they need a base letter),
# controls, format characters, separators, private use, surrogates and unassigned code points.
_NON_STANDALONE_CATEGORIES = frozenset({"Mn", "Mc", "Me", "Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})

# A code point no font has a glyph for: rendering it shows each face's .notdef box, which a missing glyph also shows.
_MISSING_CODE_POINT = 0x10FFFF


def candidate_code_points() -> list[int]:
    """All code points of `SCRIPT_BLOCKS` that are standalone characters, ascending (before any font check)."""
    return [
        code_point
        for _, first, last in SCRIPT_BLOCKS
        for code_point in range(first, last + 1)
        if unicodedata.category(chr(code_point)) not in _NON_STANDALONE_CATEGORIES
    ]


def class_name(code_point: int) -> str:
    """The display name of a glyph class: the character and its code point, e.g. "Ж U+0416"."""
    return f"{chr(code_point)} U+{code_point:04X}"


def fit_size(image_size: int) -> int:
    """The side of the box a glyph's ink is fitted into: the canvas less a margin of max(1, size // 16) pixels on
    each side (queries drawn by hand are framed the same way: memvir.data.glyphs.query)."""
    return image_size - 2 * max(1, image_size // 16)


class GlyphRenderer:
    """Renders one character in all twelve faces onto square canvases of `image_size` pixels (uint8, ink = 255).

    The font size is three quarters of the canvas, the same for every character, so relative sizes survive ("o" is
    smaller than "O", "." is a dot); each glyph is centred by its ink bounding box, and one that would not fit
    inside the canvas less a small margin is scaled down to fit. Text layout is Pillow's basic engine, so the pixels
    do not depend on whether libraqm is installed.
    """

    def __init__(self, image_size: int):
        self.image_size = image_size
        self.font_size = round(image_size * 0.75)
        self.fit_size = fit_size(image_size)
        self.fonts = [self._load_font(FONT_DIR / file_name) for file_name in FACE_FILES]
        self.missing_glyphs = [self._ink(font, _MISSING_CODE_POINT) for font in self.fonts]

    def _load_font(self, path: Path) -> ImageFont.FreeTypeFont:
        if not path.is_file():
            raise DatasetError(f"glyph font file {path} is missing: the package must ship the twelve DejaVu faces")
        return ImageFont.truetype(str(path), self.font_size, layout_engine=ImageFont.Layout.BASIC)

    def _ink(self, font: ImageFont.FreeTypeFont, code_point: int) -> np.ndarray:
        """The glyph's anti-aliased ink, cropped to its bounding box (an empty array when nothing is drawn)."""
        # A scratch canvas three times the font size holds any glyph drawn around its centre, overhangs included.
        scratch_size = 3 * self.font_size
        scratch = Image.new("L", (scratch_size, scratch_size))
        centre = scratch_size / 2
        ImageDraw.Draw(scratch).text((centre, centre), chr(code_point), font=font, fill=255, anchor="mm")
        pixels = np.asarray(scratch)
        rows = np.flatnonzero(pixels.any(axis=1))
        if rows.size == 0:
            return pixels[:0, :0]
        columns = np.flatnonzero(pixels.any(axis=0))
        return pixels[rows[0] : rows[-1] + 1, columns[0] : columns[-1] + 1]

    def _place(self, ink: np.ndarray) -> np.ndarray:
        """The ink centred on a blank canvas, scaled down (aspect kept) when larger than the fit box."""
        height, width = ink.shape
        if max(height, width) > self.fit_size:
            scale = self.fit_size / max(height, width)
            height, width = max(1, round(height * scale)), max(1, round(width * scale))
            ink = np.asarray(Image.fromarray(ink).resize((width, height), Image.Resampling.LANCZOS))
        canvas = np.zeros((self.image_size, self.image_size), dtype=np.uint8)
        top, left = (self.image_size - height) // 2, (self.image_size - width) // 2
        canvas[top : top + height, left : left + width] = ink
        return canvas

    def render(self, code_point: int) -> np.ndarray | None:
        """The twelve clean renders [12, H, W] of the character, or None if any face lacks a real, visible glyph."""
        renders = np.empty((NUM_FACES, self.image_size, self.image_size), dtype=np.uint8)
        for face, (font, missing) in enumerate(zip(self.fonts, self.missing_glyphs, strict=True)):
            ink = self._ink(font, code_point)
            if ink.size == 0 or (ink.shape == missing.shape and np.array_equal(ink, missing)):
                return None
            renders[face] = self._place(ink)
        if not renders.any(axis=(1, 2)).all():
            return None
        return renders


def render_glyph_classes(
    code_points: Iterable[int], image_size: int, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Render candidate characters in order; keep those every face draws and whose renders are all new.

    Returns (kept code points int32 [n], clean renders uint8 [n, 12, H, W]). A character is dropped when any of its
    twelve renders equals any render of a character kept earlier, so the first code point of a look-alike group
    survives. With `limit`, stops once that many classes are kept.
    """
    renderer = GlyphRenderer(image_size)
    kept_code_points: list[int] = []
    kept_renders: list[np.ndarray] = []
    seen_images: set[bytes] = set()
    for code_point in code_points:
        if limit is not None and len(kept_code_points) >= limit:
            break
        renders = renderer.render(code_point)
        if renders is None:
            continue
        digests = {hashlib.blake2b(render.tobytes(), digest_size=16).digest() for render in renders}
        if not seen_images.isdisjoint(digests):
            continue
        seen_images.update(digests)
        kept_code_points.append(code_point)
        kept_renders.append(renders)
    shape = (len(kept_renders), NUM_FACES, image_size, image_size)
    stacked = np.stack(kept_renders) if kept_renders else np.zeros(shape, dtype=np.uint8)
    return np.asarray(kept_code_points, dtype=np.int32), stacked
