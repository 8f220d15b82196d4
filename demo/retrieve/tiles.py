"""The Retrieve tab's results as HTML: one tile per hit, its image over a caption that gives, in full, the rank, the
class, the cosine similarity and whether the class is the query's.

A gr.Gallery writes its caption over the bottom of each square thumbnail on one line cut to the tile's width, which
hid the class and the mark; here the caption sits under the image and wraps. The images travel inside the HTML as
data URIs (a thumbnail is a few kB), so a search leaves no files behind. The mark is a word in a coloured badge whose
tick or cross is drawn by CSS (demo/static/page.css): the page ships no font with those glyphs. A same-class item the
query missed (ranked after the top k) is shown greyed, at its rank, marked "missed". A hit below the similarity
cut-off (the threshold view's) stays at its rank, dimmed and marked "below the cut-off": hiding it would hide what the
model ranked there. A search's hits are clickable: a click searches with that image (the page's script sends its
gallery and item, demo/static/page.js). Class names can come from a visitor's zip, so every text is escaped.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, replace

from PIL import Image

from memvir.retrieval.diagnosis.verification import matches

# Hit.same_class -> (CSS class, the words shown); None (no class to compare) shows no mark.
MARKS = {True: ("same", "same class"), False: ("other", "other class")}
MISSED = ("missed", "missed")
BELOW_CUTOFF = ("below-cutoff", "below the cut-off")
# Dimmed beside the tiles at or above the cut-off; inline, as the page's stylesheet (demo/static/page.css) is shared.
_BELOW_CUTOFF_STYLE = "opacity: 0.4"
_BELOW_CUTOFF_MARK_STYLE = "background: #495057"


@dataclass(frozen=True)
class Tile:
    """One hit as shown: its display image (demo.retrieve.galleries.thumbnail), rank from 1, similarity, class, mark."""

    image: Image.Image
    rank: int
    score: float
    class_name: str | None
    same_class: bool | None
    missed: bool = False  # a same-class item ranked after the top k: shown greyed
    below_cutoff: bool = False  # its similarity is below the cut-off: shown dimmed
    # (gallery key, item) where a click on it searches with it (demo.retrieve.tab.search_result_tile); None: not
    clickable: tuple[str, int] | None = None


def _mark(tile: Tile) -> tuple[str, str | None]:
    return MISSED if tile.missed else MARKS.get(tile.same_class, ("", None))


def data_uri(image: Image.Image) -> str:
    """The image inline: PNG for grayscale renders (crisp strokes), JPEG for photos (a fraction of PNG's bytes)."""
    buffer = io.BytesIO()
    if image.mode == "L":
        image.save(buffer, format="PNG", optimize=True)
        kind = "png"
    else:
        image.convert("RGB").save(buffer, format="JPEG", quality=85)
        kind = "jpeg"
    return f"data:image/{kind};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


def caption(tile: Tile) -> str:
    """The caption as plain text, '#1 0.979 A U+0041 same class': the image's alternative text."""
    parts = [f"#{tile.rank}", f"{tile.score:.3f}", tile.class_name, _mark(tile)[1],
             BELOW_CUTOFF[1] if tile.below_cutoff else None]
    return " ".join(part for part in parts if part)


def tile_html(tile: Tile) -> str:
    kind, words = _mark(tile)
    name = html.escape(tile.class_name) if tile.class_name else None
    lines = [f'<span class="hit-rank">#{tile.rank}</span> '
             f'<span class="hit-score" title="cosine similarity to the query">{tile.score:.3f}</span>']
    if name:
        lines.append(f'<span class="hit-class">{name}</span>')
    if words:
        lines.append(f'<span class="hit-mark {kind}">{words}</span>')
    classes = f"result-tile {kind}" if kind else "result-tile"
    style = ""
    if tile.below_cutoff:
        lines.append(f'<span class="hit-mark {BELOW_CUTOFF[0]}" style="{_BELOW_CUTOFF_MARK_STYLE}">'
                     f'{BELOW_CUTOFF[1]}</span>')
        classes += f" {BELOW_CUTOFF[0]}"
        style = f' style="{_BELOW_CUTOFF_STYLE}"'
    if tile.clickable:
        gallery, item = tile.clickable
        style += (f' data-gallery="{html.escape(gallery)}" data-item="{int(item)}" tabindex="0" role="button"'
                  ' title="Click: search with this image, its nearest neighbours"')
    return (f'<figure class="{classes}"{style}><img src="{data_uri(tile.image)}" alt="{html.escape(caption(tile))}">'
            f'<figcaption>{"".join(lines)}</figcaption></figure>')


def with_cutoff(tiles: list[Tile], cutoff: float | None) -> list[Tile]:
    """The tiles with those whose similarity is below `cutoff` marked (memvir.retrieval.diagnosis.verification.matches:
    a hit at the cut-off itself is kept, as the FMR counts it); unchanged when there is no cut-off."""
    if cutoff is None or not tiles:
        return tiles

    kept = matches([tile.score for tile in tiles], cutoff)
    return [replace(tile, below_cutoff=not bool(keep)) for tile, keep in zip(tiles, kept, strict=True)]


def tiles_html(tiles: list[Tile]) -> str:
    """The tiles in a grid that wraps to the page's width (demo/static/page.css); '' without any."""
    if not tiles:
        return ""
    return f'<div class="result-tiles">{"".join(tile_html(tile) for tile in tiles)}</div>'
