"""Verification figures of a labelled gallery: how the cosine similarities of same-class and other-class pairs are
spread, the similarity threshold that keeps the false match rate at a chosen value, and the false non-match rate
there.

Every pair of distinct gallery items counts once (i < j). At a threshold t a pair matches when its cosine is >= t:
FMR(t) is the fraction of other-class pairs that match, FNMR(t) the fraction of same-class pairs that do not
(docs/method.md, "Evaluation", takes cosine similarity as the model's score). The threshold at a chosen FMR f is the
lowest t with FMR(t) <= f; as FMR only drops just above a pair's cosine, that t is the float32 number just above the
cosine of the other-class pair at that place, and pairs tied there all stay below it.

The gallery's N(N-1)/2 cosines are too many to keep (75 million for a test split of 12,000 images), so one pass over
them counts each kind's in fine histogram bins and keeps every same-class cosine; a second keeps the other-class
cosines above the bin where the rate `max_fmr` falls. The thresholds up to that rate, and the FMR at any threshold
above it, are then exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from memvir.retrieval.knn import l2_normalized

# Histogram bins over [-1, 1]: a power of two, so that every edge is exact in float32 and the coarser histograms a
# page draws nest inside the fine one.
FINE_BINS = 2048
# Rows of the similarity matrix computed at once: [rows, N] float64 while binned.
_BLOCK_ELEMENTS = 2**23


@dataclass(frozen=True)
class OperatingPoint:
    """One threshold and what it gives: `fmr` (None where it lies below the rates kept, see PairSimilarities) and
    `fnmr`, with the pair counts behind them."""

    threshold: float
    fmr: float | None
    fnmr: float
    false_matches: int | None
    false_non_matches: int


@dataclass(frozen=True)
class PairSimilarities:
    """The cosine similarities of a gallery's pairs (i < j), by whether the two items share a class.

    same_pairs / other_pairs: how many pairs of each kind. fine_same / fine_other: [FINE_BINS] counts of each kind
    in equal bins over [-1, 1] (each bin holds its lower edge; the last holds 1 too; a cosine past either end by
    rounding goes in the end bin). same_scores: every same-class cosine, float32, ascending. other_top: the
    other-class cosines >= top_floor, float32, ascending. max_fmr: the highest FMR whose threshold is kept.
    """

    same_pairs: int
    other_pairs: int
    fine_same: np.ndarray
    fine_other: np.ndarray
    same_scores: np.ndarray
    other_top: np.ndarray
    top_floor: float
    max_fmr: float

    def histogram(self, bins: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(edges [bins + 1], same-class counts [bins], other-class counts [bins]) over [-1, 1]; `bins` must divide
        FINE_BINS (a power of two up to it)."""
        if isinstance(bins, bool) or not isinstance(bins, int | np.integer) or bins < 1 or FINE_BINS % bins:
            raise ValueError(f"bins must be a power of two from 1 to {FINE_BINS}; got {bins!r}")
        width = FINE_BINS // bins
        edges = np.linspace(-1.0, 1.0, bins + 1)
        return (edges, self.fine_same.reshape(bins, width).sum(axis=1),
                self.fine_other.reshape(bins, width).sum(axis=1))

    def threshold_at_fmr(self, fmr: float) -> OperatingPoint:
        """The lowest threshold whose FMR is at most `fmr` (0 < fmr <= max_fmr), and the FNMR there."""
        fmr = float(fmr)
        if not 0.0 < fmr <= self.max_fmr:
            raise ValueError(f"the false match rate must be above 0 and at most {self.max_fmr:g} (the highest "
                             f"this gallery's figures keep); got {fmr:g}")
        allowed = _largest_count_within(fmr, self.other_pairs)
        # The other-class cosine at place allowed + 1 from the top: every pair above it may match, it may not.
        place = self.other_top.size - allowed - 1
        threshold = float(np.nextafter(self.other_top[place], np.float32(np.inf)))
        return self.at_threshold(threshold)

    def at_threshold(self, threshold: float) -> OperatingPoint:
        """FMR and FNMR at `threshold` (a pair matches when its cosine is >= it); the FMR is None below top_floor,
        where the other-class cosines are only counted by bin."""
        if np.isnan(float(threshold)):
            raise ValueError("the threshold must be a number (a cosine similarity from -1 to 1)")
        # Cosines are float32: the threshold is taken as one, as `matches` compares a hit's score with it.
        threshold = float(np.float32(threshold))
        non_matches = int(np.searchsorted(self.same_scores, threshold, side="left"))
        fnmr = non_matches / self.same_pairs
        if threshold < self.top_floor:
            return OperatingPoint(threshold, None, fnmr, None, non_matches)
        matches = int(self.other_top.size - np.searchsorted(self.other_top, threshold, side="left"))
        return OperatingPoint(threshold, matches / self.other_pairs, fnmr, matches, non_matches)


