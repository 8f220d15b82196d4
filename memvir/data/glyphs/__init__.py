"""The embedded dataset: Unicode characters rendered in twelve DejaVu faces, offline.

- `dataset`: the `glyphs` and `glyphs-mini` splits, and `glyphs-pretrain` / `glyphs-few` (pretraining, fine-tuning).
- `render`: which characters, which faces (`fonts/`), how each becomes an image.
- `query`: a query image brought to the renders' terms.
- `cache`: the on-disk cache of rendered classes.
"""
