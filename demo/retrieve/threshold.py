"""Threshold view: how a checkpoint's cosine similarities of same-class and other-class pairs of its gallery are
spread, the threshold that keeps the false match rate (FMR) at a chosen value and the false non-match rate (FNMR)
there, and a similarity cut-off that the result tiles honour (demo.retrieve.tiles.with_cutoff).

The figures are memvir.retrieval.diagnosis.verification's over RetrievalService.pair_similarities (once per gallery
index); this module words them and draws the histogram.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal

import plotly.graph_objects as go

# What the FMR radio offers: (label, FMR); each at most demo.retrieve.service.MAX_FMR.
FMRS = [("1 in 1,000", 0.001), ("1 in 100", 0.01), ("1 in 10", 0.1)]
DEFAULT_FMR = 0.01
BINS = 64
SAME_COLOUR, OTHER_COLOUR = "#2b8a3e", "#c92a2a"  # the tiles' marks' colours (demo/static/page.css)


def chosen_fmr(value) -> float:
    """The FMR the radio sent, as a float; ValueError for anything it does not offer (an API client's value)."""
    offered = {fmr for _, fmr in FMRS}
    try:
        fmr = float(value)
    except (TypeError, ValueError):
        fmr = math.nan
    if fmr not in offered:
        raise ValueError(f"choose a false match rate of {', '.join(f'{fmr:g}' for _, fmr in FMRS)}; got {value!r}")
    return fmr


def parse_cutoff(value) -> float | None:
    """The cut-off box's value: None when empty, else a cosine in [-1, 1]; ValueError that says so otherwise."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        cutoff = float(value)
    except (TypeError, ValueError):
        cutoff = math.nan
    if not -1.0 <= cutoff <= 1.0:
        raise ValueError(f"the similarity cut-off must be a cosine from -1 to 1, or empty for none; got {value!r}")
    return cutoff


CUTOFF_DECIMALS = 4


def cutoff_for(threshold: float) -> str:
    """The threshold as the cut-off box shows it: rounded up to CUTOFF_DECIMALS decimals (a float's every digit read
    as noise), up so that the cut-off's FMR stays at most the threshold's. Decimal rounds the float's exact value,
    which multiplying by 10**4 and taking the ceiling can push one step too far."""
    return str(Decimal(repr(float(threshold))).quantize(Decimal(1).scaleb(-CUTOFF_DECIMALS), rounding=ROUND_CEILING))


def _rate(count: int, total: int, rate: float) -> str:
    return f"{rate:.4f} ({count:,} of {total:,} pairs)"


def point_line(pairs, point) -> str:
    """'FMR 0.0100 (749,819 of 74,982,240 pairs) · FNMR 0.0082 (552 of 67,386 pairs)'; an FMR above the kept
    rates is said as such."""
    if point.fmr is None:
        fmr = f"above {pairs.max_fmr:g} (more false matches than this view counts one by one)"
    else:
        fmr = _rate(point.false_matches, pairs.other_pairs, point.fmr)
    return f"FMR {fmr} · FNMR {_rate(point.false_non_matches, pairs.same_pairs, point.fnmr)}"


def summary(checkpoint_name: str, gallery, pairs, points: dict, fmr: float, cutoff_point) -> str:
    """The view's words: the FNMR at the chosen FMR first, then every offered FMR's threshold, then the cut-off's
    figures when one is set."""
    chosen = points[fmr]
    lines = [f"**FNMR at FMR {fmr:g}: {chosen.fnmr:.4f}** for `{checkpoint_name}` on {gallery.description}: "
             f"{chosen.false_non_matches:,} of its {pairs.same_pairs:,} same-class pairs fall below the threshold, "
             f"cosine {chosen.threshold:.4f}, which {chosen.false_matches:,} of its {pairs.other_pairs:,} "
             f"other-class pairs reach (FMR {chosen.fmr:.4f}). Every pair of two images counts once; a pair matches "
             "when its cosine is at or above the threshold.",
             "", "| FMR at most | threshold | FNMR |", "|---|---|---|"]
    for value, point in points.items():
        lines.append(f"| {value:g} | {point.threshold:.4f} | {point.fnmr:.4f} |")
    if cutoff_point is not None:
        lines += ["", f"**At the cut-off {cutoff_point.threshold:.4f}**: {point_line(pairs, cutoff_point)}. The "
                      "Search view's tiles below it are dimmed and marked \u201cbelow the cut-off\u201d, at their "
                      "ranks."]
    return "\n".join(lines)


def figure(pairs, threshold: float, fmr: float, cutoff: float | None) -> go.Figure:
    """Each kind's share of its pairs per bin of cosine (a log scale: the other-class pairs at high cosines are the
    few that decide the FMR), the threshold at the chosen FMR and the cut-off as lines."""
    edges, same, other = pairs.histogram(BINS)
    centres = (edges[:-1] + edges[1:]) / 2
    width = edges[1] - edges[0]
    traces = []
    for name, counts, total, colour in (("same class", same, pairs.same_pairs, SAME_COLOUR),
                                        ("other class", other, pairs.other_pairs, OTHER_COLOUR)):
        share = [count / total if count else None for count in counts]  # None: no bar (a log axis has no 0)
        traces.append(go.Bar(x=centres, y=share, width=width, name=f"{name} ({total:,} pairs)",
                             marker_color=colour, opacity=0.6,
                             customdata=counts, hovertemplate="cosine %{x:.3f}: %{customdata:,} pairs<extra></extra>"))
    fig = go.Figure(traces)
    fig.add_vline(x=threshold, line_dash="dash", line_color="#212529",
                  annotation_text=f"threshold at FMR {fmr:g}", annotation_position="top left")
    if cutoff is not None:
        fig.add_vline(x=cutoff, line_dash="dot", line_color="#495057", annotation_text="cut-off",
                      annotation_position="bottom right")
    fig.update_layout(barmode="overlay", height=340, margin={"l": 48, "r": 12, "t": 24, "b": 40},
                      xaxis_title="cosine similarity of a pair", yaxis_title="share of its kind's pairs",
                      yaxis_type="log", legend={"orientation": "h", "y": -0.25}, bargap=0)
    return fig
