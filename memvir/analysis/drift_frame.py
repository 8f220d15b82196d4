"""A class's stored weights in a frame of their own around its live weight: how far each virtual class has drifted,
as a length a picture can show.

A virtual class's weight is the class's weight of j(M+1) steps ago (docs/method.md, "Algorithm"), a few degrees from
the live one. Any projection of the whole few-class view to 2-D shortens that difference to almost nothing: it keeps
the two directions in which the classes' images differ most, and the drift of a weight lies mostly in others. So the
stored weights are placed in their class's own frame instead, the azimuthal equidistant projection centred on the live
weight: each stored weight's distance from the centre is its true angle to the live weight, and its direction from the
centre is its direction on the sphere within the plane that holds the class's stored weights best (exactly, for up to
two of them). Only distances from the centre are true; a picture draws the frame at a scale it states.

Numpy only, like the rest of the few-class view's geometry (memvir.analysis.projection).
"""

from __future__ import annotations

import numpy as np

_TINY = 1e-12


def angles_degrees(rows: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """The angle in degrees between each unit row [n, D] and its centre [n, D] (unit rows too), on the sphere."""
    # from the chord, not arccos of the cosine: exact near 0, where the stored weights are (arccos(1 - e) ~ sqrt(2e))
    chords = np.linalg.norm(rows - centres, axis=1)
    return np.degrees(2 * np.arcsin(np.minimum(chords / 2, 1.0)))


def drift_offsets(live: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """[k, 2] positions in degrees of a class's stored weights ([k, D] unit rows) around its live weight ([D], unit):
    the length of each is the stored weight's angle to the live weight; the directions are those on the sphere,
    within the plane through the live weight that holds the stored weights' directions best."""
    if len(stored) == 0:
        return np.zeros((0, 2))
    angles = angles_degrees(stored, np.broadcast_to(live, stored.shape))
    tangents = stored - (stored @ live)[:, None] * live  # each stored weight's direction away from the live one
    lengths = np.linalg.norm(tangents, axis=1)
    directions = np.divide(tangents, lengths[:, None], out=np.zeros_like(tangents), where=lengths[:, None] > _TINY)
    # The plane: the two leading right singular vectors of the directions weighted by their angles, through the live
    # weight (uncentred), so the stored weights that drifted furthest decide it.
    _, _, right = np.linalg.svd(directions * angles[:, None], full_matrices=False)
    basis = right[:2]
    if len(basis) < 2:  # one stored weight: a second axis is not needed, every coordinate on it is 0
        basis = np.vstack([basis, np.zeros_like(basis)])
    in_plane = directions @ basis.T
    norms = np.linalg.norm(in_plane, axis=1)
    # A direction outside the plane (three or more weights) keeps its in-plane bearing at its full length: the
    # distance from the centre stays the true angle. One with no bearing at all (a weight equal to the live one, or
    # orthogonal to the plane) lies along the first axis.
    bearings = np.where(norms[:, None] > _TINY, in_plane / np.maximum(norms, _TINY)[:, None], [1.0, 0.0])
    return bearings * angles[:, None]
