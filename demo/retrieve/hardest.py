"""Where it fails: a checkpoint's hardest queries among its gallery's own items, or, for two checkpoints, the queries
where they differ most, both ways. Each row is the query, its top k marked right or wrong, and the nearest images of
its class it missed (greyed, at their ranks).

The rankings are RetrievalService.rankings' (memvir.retrieval.diagnosis.ranking, once per gallery index), the choice of
rows memvir.retrieval.diagnosis.failures'; this module only lays them out.
"""

from __future__ import annotations

import html

from demo.retrieve.galleries import Gallery, thumbnail
from demo.retrieve.tiles import Tile, data_uri, tile_html, with_cutoff

ROWS = 8
# What the order radio offers: (label, memvir.retrieval.diagnosis.failures order).
ORDERS = [("lowest AP@R", "map@r"), ("latest first correct", "first_correct_rank")]


def _query_html(gallery: Gallery, row: dict, figures: str) -> str:
    item = row["query"]
    name = gallery.class_of(item) or ""
    image = thumbnail(gallery.image(item), gallery.glyphs)
    return (f'<figure class="result-tile hard-query" data-item="{item}">'
            f'<img src="{data_uri(image)}" alt="query: item {item} {html.escape(name)}"><figcaption>'
            f'<span class="hit-rank">query</span> item {item}'
            f'<span class="hit-class">{html.escape(name)}</span>'
            f'<span class="hard-figures">{html.escape(figures)}</span></figcaption></figure>')


def ranked_tiles(gallery: Gallery, row: dict, cutoff: float | None = None) -> tuple[list[Tile], list[Tile]]:
    """(the top k marked, the missed same-class items greyed) of one ranked query; those below `cutoff` (a cosine,
    or None) dimmed, as the search's are."""
    shown = [Tile(thumbnail(gallery.image(item), gallery.glyphs), rank, score, gallery.class_of(item), correct)
             for rank, (item, score, correct) in enumerate(zip(row["neighbours"], row["scores"], row["correct"],
                                                               strict=True), 1)]
    missed = [Tile(thumbnail(gallery.image(item), gallery.glyphs), rank, score, gallery.class_of(item), True,
                   missed=True)
              for item, score, rank in zip(row["missed"], row["missed_scores"], row["missed_ranks"], strict=True)]
    return with_cutoff(shown, cutoff), with_cutoff(missed, cutoff)


def _tiles_line(label: str | None, gallery: Gallery, row: dict, cutoff: float | None) -> str:
    shown, missed = ranked_tiles(gallery, row, cutoff)
    head = f'<span class="hard-label">{html.escape(label)}</span>' if label else ""
    return (f'<div class="hard-line">{head}<div class="hard-tiles">{"".join(tile_html(t) for t in shown)}</div>'
            f'<div class="hard-tiles hard-missed">{"".join(tile_html(t) for t in missed)}</div></div>')


def figures(row: dict) -> str:
    return f"AP@R {row['average_precision']:.3f} · first correct #{row['first_correct_rank']}"


def hardest_html(gallery: Gallery, rankings, positions, cutoff: float | None = None) -> str:
    """One row per query position of `rankings`: the query with its AP@R and first correct rank, its ranking."""
    rows = []
    for position in positions:
        row = rankings.row(int(position))
        rows.append(f'<div class="hard-row">{_query_html(gallery, row, figures(row))}'
                    f'{_tiles_line(None, gallery, row, cutoff)}</div>')
    return f'<div class="hard-rows">{"".join(rows)}</div>'


def differences_html(gallery: Gallery, names: tuple[str, str], rankings: tuple, better: tuple,
                     cutoff: float | None = None) -> str:
    """Two sections, where the first checkpoint does better and where the second does: each row the query, both
    AP@R values, and both rankings."""
    sections = []
    for title, positions in ((f"{names[0]} finds more than {names[1]}", better[0]),
                             (f"{names[1]} finds more than {names[0]}", better[1])):
        rows = []
        for position in positions:
            first, second = rankings[0].row(int(position)), rankings[1].row(int(position))
            both = (f"{names[0]}: AP@R {first['average_precision']:.3f} · {names[1]}: AP@R "
                    f"{second['average_precision']:.3f}")
            rows.append(f'<div class="hard-row">{_query_html(gallery, first, both)}'
                        f'<div class="hard-lines">{_tiles_line(names[0], gallery, first, cutoff)}'
                        f'{_tiles_line(names[1], gallery, second, cutoff)}</div></div>')
        body = "".join(rows) or '<p class="small-note">no query: it never does better.</p>'
        sections.append(f'<section class="hard-section"><h4>{html.escape(title)}</h4>{body}</section>')
    return f'<div class="hard-rows">{"".join(sections)}</div>'
