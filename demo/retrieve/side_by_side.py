"""Side by side: one query searched by two checkpoints, their top k next to each other, each hit marked right or
wrong; with the query's class known, each checkpoint's AP@R and first correct rank for that query and the nearest
same-class images it missed (greyed).

The figures are memvir.retrieval.diagnosis.ranking's (RetrievalService.query_ranking); this module only lays them out.
Each checkpoint searches its own index of the gallery chosen (its test split, or the uploaded images embedded by it).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from PIL import Image

from demo.retrieve.galleries import Gallery, thumbnail
from demo.retrieve.hardest import ranked_tiles
from demo.retrieve.service import LoadedCheckpoint, RetrievalError, RetrievalService
from demo.retrieve.tiles import Tile, tile_html, with_cutoff


@dataclass(frozen=True)
class Column:
    """One checkpoint's answer to the query: its tiles, and its figures when the query's class is known."""

    name: str
    query: Image.Image  # as this checkpoint's model saw it
    tiles: list[Tile]
    missed: list[Tile]
    average_precision: float | None = None
    first_correct_rank: int | None = None
    same_class: int | None = None


def answer(retrieval: RetrievalService, checkpoint: LoadedCheckpoint, gallery: Gallery, query, k: int,
           query_class: str | None, drawn: bool = False, exclude: int | None = None,
           cutoff: float | None = None) -> Column:
    """The checkpoint's column: its top k marked (and, with `query_class`, its AP@R, first correct rank and the
    nearest same-class items it missed); hits below `cutoff` (a cosine, or None) dimmed."""
    if query_class is None:
        found = retrieval.search(checkpoint, gallery, query, k, drawn=drawn, exclude=exclude)
        tiles = [Tile(thumbnail(gallery.image(hit.index), gallery.glyphs), rank, hit.score, hit.class_name, None)
                 for rank, hit in enumerate(found.hits, 1)]
        return Column(checkpoint.name, found.query, with_cutoff(tiles, cutoff), [])
    ranking, seen = retrieval.query_ranking(checkpoint, gallery, query, k, query_class, drawn=drawn, exclude=exclude)
    row = ranking.row(0)
    tiles, missed = ranked_tiles(gallery, row)
    return Column(checkpoint.name, seen, with_cutoff(tiles, cutoff), missed, row["average_precision"],
                  row["first_correct_rank"], row["same_class"])


def figures_text(column: Column) -> str:
    """'AP@R 0.812 · first correct #1 · 11 of its class in the gallery', or '' without the query's class."""
    if column.average_precision is None:
        return ""
    if not column.same_class:
        return "no image of the query's class in this gallery"
    return (f"AP@R {column.average_precision:.3f} · first correct #{column.first_correct_rank} · "
            f"{column.same_class} of its class in the gallery")


def column_html(column: Column) -> str:
    figures = figures_text(column)
    parts = [f'<section class="side-column"><h4 class="side-name">{html.escape(column.name)}</h4>']
    if figures:
        parts.append(f'<p class="side-figures">{html.escape(figures)}</p>')
    parts.append(f'<div class="result-tiles">{"".join(tile_html(tile) for tile in column.tiles)}</div>')
    if column.missed:
        parts.append('<p class="side-missed">Nearest of its class it missed:</p>'
                     f'<div class="result-tiles">{"".join(tile_html(tile) for tile in column.missed)}</div>')
    parts.append("</section>")
    return "".join(parts)


def side_by_side_html(first: Column, second: Column) -> str:
    """The two columns next to each other (one above the other on a narrow screen: demo/static/page.css)."""
    return f'<div class="side-by-side">{column_html(first)}{column_html(second)}</div>'


def load_second(retrieval: RetrievalService, first: LoadedCheckpoint, choice) -> LoadedCheckpoint:
    """The checkpoint to compare with; RetrievalError when none is chosen or it is the first one again."""
    if not (choice or "").strip():
        raise RetrievalError("choose a second checkpoint to compare with")
    second = retrieval.load_checkpoint(choice)
    if second.key == first.key:
        raise RetrievalError("the two checkpoints are the same: choose another one to compare with")
    return second
