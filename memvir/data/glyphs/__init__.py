"""The embedded dataset: Unicode characters rendered in twelve DejaVu faces, offline.

- `dataset`: the `glyphs` and `glyphs-mini` splits, and `glyphs-pretrain` / `glyphs-few` (pretraining, fine-tuning):
  `load_glyphs` for one of `GLYPH_VARIANTS`, each split a `GlyphDataset`; `GLYPH_MEAN` and `GLYPH_STD`, its
  normalisation.
- `render`: which characters, which faces (`fonts/`), how each becomes an image (`GlyphRenderer`).
- `query`: a query image brought to the renders' terms (`glyph_query`).
- `cache`: the on-disk cache of rendered classes.
- `misdrawn`: faces whose glyph for a character draws another character (`misdrawn_faces`), a fault the .notdef
  check cannot see.

`from memvir.data.glyphs import load_glyphs`, and so for each name given with its part above. The parts are imported
with the package, as `memvir.data`'s are (its registry loads them anyway). Most callers want
`memvir.data.load_dataset("glyphs")`.
"""

from memvir.data.glyphs.dataset import GLYPH_MEAN, GLYPH_STD, GLYPH_VARIANTS, GlyphDataset, load_glyphs
from memvir.data.glyphs.misdrawn import misdrawn_faces
from memvir.data.glyphs.query import glyph_query
from memvir.data.glyphs.render import GlyphRenderer

__all__ = [
    "GLYPH_MEAN",
    "GLYPH_STD",
    "GLYPH_VARIANTS",
    "GlyphDataset",
    "GlyphRenderer",
    "glyph_query",
    "load_glyphs",
    "misdrawn_faces",
]