def matches(scores, threshold: float) -> np.ndarray:
    """Which scores reach the threshold (>=): the hits a cut-off keeps, as FMR and FNMR count them."""
    return np.asarray(scores, dtype=np.float32) >= np.float32(threshold)


def pair_similarities(embeddings, labels, max_fmr: float = 0.1) -> PairSimilarities:
    """The cosines of every pair of distinct items of a labelled gallery, by class sameness (see PairSimilarities).

    embeddings: [N, D] tensor or array (normalised here); labels: [N] any values that compare equal within a class.
    max_fmr: the highest FMR whose threshold is wanted (0 < max_fmr < 1); the lower, the fewer cosines kept.
    Raises ValueError for bad shapes or NaN rows (as the metrics do), and for a gallery without a pair of each kind.
    """
    max_fmr = float(max_fmr)
    if not 0.0 < max_fmr < 1.0:
        raise ValueError(f"max_fmr must be above 0 and below 1; got {max_fmr:g}")
    vectors = l2_normalized(embeddings, "embeddings")
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    size = vectors.shape[0]
    if array.ndim != 1 or array.shape[0] != size:
        raise ValueError(f"labels must be 1-D with one label per row ({size}); got shape {array.shape}")
    _, codes = np.unique(array, return_inverse=True)
    # Ordered by class, each class's pairs lie in one square on the diagonal: a block of rows meets its same-class
    # items in a narrow band of columns, the only place where classes are compared.
    order = np.argsort(codes, kind="stable")
    codes = codes[order].astype(np.int64)
    vectors = vectors[torch.as_tensor(order, device=vectors.device)]
    class_sizes = np.bincount(codes)
    same_pairs = int((class_sizes * (class_sizes - 1) // 2).sum())
    other_pairs = size * (size - 1) // 2 - same_pairs
    if same_pairs == 0:
        raise ValueError(f"no two of the {size} items share a class, so there is no same-class pair; pass several "
                         "items per class")
    if other_pairs == 0:
        raise ValueError("every item is of one class, so there is no other-class pair; pass items of two classes "
                         "or more")
    class_ends = np.cumsum(class_sizes)

    # Pass 1: every pair's bin, the same-class ones' cosines.
    fine_all = torch.zeros(FINE_BINS + 1, dtype=torch.int64)
    fine_same = torch.zeros(FINE_BINS + 1, dtype=torch.int64)
    same_scores = []
    for start, stop, similarities in _upper_blocks(vectors):
        bins = _fine_bins(similarities)
        fine_all += torch.bincount(bins.reshape(-1), minlength=FINE_BINS + 1).cpu()
        low, high, same = _same_class_band(codes, class_ends, start, stop, vectors.device)
        band = similarities[:, low - start:high - start]
        same_scores.append(band[same].cpu().numpy())
        fine_same += torch.bincount(bins[:, low - start:high - start][same], minlength=FINE_BINS + 1).cpu()
    # The last place counts the pairs below the diagonal, which are no pairs of i < j.
    fine_same_counts = fine_same[:FINE_BINS].numpy()
    fine_other_counts = (fine_all - fine_same)[:FINE_BINS].numpy()
    same_scores = np.sort(np.concatenate(same_scores))

    # Pass 2: the other-class cosines in and above the fine bin where the count from the top passes the largest
    # number of false matches max_fmr allows, plus one (the cosine the threshold is set just above).
    kept = _largest_count_within(max_fmr, other_pairs) + 1
    from_top = np.cumsum(fine_other_counts[::-1])[::-1]
    floor_bin = int(np.flatnonzero(from_top >= kept).max())
    top_floor = float(np.linspace(-1.0, 1.0, FINE_BINS + 1)[floor_bin]) if floor_bin > 0 else -np.inf
    floor = torch.tensor(top_floor if floor_bin > 0 else -np.inf, dtype=vectors.dtype, device=vectors.device)
    other_top = []
    for start, stop, similarities in _upper_blocks(vectors):
        above = similarities >= floor
        # Below the diagonal (and on it) the block repeats pairs or holds an item with itself; the band holds the
        # same-class pairs: all left out.
        square = above[:, : above.shape[0]]
        square &= _upper_mask(square)
        low, high, same = _same_class_band(codes, class_ends, start, stop, vectors.device)
        above[:, low - start:high - start] &= ~same
        other_top.append(similarities[above].cpu().numpy())
    other_top = np.sort(np.concatenate(other_top))
    return PairSimilarities(same_pairs=same_pairs, other_pairs=other_pairs, fine_same=fine_same_counts,
                            fine_other=fine_other_counts, same_scores=same_scores, other_top=other_top,
                            top_floor=top_floor, max_fmr=max_fmr)


def _largest_count_within(rate: float, total: int) -> int:
    """The largest count c with c / total <= rate, as a float division says (so a reference that checks the rate
    itself agrees at every boundary)."""
    count = min(total, int(np.floor(rate * total)))
    while count < total and (count + 1) / total <= rate:
        count += 1
    while count > 0 and count / total > rate:
        count -= 1
    return count


def _upper_blocks(vectors):
    """(start, stop, similarities [stop - start, N - start]) for blocks of rows: each row's cosines with itself and
    every later item (earlier ones are in an earlier block's rows)."""
    size = vectors.shape[0]
    rows = max(1, _BLOCK_ELEMENTS // max(1, size))
    for start in range(0, size, rows):
        stop = min(size, start + rows)
        yield start, stop, vectors[start:stop] @ vectors[start:].T


def _upper_mask(similarities):
    """True where a block's column is a later item than its row (the pair i < j)."""
    rows = torch.arange(similarities.shape[0], device=similarities.device)[:, None]
    columns = torch.arange(similarities.shape[1], device=similarities.device)[None, :]
    return columns > rows


def _fine_bins(similarities):
    """Each cosine's fine bin, FINE_BINS where the pair is not one of i < j (the block's square on the diagonal).

    floor(s * FINE_BINS / 2) is exact in float32 (a power of two scales without rounding), so each cosine lands in
    the bin its value says, edges included; cosines past +-1 by rounding go in the end bins."""
    half = FINE_BINS // 2
    bins = (similarities * half).floor_().to(torch.int32).add_(half).clamp_(0, FINE_BINS - 1)
    square = bins[:, : bins.shape[0]]
    square[~_upper_mask(square)] = FINE_BINS
    return bins


def _same_class_band(codes, class_ends, start, stop, device):
    """(first column, end column, same-class mask [rows, end - first]) of the columns where rows start..stop-1 meet
    their own class (gallery ordered by class), pairs i < j only."""
    low = start  # a pair's later item is never before the block's first row
    high = int(class_ends[codes[stop - 1]])
    rows = np.arange(start, stop)[:, None]
    columns = np.arange(low, high)[None, :]
    same = (codes[rows] == codes[columns]) & (columns > rows)
    return low, high, torch.as_tensor(same, device=device)
